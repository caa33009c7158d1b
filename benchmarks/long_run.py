"""Trace a million ops: peak memory growth and bytes per op on disk.

    .venv/bin/python benchmarks/long_run.py [--ops 1000000] [--out runs/long.parquet]

A tiny GPT trains for as many steps as it takes to reach `--ops` traced ops.
RSS is sampled every 20 ms on a thread; growth = peak RSS while tracing - RSS
just before. Targets: growth under 150 MB, under 100 bytes per op on disk.
"""

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step  # noqa: E402

from tracer import Tracer  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Samples RSS on a thread while the block runs."""

    def __enter__(self):
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def trace_ops(path, ops):
    """Trace training steps of a tiny GPT until `ops` rows; returns (rows, steps, seconds, rss before, peak)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, 2)
    for _ in range(3):
        train_step(model, opt, idx, targets)
    before = rss_bytes()
    start = time.perf_counter()
    steps = 0
    with PeakRSS() as rss, Tracer(path, model=model, tokens=2 * cfg.seq_len) as tr:
        while tr._writer.rows + len(tr._rows) < ops:
            train_step(model, opt, idx, targets)
            steps += 1
    seconds = time.perf_counter() - start
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["seq"]).num_rows
    return rows, steps, seconds, before, rss.peak


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(ROOT / "runs" / "long.parquet"))
    args = parser.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows, steps, seconds, before, peak = trace_ops(args.out, args.ops)
    disk = sum(p.stat().st_size for p in Path(args.out).glob("part-*.parquet"))
    print(f"traced {rows:,} ops in {steps:,} steps, {seconds:.1f} s ({seconds / rows * 1e6:.1f} us per op, traced)")
    print(
        f"RSS before {before / 2**20:.1f} MiB, peak while tracing {peak / 2**20:.1f} MiB: "
        f"growth {(peak - before) / 1e6:.1f} MB (target < 150 MB)"
    )
    print(
        f"on disk: {disk / 1e6:.1f} MB in {len(list(Path(args.out).glob('part-*.parquet')))} parts, "
        f"{disk / rows:.1f} bytes per op (target < 100)"
    )


if __name__ == "__main__":
    main()
