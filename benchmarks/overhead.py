"""Per-op overhead of optrace against the floor and against other tools, in one process.

    .venv/bin/python benchmarks/overhead.py [--rounds 40] [--steps 10] [--model example|hf|both] [--clock wall|cpu]
    .venv/bin/python benchmarks/overhead.py --callgrind      # instruction counts (needs valgrind)

Wall clock: for each model (the example GPT and, when `transformers` is installed, a
small randomly initialised Hugging Face GPT-2: no weights are downloaded), each
variant runs `--steps` training steps inside its context (entering, the steps and
leaving are all timed: writing the trace is part of optrace's cost), after a warm-up,
in interleaved rounds (every variant once per round, in a rotating order, after a
`gc.collect()`). The figure is the median over rounds; the spread is the
interquartile range. Overhead per op = (variant - untraced) / ops per step.
optrace runs twice per round where the compiled collector is built: as installed
("optrace", the compiled path) and with OPTRACE_COLLECTOR=python ("optrace, Python path").
`--clock cpu` times the process's CPU time instead of the wall clock: on a machine
shared with other jobs it is less swayed by them (it still counts their cache misses).

Instruction counts (`--callgrind`): the same steps run under valgrind's callgrind,
each variant inside its own CPython entry point (operator.call, sys.call_tracing,
itertools.starmap, ...) with collection on only there, so the import and set-up
are not counted; per op = (variant - untraced) / (steps x ops per step). With one
torch thread (a second thread's share of the work varies between runs) the counts of
the same code repeat within 0.5% run to run, so they are the figures to decide on. `--ablations` adds optrace without its gradient
hooks and without writing parts: where its instructions go (the compiled hook records the common op itself, so
`_record` is no longer a part of its own).
"""

import argparse
import contextlib
import gc
import itertools
import operator
import os
import re
import statistics
import subprocess
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
from tracer.native import loader as native  # noqa: E402

BATCH = 8
SEQ = 64


class EmptyMode(TorchDispatchMode):
    """The floor: a dispatch mode that only runs each op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_flops=True)


def variants(directory, with_profiler=True, python_path=True):
    found = {
        "untraced": contextlib.nullcontext,
        "empty TorchDispatchMode": EmptyMode,
        "FlopCounterMode": lambda: FlopCounterMode(display=False),
        "torch.profiler": profiler,
        "optrace": lambda: Tracer(directory / "bench"),
        "optrace, Python path": lambda: _python_path(directory / "bench_python"),
    }
    if native.choose()[0] is None or not python_path:  # no compiled collector: "optrace" is the Python path already
        del found["optrace, Python path"]
    if not with_profiler:
        del found["torch.profiler"]
    return found


@contextlib.contextmanager
def _python_path(path):
    """optrace with its pure-Python collector (OPTRACE_COLLECTOR=python, read when the Tracer is entered)."""
    old = os.environ.get(native.ENV)
    os.environ[native.ENV] = "python"
    try:
        tracer = Tracer(path)
        tracer.__enter__()
    finally:
        if old is None:
            del os.environ[native.ENV]
        else:
            os.environ[native.ENV] = old
    try:
        yield tracer
    except BaseException as exc:
        tracer.__exit__(type(exc), exc, exc.__traceback__)
        raise
    tracer.__exit__(None, None, None)


def example_gpt():
    return example_gpt_parts()[2]


def example_gpt_parts():
    """(model, tokens per step, step) of the example GPT's training step."""
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, BATCH)
    return model, idx.numel(), lambda: train_step(model, opt, idx, targets)


def hf_gpt2():
    parts = hf_gpt2_parts()
    return parts[2] if parts is not None else None


def hf_gpt2_parts():
    """(model, tokens per step, step) of a small GPT-2 from its config (random weights, nothing downloaded), or None
    without transformers."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=512,
        n_positions=SEQ,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    model = GPT2LMHeadModel(cfg)
    opt = make_optimizer(model)
    idx = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))

    def step():
        model(input_ids=idx, labels=idx).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, idx.numel(), step


MODELS = {
    "example": ("example GPT (d 64, 2 layers, seq 64, batch 8)", example_gpt),
    "hf": ("HF GPT-2 (d 64, 2 layers, seq 64, batch 8, random init)", hf_gpt2),
}


def ops_per_step(step, directory):
    import pyarrow.parquet as pq

    step()  # the first step also creates AdamW's state: count a later one
    with Tracer(directory / "ops"):
        step()
    return pq.read_table(directory / "ops", columns=["seq"]).num_rows


def measure(step, steps, rounds, directory, with_profiler=True, clock=time.perf_counter):
    ops = ops_per_step(step, directory)
    contexts = variants(directory, with_profiler)
    for make in contexts.values():  # warm-up: every variant once
        with make():
            step()
    names = list(contexts)
    times = {name: [] for name in contexts}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate: no variant always follows another
            gc.collect()  # each variant starts from the same heap, whatever ran before it
            start = clock()
            with contexts[name]():
                for _ in range(steps):
                    step()
            times[name].append((clock() - start) / steps)
    return ops, times


def report(title, ops, times):
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["untraced"]
    over = {name: (t - base) / ops * 1e6 for name, t in med.items()}
    print(f"\n{title}: {ops} ops per step, {len(times['untraced'])} rounds")
    print(f"{'variant':<26}{'ms/step':>9}{'IQR ms':>9}{'us/op over':>12}")
    for name, t in times.items():
        q = statistics.quantiles(t, n=4) if len(t) > 1 else [t[0]] * 3
        print(f"{name:<26}{med[name] * 1e3:>9.2f}{(q[2] - q[0]) * 1e3:>9.2f}{over[name]:>12.1f}")
    # the ratio of each round's own overheads: its spread says how far the medians can be trusted
    for name in (n for n in times if n.startswith("optrace")):
        per_round = [
            (o - u) / (f - u) for o, f, u in zip(times[name], times["FlopCounterMode"], times["untraced"]) if f > u
        ]
        per_round_empty = [
            (o - u) / (e - u)
            for o, e, u in zip(times[name], times["empty TorchDispatchMode"], times["untraced"])
            if e > u
        ]
        print(
            f"{name + ' / FlopCounterMode':<44} = {over[name] / over['FlopCounterMode']:.2f} (target <= 0.5); per round: median {_spread(per_round)}"
        )
        print(
            f"{name + ' / empty mode':<44} = {over[name] / over['empty TorchDispatchMode']:.2f} (target <= 2); per round: median {_spread(per_round_empty)}"
        )


def _spread(values):
    if len(values) < 4:
        return "n/a"
    q = statistics.quantiles(values, n=4)
    return f"{q[1]:.2f}, IQR {q[0]:.2f}-{q[2]:.2f}"


# instruction counts ------------------------------------------------------------------
# C functions of CPython that call a Python callable and that nothing in a training step
# calls: callgrind counts instructions only inside them (--toggle-collect), one per
# variant, and reports each one's inclusive count.
ENTRY_POINTS = (
    ("_operator_call", lambda f: operator.call(f)),
    ("sys_call_tracing", lambda f: sys.call_tracing(f, ())),
    ("starmap_next", lambda f: list(itertools.starmap(f, [()]))),
    ("takewhile_next", lambda f: list(itertools.takewhile(lambda _: f(), [0]))),
    ("dropwhile_next", lambda f: list(itertools.dropwhile(lambda _: f(), [0]))),
    ("filterfalse_next", lambda f: list(itertools.filterfalse(lambda _: f(), [0]))),
    ("accumulate_next", lambda f: list(itertools.accumulate([0, 0], lambda a, b: f()))),
)


@contextlib.contextmanager
def _patched(owner, name, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def ablations(directory):
    """optrace with one part of its work removed: the differences say where its time goes."""
    from tracer.recording.backward import BackwardStack
    from tracer.store.writer import PartWriter

    def without(owner, name, value, trace):
        @contextlib.contextmanager
        def context():
            with _patched(owner, name, value), Tracer(directory / trace):
                yield

        return context

    def no_hooks():
        stack = contextlib.ExitStack()
        stack.enter_context(_patched(BackwardStack, "watch_inputs", lambda *a: None))
        stack.enter_context(_patched(BackwardStack, "watch_outputs", lambda *a: None))
        stack.enter_context(Tracer(directory / "no_hooks"))
        return stack

    def skip_write(self, rows, metadata):
        self.rows += len(rows)

    return {
        "optrace, no gradient hooks": no_hooks,
        "optrace, no part written": without(PartWriter, "write", skip_write, "no_write"),
    }


def callgrind_child(model, steps, with_ablations):
    """Run under valgrind: each variant's steps inside its own entry point."""
    step = MODELS[model][1]()
    with tempfile.TemporaryDirectory() as tmp:
        contexts = variants(Path(tmp), with_profiler=False)  # 7 entry points
        if with_ablations:
            contexts.update(ablations(Path(tmp)))
        for make in contexts.values():  # warm-up, uncounted
            with make():
                step()
        for (name, make), (_, enter) in zip(contexts.items(), ENTRY_POINTS):
            gc.collect()

            def run(*_, make=make):
                with make():
                    for _ in range(steps):
                        step()
                return True

            enter(run)


def callgrind(model, steps, directory, with_ablations):
    step = MODELS[model][1]()
    ops = ops_per_step(step, directory)
    names = list(variants(directory, with_profiler=False))
    if with_ablations:
        names += list(ablations(directory))
    out = directory / f"callgrind.{model}.out"
    toggles = [f"--toggle-collect={entry}" for entry, _ in ENTRY_POINTS[: len(names)]]
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        *toggles,
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--callgrind-child",
        model,
        "--steps",
        str(steps),
        "--threads",
        "1",
    ]
    if with_ablations:
        cmd.append("--ablations")
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", str(out)], check=True, capture_output=True, text=True
    ).stdout
    counts = {}
    for name, (entry, _) in zip(names, ENTRY_POINTS):
        match = re.search(r"^\s*([\d,]+) \([^)]*\)\s+\S+:" + entry + r" \[", text, re.M)
        if match is None:
            raise SystemExit(f"callgrind: no count for {entry} ({name}) in {out}")
        counts[name] = int(match.group(1).replace(",", ""))
    return ops, counts


def report_callgrind(title, ops, counts, steps):
    base = counts["untraced"]
    print(f"\n{title}: {ops} ops per step, {steps} steps per variant, instructions (callgrind)")
    print(f"{'variant':<30}{'Minstr/step':>12}{'kinstr/op over':>16}")
    over = {}
    for name, count in counts.items():
        over[name] = (count - base) / (steps * ops) / 1e3
        print(f"{name:<30}{count / steps / 1e6:>12.2f}{over[name]:>16.2f}")
    for name in (n for n in counts if n.startswith("optrace") and not n.startswith("optrace, no ")):
        print(f"{name + ' / FlopCounterMode':<44} = {over[name] / over['FlopCounterMode']:.2f} (target <= 0.5)")
        print(f"{name + ' / empty mode':<44} = {over[name] / over['empty TorchDispatchMode']:.2f} (target <= 2)")
    for name in counts:
        if name.startswith("optrace, no "):
            print(f"{name[len('optrace, no ') :]:<24} {over['optrace'] - over[name]:6.2f} kinstr/op")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--model", choices=("example", "hf", "both"), default="both")
    parser.add_argument(
        "--callgrind", action="store_true", help="instruction counts under valgrind instead of wall clock"
    )
    parser.add_argument(
        "--ablations",
        action="store_true",
        help="with --callgrind: also optrace without its gradient hooks or part writes",
    )
    parser.add_argument("--no-profiler", action="store_true", help="leave torch.profiler out of the wall-clock rounds")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time (time.process_time), less swayed by other jobs on a shared machine",
    )
    parser.add_argument("--callgrind-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.callgrind_child:
        return callgrind_child(args.callgrind_child, args.steps, args.ablations)
    timed = "instructions (callgrind, 1 thread)" if args.callgrind else f"{args.clock} clock"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {timed}")
    models = list(MODELS) if args.model == "both" else [args.model]
    with tempfile.TemporaryDirectory() as tmp:
        for key in models:
            title, make = MODELS[key]
            if key == "hf" and make() is None:
                print(f"\n{title}: skipped (transformers is not installed)")
                continue
            if args.callgrind:
                ops, counts = callgrind(key, args.steps, Path(tmp), args.ablations)
                report_callgrind(title, ops, counts, args.steps)
            else:
                clock = time.process_time if args.clock == "cpu" else time.perf_counter
                ops, times = measure(make(), args.steps, args.rounds, Path(tmp), not args.no_profiler, clock)
                report(title, ops, times)


if __name__ == "__main__":
    main()
