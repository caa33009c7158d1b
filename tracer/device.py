"""Facts about the device a run used, and timing of untraced steps.

Timing a CUDA op needs `torch.cuda.synchronize()` on both sides: kernels are
queued asynchronously, so a bare wall clock measures the launch, not the work.
"""

import os
import platform
import statistics
import sys
import time

import torch

from tracer.errors import TraceError


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
    info = {"name": platform.processor() or platform.machine(), "cores": os.cpu_count(), "threads": torch.get_num_threads()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return info
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
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


def time_step(fn, *, warmup=2, repeats=5, device=None):
    """Median wall time of `fn()` in seconds, untraced, after `warmup` calls.

    On CUDA the device is synchronised before and after each call, so the time
    covers the work, not only its launch: `device` when given, else every CUDA
    device once the process uses CUDA (checked after the warm-up calls, which may
    be what starts it). Returns a dict with `median_s`, `times_s`, `warmup`,
    `repeats`, `device` (JSON-ready, for the trace metadata)."""
    if not callable(fn):
        raise TraceError(f"time_step: fn must be callable, got {type(fn).__name__}")
    for name, value, least in (("warmup", warmup, 0), ("repeats", repeats, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise TraceError(f"time_step: {name} must be an int >= {least}, got {value!r}")
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None or _tracing_active():
        raise TraceError("time_step: call it outside the Tracer (and outside FakeTensorMode): traced time is not step time")
    device = torch.device(device) if device is not None else None
    for _ in range(warmup):
        fn()
    if device is not None:
        sync = cuda_sync_for(device.type)
    elif cuda_in_use():
        device, sync = torch.device("cuda", torch.cuda.current_device()), sync_all_cuda
    else:
        device, sync = torch.device("cpu"), None
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return {
        "median_s": statistics.median(times),
        "times_s": times,
        "warmup": warmup,
        "repeats": repeats,
        "device": device_info(device),
    }


def _tracing_active():
    from tracer import mode

    return mode.Tracer._active is not None


def time_matmul(a, b, *, trials=5):
    """Seconds for one `a @ b`: the mean of `trials` runs after one warm-up, synchronised on CUDA."""
    sync = cuda_sync_for(a.device.type)
    a @ b
    if sync:
        sync()
    start = time.perf_counter()
    for _ in range(trials):
        a @ b
    if sync:
        sync()
    return (time.perf_counter() - start) / trials


def matmul_ceiling(device="cpu", dtype=torch.float32, n=2048, trials=5):
    """The achievable matmul FLOP/s of a device: an n x n @ n x n matmul, timed.

    Returns a JSON-ready dict {dtype, n, seconds, flops_per_s} for `Tracer.set_ceiling`."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise TraceError(f"matmul_ceiling: n must be a positive int, got {n!r}")
    if not isinstance(dtype, torch.dtype):
        raise TraceError(f"matmul_ceiling: dtype must be a torch.dtype, got {dtype!r}")
    device = torch.device(device)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    seconds = time_matmul(a, b, trials=trials)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "n": n,
        "seconds": seconds,
        "flops_per_s": 2 * n**3 / seconds,  # 2 * n * n * n FLOPs per n x n @ n x n
        "device": device_info(device),
    }
