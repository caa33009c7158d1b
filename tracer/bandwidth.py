"""The achievable memory bandwidth of a device: a STREAM-like triad, timed.

STREAM's triad is a = b + s * c over arrays far larger than the caches; it counts
3 arrays x their bytes per pass (two read, one written), as STREAM does: a CPU whose
caches allocate on write also reads `a` first, so the traffic it really moves is up
to 4/3 of the figure. `tracer.memory_bandwidth()` is to the roofline's memory roof
what `matmul_ceiling` is to MFU's compute roof: what this machine reaches, beside
what a datasheet promises.
"""

import time

import torch

from tracer.device import cuda_sync_for, device_info
from tracer.errors import TraceError

TRIAD_ARRAYS = 3  # bytes counted per element pass: read b, read c, write a
SCALAR = 3.0


def memory_bandwidth(device="cpu", dtype=torch.float32, n=2**25, trials=5):
    """Bytes per second of a = b + s * c on `n`-element arrays: the best of `trials` passes after one warm-up.

    The default n = 2**25 float32 elements is 128 MiB per array, past any cache.
    Returns a JSON-ready dict {dtype, n, bytes, seconds, bytes_per_s, device} for
    `Tracer.set_bandwidth`."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise TraceError(f"memory_bandwidth: n must be a positive int, got {n!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TraceError(f"memory_bandwidth: dtype must be a floating torch.dtype, got {dtype!r}")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials <= 0:
        raise TraceError(f"memory_bandwidth: trials must be a positive int, got {trials!r}")
    device = torch.device(device)
    b = torch.ones(n, device=device, dtype=dtype)
    c = torch.ones(n, device=device, dtype=dtype)
    a = torch.empty(n, device=device, dtype=dtype)
    sync = cuda_sync_for(device.type)
    best = float("inf")
    for trial in range(trials + 1):  # the first pass faults the pages of `a` in: not timed
        if sync:
            sync()
        start = time.perf_counter()
        torch.add(b, c, alpha=SCALAR, out=a)  # one kernel: a = b + 3 * c
        if sync:
            sync()
        if trial:
            best = min(best, time.perf_counter() - start)
    moved = TRIAD_ARRAYS * n * a.element_size()
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "n": n,
        "bytes": moved,
        "seconds": best,
        "bytes_per_s": moved / best,
        "device": device_info(device),
    }
