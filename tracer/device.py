"""Facts about the device a run used: its name and properties, CUDA's memory figures, how to synchronise it.

Timing untraced steps on it is tracer.measure."""

import functools
import os
import platform
import sys

import torch


def cuda_sync_for(device_type):
    """The synchronising function to call around timed work on this device type, or None."""
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.synchronize
    return None


def cuda_in_use():
    """Whether this process has initialised CUDA (so queued kernels may be running)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def sync_all_cuda():
    """Wait for the work queued on every CUDA device."""
    for index in range(torch.cuda.device_count()):
        torch.cuda.synchronize(index)


def _cpu_info():
    name, cores, *rest = _cpu_facts().items()  # the threads third, as ever: torch.set_num_threads may change them
    info = dict([name, cores, ("threads", torch.get_num_threads()), *rest])
    if "isa" in info:
        info["isa"] = list(info["isa"])  # the metadata's own list: the cached one is never handed out
    return info


@functools.cache
def _cpu_facts():
    """The CPU's name, cores, clock and instruction sets, read once per process (about 0.2 ms a trace at entry, after
    the program ran: the file is made by the kernel as it is read). They cannot change while it runs, but for the
    clock `cpu MHz`, which is the one read at the process's first trace (tracer.peaks uses it only where the kernel
    exposes no rated maximum, `max_mhz`)."""
    info = {"name": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    fields = {}
    try:  # the first value of each field read is the first CPU's: the file is read only until each is found (a
        with open("/proc/cpuinfo") as f:  # machine of 100 CPUs lists 100 blocks, made by the kernel as they are read)
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if "flags" in fields and "cpu MHz" in fields and "model name" in fields:
                    break
    except OSError:
        return info
    info["name"] = fields.get("model name", info["name"])
    if "cpu MHz" in fields:
        info["mhz"] = float(fields["cpu MHz"])
    flags = set(fields.get("flags", "").split())
    info["isa"] = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2", "fma", "avx", "sse2") if f in flags]
    try:  # the rated maximum, where the kernel exposes it
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            info["max_mhz"] = int(f.read()) / 1000
    except (OSError, ValueError):
        pass
    return info


def is_fake(tensor):
    """Whether ops run on fake tensors: FakeTensorMode is active, or `tensor` is a FakeTensor.

    Their device (often "cpu") did not run them, so a trace of them has no real time or peak."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return True
    fake = sys.modules.get("torch._subclasses.fake_tensor")  # never imported here: a run without it has none
    return fake is not None and isinstance(tensor, fake.FakeTensor)


def device_info(device):
    """A JSON-ready description of `device` (a torch.device)."""
    info = {"type": device.type, "name": str(device)}
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name,
            total_memory_bytes=props.total_memory,
            multi_processor_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
        )
    elif device.type == "cpu":
        info.update(_cpu_info())
    return info


def cuda_memory(device):
    """torch.cuda's own memory figures for `device`, to set beside the trace's live_bytes.

    None off CUDA. `max_allocated_bytes` is the peak since the process started or
    since the user last reset it: the tracer does not reset it (that would change
    the traced program's state)."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    return {
        "allocated_bytes": torch.cuda.memory_allocated(device),
        "reserved_bytes": torch.cuda.memory_reserved(device),
        "max_allocated_bytes": torch.cuda.max_memory_allocated(device),
    }
