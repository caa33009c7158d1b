"""Per-op cost of each timing mode, on a CPU, with torch.cuda's events and synchronise mocked.

    .venv/bin/python benchmarks/timing_modes.py [--ops 20000] [--repeats 5]

Each variant traces `--ops` tiny adds (`x + 1` on a 4-element tensor) with
flush_rows 16384; the figure is the median over interleaved rounds (each starting with
a different variant) of the traced time per op, and its difference from timing="off". The mocked events cost what a
Python object's method call costs, not what cudaEventRecord costs (about 2-4 us on
a real GPU, by NVIDIA's and PyTorch's own measurements): this measures optrace's
own bookkeeping per mode (the pool, the pending list, the resolve at flush).
"""

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tracer import Tracer  # noqa: E402
from tracer.recording import timing  # noqa: E402


class _Event:
    """A stand-in for torch.cuda.Event: record() notes perf_counter_ns."""

    def __init__(self, enable_timing=False):
        self.t = 0

    def record(self, stream=None):
        self.t = time.perf_counter_ns()

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e6


class _Stream:
    stream_id = 1
    device_index = 0


_STREAM = _Stream()


def mock_cuda():
    """Make the tracer take its CUDA code paths for every device, with these stand-ins."""
    timing._is_cuda = lambda device: device is not None
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda device=None: _STREAM
    torch.cuda.synchronize = lambda device=None: None


def mock_calls(ops):
    """us per op that the stand-ins alone cost: a stream lookup, two records and, at resolve, two elapsed_time."""
    events = [_Event(), _Event()]
    start = time.perf_counter()
    for _ in range(ops):
        stream = torch.cuda.current_stream(None)
        events[0].record(stream)
        events[1].record(stream)
        events[0].elapsed_time(events[1])
        events[0].elapsed_time(events[1])
    return (time.perf_counter() - start) / ops * 1e6


def run(mode, ops, directory):
    x = torch.ones(4)
    model = torch.nn.Identity()  # gives the Tracer its device before the first op
    model.register_buffer("b", x)
    gc.collect()
    start = time.perf_counter()
    if mode == "untraced":
        for _ in range(ops):
            x + 1
    else:
        with Tracer(directory / "t.parquet", model=model, timing=mode):
            for _ in range(ops):
                x + 1
    return (time.perf_counter() - start) / ops * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    modes = ("untraced", "off", "wall (CPU: events or sync)", "sync (mocked)", "events (mocked)")
    results = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        real = (timing._is_cuda, torch.cuda.Event, torch.cuda.current_stream, torch.cuda.synchronize)
        for round_ in range(args.repeats + 1):  # the first round warms up and is dropped
            shift = round_ % len(modes)  # each round starts with a different variant
            for m in modes[shift:] + modes[:shift]:
                if m in ("sync (mocked)", "events (mocked)"):
                    mock_cuda()
                else:
                    timing._is_cuda, torch.cuda.Event, torch.cuda.current_stream, torch.cuda.synchronize = real
                mode = {"untraced": "untraced", "off": "off", "wall (CPU: events or sync)": "events"}.get(
                    m, m.split()[0]
                )
                results[m].append(run(mode, args.ops, directory))
            mock_cuda()
            results.setdefault("stand-ins alone", []).append(mock_calls(args.ops))
            timing._is_cuda, torch.cuda.Event, torch.cuda.current_stream, torch.cuda.synchronize = real
    off = statistics.median(results["off"][1:])
    print(f"{args.ops} tiny adds per run, median of {args.repeats} rounds, torch {torch.__version__}")
    print(f"{'timing':<28} {'us/op traced':>12} {'us/op over off':>15}")
    for m in (*modes, "stand-ins alone"):
        value = statistics.median(results[m][1:])
        print(f"{m:<28} {value:12.2f} {value - off:15.2f}" if m != "stand-ins alone" else f"{m:<28} {value:12.2f}")


if __name__ == "__main__":
    main()
