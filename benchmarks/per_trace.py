"""What one trace costs besides its ops: entering and leaving a Tracer around one training step.

    .venv/bin/python benchmarks/per_trace.py [--rounds 15] [--objects 0,1000000] [--model example|hf|both]

For each model (the example GPT and, when `transformers` is installed, the small randomly initialised
HF GPT-2 of overhead.py), every round runs, in a rotating order after a `gc.collect()`: the step
untraced, the step inside `Tracer(path)`, and inside `Tracer(path, model=model, tokens=T)` as the
README's example calls it, once as a later trace of the process does (the optimizers the last pass
found reused) and once with that pass made again (as the first trace of a process, or one after an
optimizer was made or freed). Per trace = traced step - untraced step, the process's CPU time, median
over rounds (IQR). With `model=`, entering finds the optimizers holding the model's parameters (their
state is alive at entry: tracer.recording.metadata `register_at_entry`, `LiveOptimizers`) in one pass over
every object the garbage collector tracks, so its cost grows with the program's live objects, not with
the model: `--objects` runs the rounds again with that many extra small live objects (lists, as a
dataset's rows or a tokenizer's tables would be), and the pass alone is timed too. Entering (the Tracer made and
its `__enter__`) and leaving (`__exit__`) are timed on their own for `Tracer(path, model=, tokens=)`: the fixed
cost of a trace, the rest of traced - untraced being its ops.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead import example_gpt_parts, hf_gpt2_parts  # noqa: E402

from tracer import Tracer  # noqa: E402
from tracer.recording.metadata import LIVE_OPTIMIZERS, LiveOptimizers  # noqa: E402

MODELS = {"example": ("example GPT", example_gpt_parts), "hf": ("HF GPT-2 (random init)", hf_gpt2_parts)}


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{q[1]:7.2f} ({q[0]:.2f}-{q[2]:.2f})"


def _forgotten(tracer):
    LIVE_OPTIMIZERS._refs = None  # the next entry makes the pass
    return tracer


def measure(model, tokens, step, rounds, directory):
    variants = {
        "untraced": lambda: None,
        "Tracer(path)": lambda: Tracer(directory / "plain"),
        "Tracer(path, model=, tokens=)": lambda: Tracer(directory / "model", model=model, tokens=tokens),
        "the same, the optimizers' pass made again": lambda: _forgotten(
            Tracer(directory / "pass", model=model, tokens=tokens)
        ),
    }
    times = {name: [] for name in variants}
    names = list(variants)
    enter, leave = [], []  # of Tracer(path, model=, tokens=): __enter__ and __exit__ alone
    for r in range(rounds + 1):  # round 0: warm-up, not kept
        for name in names[r % len(names) :] + names[: r % len(names)]:
            gc.collect()
            make = variants[name]
            start = time.process_time()
            tracer = make()
            if tracer is None:
                step()
            else:
                with tracer:
                    entered = time.process_time()
                    step()
                    stepped = time.process_time()
            if r:
                times[name].append((time.process_time() - start) * 1e3)
                if name == "Tracer(path, model=, tokens=)":
                    enter.append((entered - start) * 1e3)
                    leave.append((time.process_time() - stepped) * 1e3)
    scans = []
    for _ in range(rounds):
        start = time.process_time()
        LiveOptimizers().live()
        scans.append((time.process_time() - start) * 1e3)
    base = times["untraced"]
    out = {"untraced step": base}
    for name in names[1:]:
        out[f"traced - untraced, {name}"] = [t - b for t, b in zip(times[name], base)]
    out["the optimizers' pass alone"] = scans
    out["Tracer(path, model=, tokens=): entering (Tracer() and __enter__)"] = enter
    out["Tracer(path, model=, tokens=): leaving (__exit__: the last part, the marker)"] = leave
    out["Tracer(path, model=, tokens=): entering + leaving"] = [a + b for a, b in zip(enter, leave)]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--objects", default="0,1000000", help="extra live objects, comma-separated counts")
    parser.add_argument("--model", choices=("example", "hf", "both"), default="both")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU time, ms, median (IQR) of {args.rounds} rounds")
    keys = ("example", "hf") if args.model == "both" else (args.model,)
    with tempfile.TemporaryDirectory() as tmp:
        for key in keys:
            title, make = MODELS[key]
            built = make()
            if built is None:
                print(f"\n{title}: transformers is not installed, skipped")
                continue
            model, tokens, step = built
            for extra in (int(n) for n in args.objects.split(",")):
                ballast = [[i] for i in range(extra)]  # lists: tracked by the collector (a dict of ints is not)
                print(
                    f"\n{title}, {extra:,} extra live objects ({len(gc.get_objects()):,} tracked by the garbage collector)"
                )
                for name, values in measure(model, tokens, step, args.rounds, Path(tmp)).items():
                    print(f"  {name:<68}{quartiles(values)}")
                del ballast


if __name__ == "__main__":
    main()
