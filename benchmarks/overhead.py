"""Per-op overhead of optrace against the floor and against other tools, in one process.

    .venv/bin/python benchmarks/overhead.py [--repeats 7] [--steps 5]

For each model (the example GPT and a wider one), each variant runs `--steps`
training steps inside its context (entering, the steps and leaving are all
timed: writing the trace is part of optrace's cost), after a warm-up, in
interleaved rounds; the figure is the median over rounds, per step.
Overhead per op = (variant - untraced) / ops per step.
"""

import argparse
import contextlib
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step  # noqa: E402

from tracer import Tracer  # noqa: E402


class EmptyMode(TorchDispatchMode):
    """The floor: a dispatch mode that only runs each op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_flops=True)


def variants(directory):
    return {
        "untraced": contextlib.nullcontext,
        "empty TorchDispatchMode": EmptyMode,
        "FlopCounterMode": lambda: FlopCounterMode(display=False),
        "torch.profiler": profiler,
        "optrace": lambda: Tracer(directory / "bench.parquet"),
    }


def measure(cfg, batch, steps, repeats, directory):
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, batch)
    path = directory / "ops.parquet"
    train_step(model, opt, idx, targets)  # the first step also creates AdamW's state: count a later one
    with Tracer(path):
        train_step(model, opt, idx, targets)
    import pyarrow.parquet as pq

    ops = pq.read_table(path, columns=["seq"]).num_rows
    contexts = variants(directory)
    for make in contexts.values():  # warm-up: every variant once
        with make():
            train_step(model, opt, idx, targets)
    times = {name: [] for name in contexts}
    for _ in range(repeats):
        for name, make in contexts.items():
            gc.collect()  # each variant starts from the same heap, whatever ran before it
            start = time.perf_counter()
            with make():
                for _ in range(steps):
                    train_step(model, opt, idx, targets)
            times[name].append((time.perf_counter() - start) / steps)
    return ops, {name: statistics.median(t) for name, t in times.items()}


def report(title, ops, med):
    base = med["untraced"]
    over = {name: (t - base) / ops * 1e6 for name, t in med.items()}
    print(f"\n{title}: {ops} ops per step")
    print(f"{'variant':<26}{'ms/step':>9}{'x untraced':>12}{'us/op over':>12}")
    for name, t in med.items():
        print(f"{name:<26}{t * 1e3:>9.2f}{t / base:>12.2f}{over[name]:>12.1f}")
    flop = over["FlopCounterMode"]
    empty = over["empty TorchDispatchMode"]
    ours = over["optrace"]
    print(f"optrace overhead / FlopCounterMode overhead = {ours / flop:.2f} (target <= 0.5)")
    print(f"optrace overhead / empty-mode overhead      = {ours / empty:.2f} (target <= 3)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--model", choices=("small", "wide", "both"), default="both")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    models = {
        "example GPT (d 64, 2 layers, seq 64, batch 8)": (GPTConfig(), 8),
        "wider GPT (d 256, 4 layers, seq 128, batch 8)": (GPTConfig(d_model=256, n_layer=4, seq_len=128, n_head=8), 8),
    }
    if args.model != "both":
        models = dict([list(models.items())[0 if args.model == "small" else 1]])
    with tempfile.TemporaryDirectory() as tmp:
        for title, (cfg, batch) in models.items():
            ops, med = measure(cfg, batch, args.steps, args.repeats, Path(tmp))
            report(title, ops, med)


if __name__ == "__main__":
    main()
