"""tracer.device: the facts of the device a run used, as the run metadata carries them."""

import builtins
import os

import pytest
import torch

from tracer.device import _cpu_facts, device_info

CPU = torch.device("cpu")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="no /proc/cpuinfo to read")
def test_the_cpu_facts_are_read_once_per_process_and_the_threads_at_each_trace(monkeypatch):
    """tracer.device._cpu_facts: the CPU's name, cores, clock and instruction sets are read once (each read of
    /proc/cpuinfo cost about 0.2 ms a trace at entry); the torch threads, which the program may change, each time."""
    _cpu_facts.cache_clear()
    opened, real_open = [], builtins.open

    def counting(file, *args, **kwargs):
        opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = device_info(CPU)
        torch.set_num_threads(2)
        second = device_info(CPU)
    finally:
        torch.set_num_threads(threads)
    assert opened.count("/proc/cpuinfo") == 1  # two traces' device facts, one read (the code before: 2)
    assert (first["threads"], second["threads"]) == (1, 2)
    assert list(first)[:4] == ["type", "name", "cores", "threads"]  # the keys in their order as before
    assert {**first, "threads": 2} == second
    if "isa" in second:  # each trace's metadata has its own list: the cached one is never handed out
        second["isa"].append("changed")
        assert "changed" not in device_info(CPU)["isa"]
