"""benchmarks/gpu_check.py: one line and exit 0 without a CUDA device; its table, tolerance and guards; its checks
run on the CPU at tiny sizes with torch.cuda's events, synchronise and device queries stood in for, so that the
script's FLOP arithmetic, column names and metadata keys are right before it first runs on a GPU."""

import functools
import importlib.util
import os
import subprocess
import sys
import time

import pytest
import torch

from tests import helpers

ROOT = helpers.ROOT
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_cuda_device_it_says_so_in_one_line_and_exits_0():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    build = "" if torch.version.cuda else f"; torch {torch.__version__} is a CPU build"  # this machine's: CPU
    assert (done.returncode, done.stdout) == (
        0,
        f"gpu-check: no CUDA device (torch.cuda.is_available() is False{build}); nothing to check\n",
    )


def test_within_takes_the_larger_of_the_relative_and_the_absolute_tolerance(gpu_check):
    assert gpu_check.within(1.09, 1.0, 0.10)  # 0.09 <= 0.1 * 1.0
    assert not gpu_check.within(1.11, 1.0, 0.10)  # 0.11 > 0.1
    assert gpu_check.within(0.14, 0.1, 0.10, 0.05)  # 0.04 <= max(0.01, 0.05)
    assert not gpu_check.within(0.16, 0.1, 0.10, 0.05)  # 0.06 > 0.05
    assert gpu_check.within(-2.1, -2.0, 0.10)  # |expected| sets the relative tolerance


def test_a_check_that_raises_fails_its_row_and_the_table_goes_on(gpu_check):
    table = gpu_check.Table()

    def broken(table, arg):
        table.add("first row", 1, arg, arg == 1)
        raise ValueError("no such\nthing")

    table.guarded("broken", broken, 1)
    table.guarded("skipped", lambda t: t.add("NCCL", "2 GPUs", "skipped: 1", None))
    assert table.rows[1] == ("broken", "runs", "ValueError: no such thing", False)  # the exception, on one line
    assert table.failed()
    table.rows.pop(1)
    assert not table.failed()  # the row added before the exception passed; a skipped row is no failure
    table.guarded("late", lambda t: t.add("late", 0, 0, True), deadline=time.monotonic() - 1)
    assert table.rows[-1] == ("late", "runs", f"not run: the {gpu_check.BUDGET_S} s budget was spent", False)
    assert table.failed()
    assert table.render() == "\n".join(
        [
            "check     | expected | measured                            | ok",
            "----------+----------+-------------------------------------+-----",
            "first row | 1        | 1                                   | ok",
            "NCCL      | 2 GPUs   | skipped: 1                          | skip",
            "late      | runs     | not run: the 200 s budget was spent | FAIL",
        ]
    )


class _Event:
    """torch.cuda.Event on the CPU: record() reads perf_counter_ns."""

    def __init__(self, enable_timing=False):
        self.t = 0

    def record(self, stream=None):
        self.t = time.perf_counter_ns()

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e6


def test_the_checks_run_on_the_cpu_with_their_arithmetic_right(gpu_check, tmp_path, monkeypatch):
    """Timing rows are not asserted (the CPU's clock, a loaded machine): FLOPs, bytes, keys and the skip row are.
    torch.cuda's memory figures are stood in for: 1000 bytes before the block, its peak two 64 x 64 fp32 tensors
    (16384 bytes each) above that."""
    import tracer.recording.parts
    import tracer.recording.start

    before, peak = 1000, 1000 + 2 * 16384
    for name, value in (
        ("Event", _Event),
        ("synchronize", lambda device=None: None),
        ("device_count", lambda: 1),
        ("get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3"),
        ("reset_peak_memory_stats", lambda device=None: None),
        ("memory_allocated", lambda device=None: before),
        ("max_memory_allocated", lambda device=None: peak),
    ):
        monkeypatch.setattr(torch.cuda, name, value)
    figures = {"allocated_bytes": before, "reserved_bytes": 0, "max_allocated_bytes": peak}
    for module in (tracer.recording.start, tracer.recording.parts):  # the memory at the first device, at close
        monkeypatch.setattr(module, "cuda_memory", lambda device: dict(figures))
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    for name, value in (
        ("N", 32),
        ("REPEATS", 4),
        ("BATCH", 8),
        ("WIDTH", 16),
        ("LAYERS", 2),
        ("STEPS", 6),
        ("MEMORY_N", 64),
    ):
        monkeypatch.setattr(gpu_check, name, value)
    # the metered step: (3 * 2 - 1) * 2 * 8 * 16 * 16 + 8 * 16 = 20480 + 128 = 20608
    assert gpu_check.mlp_flops() == 20608
    table = gpu_check.Table()
    try:
        for name, check in gpu_check.CHECKS:
            table.guarded(name, check, tmp_path, torch.device("cpu"))
    finally:
        torch._dynamo.reset()
    rows = {check: (expected, measured, ok) for check, expected, measured, ok in table.rows}
    assert not {name for name, _ in gpu_check.CHECKS} & set(rows), table.render()  # no check raised
    assert rows["mm FLOPs (each row)"] == ("65536", "[65536]", True)  # 2 * 32**3
    # the CPU's wall clock, where a GPU gets CUDA events
    timer = rows['Tracer(timing="events"): timer, unresolved rows, collector']
    assert timer[0] == "events, 0, compiled" and timer[1].startswith("wall, 0, ") and timer[2] is False
    assert rows["cuda_memory start allocated_bytes"] == ("1000 (torch.cuda)", "1000", True)
    assert rows["cuda_memory end max_allocated_bytes"] == ("33768 (torch.cuda)", "33768", True)
    # a, b and c at once: 3 * 16384 = 49152 = 33768 - 1000 + 16384
    assert rows["trace peak live_bytes"] == ("49152 (torch's peak - before + a, 1%)", "49152", True)
    assert rows["Meter model_flops per step"] == ("20608", "[20608]", True)
    assert rows["torch.compile traced: FLOPs"] == ("20608 (the eager trace's)", "20608", True)
    assert rows["torch.compile traced: compiled_ran_eagerly"] == ("True", "True", True)
    assert rows["torch.compile Meter model_flops"] == ("20608", "[20608]", True)
    assert rows["NCCL all_reduce, all_gather (2 ranks)"] == ("2 GPUs", "skipped: torch.cuda.device_count() = 1", None)
    assert len(table.rows) == 20


def test_main_prints_the_device_and_one_table_and_exits_1_on_a_failed_row(gpu_check, monkeypatch, capsys):
    for name, value in (
        ("is_available", lambda: True),
        ("current_device", lambda: 0),
        ("device_count", lambda: 1),
        ("get_device_name", lambda device=None: "NVIDIA H200"),
    ):
        monkeypatch.setattr(torch.cuda, name, value)
    seen = []

    def passing(table, tmp, device):
        seen.append((tmp.is_dir(), device))
        table.add("passing", 1, 1, True)

    def failing(table, tmp, device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu_check, "CHECKS", (("passing", passing), ("failing", failing)))
    assert gpu_check.main() == 1
    header, *table = capsys.readouterr().out.splitlines()
    assert seen == [(True, torch.device("cuda", 0))]
    assert header.startswith("gpu-check: NVIDIA H200 (GPUs: 1), torch ")
    assert [line.split(" | ")[0].strip() for line in table[::2]] == ["check", "passing"]
    assert table[1].startswith("--------+---") and table[3].startswith("failing ")
    assert table[-1].endswith("RuntimeError: CUDA error: an illegal memory access was encountered | FAIL")
    monkeypatch.setattr(gpu_check, "CHECKS", (("passing", passing),))
    assert gpu_check.main() == 0
