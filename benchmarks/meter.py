"""Overhead of a metered step (tracer.metering.meter.Meter) over an untraced step, on the example GPT, in one run.

    .venv/bin/python benchmarks/meter.py [--rounds 600] [--batch 8]

The Meter traces the first two steps, then every step pays its hook (a forward hook on the root
module) and `meter.step()` (a clock read, the autograd sequence number read, the signature
compared, the figures). Each round runs one untraced step with the meter's hook off and one
metered step with it on (the order alternates between rounds), each timed by this script's
own clock around the training step and, for the metered one, `meter.step()`: a pair a few
milliseconds apart, so the machine's drift (other jobs, clock changes) cancels within it.
The figure is the median over rounds of metered / untraced, with its interquartile range
and range. The mean ratio counts the table writes (60 s into the run, then at each doubling
of its age), which medians leave out; `--write-cost` times one write of the table as it
stands at the end. `--hook-path` also times the forward pass alone (no_grad) without hooks,
with a global module pre-hook that does nothing (what a meter counting module calls would
pay on every module call) and with the meter's hooks (under no_grad these count the modules of the root call
through a global hook, as an evaluation step does; a training step's root call takes none).
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
sys.path.insert(0, str(ROOT / "examples"))

from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step  # noqa: E402

from tracer.metering.meter import Meter  # noqa: E402


def quantiles(values):
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600, help="pairs of an untraced and a metered step")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--write-cost", action="store_true", help="also time writing the table (a metadata-only part)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared 2-core VM)")
    parser.add_argument("--hook-path", action="store_true", help="also time the forward pass with a no-op global hook")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, args.batch)
    for _ in range(3):  # warm-up, untraced
        train_step(model, opt, idx, targets)

    with tempfile.TemporaryDirectory() as tmp:
        meter = Meter(Path(tmp) / "meter", model=model, tokens=args.batch * cfg.seq_len)
        for _ in range(2):  # the traced steps: the rounds time metered steps only
            train_step(model, opt, idx, targets)
            meter.step()
        spent = {"hooks": 0.0, "step": 0.0, "calls": 0, "each": []}  # the meter's own work, timed inside it

        def timed(fn):
            def wrapper(*a, **k):
                start = time.perf_counter()
                fn(*a, **k)
                spent["hooks"] += time.perf_counter() - start
                spent["calls"] += 1

            return wrapper

        meter._remove_hooks()
        unwrapped = meter._root_inputs
        meter._root_inputs = timed(meter._root_inputs)
        meter._install_hooks()
        ratios, plain_all, metered_all = [], [], []
        gc.collect()
        for r in range(args.rounds):
            times = {}
            for kind in ("plain", "metered") if r % 2 == 0 else ("metered", "plain"):
                if kind == "plain":
                    meter._remove_hooks()
                start = time.perf_counter()
                train_step(model, opt, idx, targets)
                if kind == "metered":
                    inner = time.perf_counter()
                    meter.step()
                    spent["each"].append(time.perf_counter() - inner)
                    spent["step"] += spent["each"][-1]
                times[kind] = time.perf_counter() - start
                if kind == "plain":
                    meter._install_hooks()
                    meter.begin()  # the plain step is not the next metered step's time
            ratios.append(times["metered"] / times["plain"])
            plain_all.append(times["plain"])
            metered_all.append(times["metered"])
        table = meter.table()
        spent = dict(spent)  # the metered steps' figures; the hook path's passes run the hooks untimed
        meter._remove_hooks()
        meter._root_inputs = unwrapped
        meter._install_hooks()
        hook_path = forward_with_hooks(model, idx, targets, meter, min(args.rounds, 30)) if args.hook_path else None
        if args.write_cost:
            writes = []
            for _ in range(5):
                start = time.perf_counter()
                meter._write()
                writes.append(time.perf_counter() - start)
        meter.close()

    lo, mid, hi = quantiles(ratios)
    print(
        f"example GPT (batch {args.batch}, seq {cfg.seq_len}, {cfg.n_layer} layers, d {cfg.d_model}), "
        f"{args.rounds} rounds of an untraced and a metered step, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"untraced step: median {statistics.median(plain_all) * 1e3:.2f} ms; metered step: median "
        f"{statistics.median(metered_all) * 1e3:.2f} ms"
    )
    print(
        f"metered / untraced, per round: median {mid:.4f} (IQR {lo:.4f}-{hi:.4f}, range {min(ratios):.4f}-{max(ratios):.4f})"
    )
    print(
        f"  mean metered / mean untraced (table writes included): {statistics.fmean(metered_all) / statistics.fmean(plain_all):.4f}"
    )
    print(f"  overhead per step: median {(statistics.median(metered_all) - statistics.median(plain_all)) * 1e6:.0f} us")
    n = len(metered_all)
    own = (spent["hooks"] + spent["step"]) / n
    print(
        f"  the meter's own work per metered step (timed inside it): {own * 1e6:.0f} us = "
        f"{own / statistics.median(plain_all) * 100:.2f}% of the untraced median: hooks {spent['hooks'] / n * 1e6:.0f} us "
        f"({spent['calls'] / n:.0f} calls), step() {spent['step'] / n * 1e6:.0f} us (median "
        f"{statistics.median(spent['each']) * 1e6:.0f} us)"
    )
    if args.write_cost:
        print(
            f"  writing the table ({len(table['steps']['step'])} steps): median {statistics.median(writes) * 1e3:.1f} ms "
            f"(range {min(writes) * 1e3:.1f}-{max(writes) * 1e3:.1f})"
        )
    if hook_path is not None:
        plain = hook_path["no hooks"]
        print(
            f"  forward alone (no_grad, fastest of 20 per round, median over {min(args.rounds, 30)} rounds): "
            + ", ".join(f"{k} {v * 1e6:.0f} us (+{(v - plain) * 1e6:.0f})" for k, v in hook_path.items())
        )
    traced = sum(table["steps"]["traced"])
    print(f"  steps traced by the meter: {traced} of {len(table['steps']['step'])}")


def forward_with_hooks(model, idx, targets, meter, rounds):
    """{variant: median over rounds of the fastest of 20 forward passes}: no hooks, a global module forward
    pre-hook that does nothing, the meter's hooks."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    def noop(module, args):
        return None

    found = {"no hooks": [], "no-op global hook": [], "the meter's hooks": []}
    meter._remove_hooks()
    for _ in range(rounds):
        for kind, taken in found.items():
            handle = register_module_forward_pre_hook(noop) if kind == "no-op global hook" else None
            if kind == "the meter's hooks":
                meter._install_hooks()
            times = []
            with torch.no_grad():
                for _ in range(20):
                    start = time.perf_counter()
                    model(idx, targets)
                    times.append(time.perf_counter() - start)
            if handle is not None:
                handle.remove()
            if kind == "the meter's hooks":
                meter._remove_hooks()
                meter.begin()  # forget what these passes noted
            taken.append(min(times))
    return {k: statistics.median(v) for k, v in found.items()}


if __name__ == "__main__":
    main()
