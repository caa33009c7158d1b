"""The lecture's matmul timing and MFU, on this machine's CPU and, where present, its GPU.

    python examples/matmul_mfu.py [--size 2048]

MFU = actual FLOP/s / promised FLOP/s. A B x D @ D x K matmul costs 2·B·D·K FLOPs
(one multiply and one add per (i, j, k) triple). "Promised" is the device's dense
peak: a GPU's datasheet figure for the dtype, or a CPU's ideal peak, cores x clock
x FLOPs per cycle (the lecture's FLOPS (Ideal) formula). An MFU of 0.5 or more is good.
"""

import argparse
import sys
from pathlib import Path

import torch

try:
    import tracer  # noqa: F401
except ImportError:  # run from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reports.flops.peaks import peak_flops
from tracer import time_matmul
from tracer.device import device_info


def measure(device, dtype, size):
    """(actual FLOP/s, promised FLOP/s or None, where the promise comes from)."""
    B = D = K = size
    x = torch.ones(B, D, device=device, dtype=dtype)
    w = torch.randn(D, K, device=device).to(dtype)
    seconds = time_matmul(x, w, trials=5)  # one warm-up call, then the mean of 5; synchronised on CUDA
    actual = 2 * B * D * K / seconds
    promised, source = peak_flops(device_info(torch.device(device)), dtype)
    return seconds, actual, promised, source


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="B = D = K (default: %(default)s)")
    args = parser.parse_args(argv)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"{args.size} x {args.size} @ {args.size} x {args.size}: 2·B·D·K = {2 * args.size**3:,} FLOPs")
    for device in devices:
        for dtype in (torch.float32, torch.bfloat16):
            seconds, actual, promised, source = measure(device, dtype, args.size)
            mfu = f"{actual / promised:.3f}" if promised else "N/A"
            print(
                f"\n{device} {str(dtype).removeprefix('torch.')}: {seconds * 1e3:.2f} ms, actual {actual / 1e9:.1f} GFLOP/s"
            )
            print(f"  promised {promised / 1e9:.1f} GFLOP/s" if promised else "  promised: unknown", f"({source})")
            print(f"  MFU = actual / promised = {mfu}")


if __name__ == "__main__":
    main()
