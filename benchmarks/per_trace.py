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

`--stages` times, instead, where entering and leaving `Tracer(path, model=, tokens=)` spend their CPU time: each
stage (STAGES: a function of the tracer or of pyarrow) wrapped in a timer, over `--rounds` traces of one step, each
after a `gc.collect()` as above; per trace, the median over rounds of each stage's time (stages nest: a stage's time
includes the stages it calls).
"""

import argparse
import gc
import importlib
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


# (label, "module:attribute") of each stage --stages times; a function imported by name is wrapped where it is called
STAGES = {
    "entering": (
        ("the Tracer made", "tracer.recording.mode:Tracer.__init__"),
        ("__enter__", "tracer.recording.mode:Tracer._enter"),
        ("  the directory (checked, locked, cleared, the marker)", "tracer.recording.mode:prepare_directory"),
        ("    the entries there checked", "tracer.store.directory:foreign_entry"),
        ("    the lock", "tracer.store.directory:_lock"),
        ("    the earlier trace removed", "tracer.store.directory:_clear"),
        ("  the trace's state (Tracer._start)", "tracer.recording.start:TraceStart._start"),
        ("    the run metadata (the parameters walked)", "tracer.recording.start:run_metadata"),
        ("    the storages alive at entry, the optimizers", "tracer.recording.start:register_at_entry"),
        ("    the device", "tracer.recording.start:TraceStart._first_device"),
        ("    attribution", "tracer.recording.start:Attribution"),
        ("    the hooks and the mode on", "tracer.recording.hooks:Hooks.install"),
    ),
    "leaving": (
        ("__exit__", "tracer.recording.mode:Tracer._exit"),
        ("  the hooks and the mode off", "tracer.recording.hooks:Hooks.remove"),
        ("  the gradients' roles", "tracer.recording.metadata:Roles.gradients"),
        ("  the last part (Tracer._flush)", "tracer.recording.parts:TraceParts._flush"),
        ("    the run metadata", "tracer.recording.parts:TraceParts._metadata"),
        ("    the Arrow table (RowBuffer.table)", "tracer.store.row_buffer:RowBuffer.table"),
        ("    the Parquet file (write_table)", "tracer.store.writer:write_table"),
        ("      pyarrow's ParquetWriter made", "pyarrow.parquet:ParquetWriter.__init__"),
        ("      pyarrow's write_table", "pyarrow.parquet:ParquetWriter.write_table"),
        ("      pyarrow's close (the footer)", "pyarrow.parquet:ParquetWriter.close"),
        ("  the storage table cleared", "tracer.recording.storage:StorageTable.clear"),
        ("  the marker's facts, the lock released", "tracer.store.writer:PartWriter.close"),
        ("  the SIGTERM handler off", "tracer.recording.signals:TermHandler.remove"),
    ),
}


def _timed(spent, label, target):
    """Wrap the function `target` names so that its CPU time goes to spent[label]."""
    module, _, path = target.partition(":")
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    function = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.process_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.process_time_ns() - start

    setattr(owner, name, timed)


def stages(model, tokens, step, rounds, directory):
    """{label: [CPU ms of that stage per trace]} of entering and leaving Tracer(path, model=, tokens=)."""
    spent = {}
    for group in STAGES.values():
        for label, target in group:
            spent[label] = 0
            _timed(spent, label, target)
    out = {label: [] for group in STAGES.values() for label, _ in group}
    out["entering, all"], out["leaving, all"] = [], []
    for r in range(rounds + 1):  # round 0: warm-up, not kept
        gc.collect()
        spent.update((label, 0) for label in spent)
        start = time.process_time()
        with Tracer(directory / "stages", model=model, tokens=tokens):
            entered = time.process_time()
            step()
            spent.update(
                (label, 0) for label, _ in STAGES["leaving"]
            )  # what the step ran of them (an optimizer's step)
            stepped = time.process_time()
        if r:
            out["entering, all"].append((entered - start) * 1e3)
            out["leaving, all"].append((time.process_time() - stepped) * 1e3)
            for label, ns in spent.items():
                out[label].append(ns / 1e6)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--objects", default="0,1000000", help="extra live objects, comma-separated counts")
    parser.add_argument("--model", choices=("example", "hf", "both"), default="both")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stages", action="store_true", help="where entering and leaving spend their time (STAGES)")
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
            if args.stages:
                print(f"\n{title}: stages of Tracer(path, model=, tokens=), CPU ms per trace")
                for name, values in stages(model, tokens, step, args.rounds, Path(tmp)).items():
                    print(f"  {name:<68}{quartiles(values)}")
                continue
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
