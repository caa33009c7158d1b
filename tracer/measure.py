"""Timing of untraced steps, for MFU: `time_step`, `time_matmul`, `matmul_ceiling`.

Timing a CUDA op needs `torch.cuda.synchronize()` on both sides: kernels are
queued asynchronously, so a bare wall clock measures the launch, not the work.
"""

import statistics
import time

import torch

from tracer.device import cuda_in_use, cuda_sync_for, device_info, sync_all_cuda
from tracer.errors import TraceError


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
        raise TraceError(
            "time_step: call it outside the Tracer (and outside FakeTensorMode): traced time is not step time"
        )
    device = _usable_device("time_step", device) if device is not None else None
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


def _usable_device(what, device):
    """`device` as a torch.device this process can run on; else a one-line TraceError (a CUDA device without CUDA
    would be timed on the CPU, unsynchronised, or fail in torch)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise TraceError(
            f"{what}: device must be a torch.device or a device string such as 'cpu' or 'cuda:0', got {device!r}"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TraceError(
                f"{what}: device {str(device)!r} asked for, but CUDA is not available in this process "
                "(torch.cuda.is_available() is False); pass device='cpu' or leave it out"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise TraceError(
                f"{what}: device {str(device)!r} asked for, but this process sees "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    return device


def _tracing_active():
    from tracer.recording import mode

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
    device = _usable_device("matmul_ceiling", device)
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
