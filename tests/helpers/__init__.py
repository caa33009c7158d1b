"""What the test modules share that is not a fixture: the checkout's paths, a child program's first line, a copy of
a trace as another rank, example scripts run in one child.

How tests import each other: `tests/` and each folder under it is a package (an empty `__init__.py`), so pytest
(its default `prepend` import mode) puts the checkout's root on `sys.path` and names every test module by its
dotted path. A test imports what it shares absolutely, from here (`from tests.helpers import ROOT, copy_rank`) or
from another test module (`from tests.tracer.metering.test_meter import Net`). A fixture is never imported: one that
several modules use lives in the conftest.py of their nearest common folder (tests/conftest.py for every test;
tests/reports/sql/conftest.py for the SQL engine's traces), where pytest finds it. Paths are built from `ROOT`, never
from a test file's own place, so a test module can move between folders."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tracer/, reports/, examples/, docs/
EXAMPLES = ROOT / "examples"

# The first line of a child program that takes a Ctrl-C: Python's own SIGINT handler, whatever the suite inherited.
# A suite started with SIGINT ignored (`make test &` from a script, `nohup ... &`, an ignoring parent) passes that
# on to every child: Python then installs no handler, so `os.kill(pid, SIGINT)`, `signal.raise_signal` and
# `_thread.interrupt_main` do nothing, and no KeyboardInterrupt comes.
DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def copy_rank(source, target, rank):
    """A copy of trace directory `source` at `target` as rank `rank` of the same job: every part's metadata and the
    marker name that rank and a trace id of its own (a plain copy is refused by the reports: two directories of
    one trace)."""
    import json
    import shutil

    import pyarrow.parquet as pq

    from reports.loading.integrity import read_marker
    from tracer.schema import METADATA_KEY, part_paths, read_part
    from tracer.store.directory import write_facts

    shutil.copytree(source, target)
    for part in part_paths(target):
        table = read_part(part)
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        trace_id = f"{meta.get('trace_id')}-rank{rank}"
        meta.update(rank=rank, trace_id=trace_id, world_size=max(int(meta.get("world_size") or 1), rank + 1))
        pq.write_table(
            table.replace_schema_metadata({**table.schema.metadata, METADATA_KEY: json.dumps(meta).encode()}), part
        )
    marker = read_marker(target)
    if marker.get("trace_id") is not None:
        write_facts(target, {**marker, "trace_id": f"{marker['trace_id']}-rank{rank}"})
    return target


def unwrapped(text):
    """`text` with every run of whitespace made one space: a report's prose, wrapped to the width
    (reports.output.report_text), read as one line."""
    return " ".join(text.split())


# Example scripts run one after another in one child Python (one import of torch, tracer and reports, not one per
# script), each as `python examples/<script> ARGS` runs it: as __main__, its folder first on sys.path, from an empty
# directory of its own named as the script; what it printed, its exit status (0 when it returned) or the traceback of
# what it raised.
_RUN_SCRIPTS = """
import contextlib, io, json, os, runpy, sys, traceback
results, base = {}, os.getcwd()
for script, args in json.loads(sys.argv[1]):
    name = os.path.basename(script)
    os.mkdir(os.path.join(base, name))
    os.chdir(os.path.join(base, name))
    out, err = io.StringIO(), io.StringIO()
    sys.argv, sys.path[0] = [script, *args], os.path.dirname(script)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        except BaseException:
            code = traceback.format_exc()
    results[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()[-4000:]}
print(json.dumps(results))
"""


def run_examples(cwd, *scripts):
    """Run examples/ scripts, each a (name, [args]), in one child Python from `cwd` (see _RUN_SCRIPTS; a fork of
    a Python that imported torch, tests.helpers.forked); later ones find what earlier ones left in the process (a
    fake process group: put such a script last).
    Returns {name: {"code", "stdout", "stderr"}}; each ran in cwd/<name>."""
    import json

    from tests.helpers import forked

    runs = [(str(EXAMPLES / name), list(args)) for name, args in scripts]
    done = forked.run(_RUN_SCRIPTS, [json.dumps(runs)], cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def gpt_trace(path, steps=2, bandwidth=None, **options):
    """A trace of the example GPT (examples/gpt.py: 1 layer, 2 heads, d_model 16, sequence 8, batch 2) over `steps`
    training steps, in parts of 256 rows; `bandwidth` bytes/s recorded (Tracer.set_bandwidth) gives the roofline a
    memory roof on a CPU; `options` go to the example's GPTConfig (attention="sdpa")."""
    import torch
    from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step

    from tracer import Tracer

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16, **options)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, 2)
    with Tracer(path, model=model, tokens=2 * cfg.seq_len, run_name=Path(path).name, flush_rows=256) as tracer:
        if bandwidth is not None:
            tracer.set_bandwidth({"bytes_per_s": float(bandwidth)})
        for _ in range(steps):
            train_step(model, opt, idx, targets)
    return path


def amp_step(model, opt, scaler, batches, losses):
    """One optimizer step of nanoGPT's loop on a CPU: for each (x, y) of `batches` (its micro-batches) the loss of
    `model(x, y)` under bf16 autocast, divided by their number, scaled and backpropagated, its loss.item() appended to
    `losses`; then the GradScaler's unscale, clipping to norm 1.0, the scaler's step and update, and zero_grad."""
    import torch

    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y) / len(batches)
        scaler.scale(loss).backward()
        losses.append(loss.item())
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def tiny_gpt2(transformers, rows=8):
    """A GPT-2 of one layer (width 16, 2 heads, vocabulary 32, 8 positions) made after torch.manual_seed(0), and
    `rows` sequences of 8 token ids drawn after it: (model, ids)."""
    import torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config), torch.randint(0, 32, (rows, 8))


def trainer_arguments(transformers, out, **given):
    """transformers.TrainingArguments of the tests' Trainer runs: output in `out`, batches of 2, a log every step, on
    the CPU, nothing saved or reported, no progress bar, seed 0; `given` adds or overrides."""
    fixed = dict(per_device_train_batch_size=2, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    return transformers.TrainingArguments(output_dir=str(out), **fixed, disable_tqdm=True, seed=0, **given)


def traced_loop(root, name, make, steps, warm, tokens, bitwise_steps, local=lambda p: p):
    """A distributed loop's traces and its harm check, on one rank: `name`1 and `name`3 under `root` (1 and 3 steps
    traced after `warm` untraced ones, each from a fresh `make()`), then `bitwise_steps` steps of fresh models
    untraced and traced (`name`_same). `make()` gives the loop's state (its model first), `steps(state, n, same)`
    runs n steps and returns their losses (`same`: one batch every step); `local(p)` a parameter as a plain tensor
    (p.to_local() for a DTensor). Returns [the losses equal, then each parameter equal], traced against untraced."""
    import contextlib
    import os

    import torch

    from tracer import Tracer

    for k in (1, 3):
        state = make()
        steps(state, warm, True)
        with Tracer(os.path.join(root, f"{name}{k}"), model=state[0], tokens=tokens):
            steps(state, k, True)
    outcome = {}
    for traced in (False, True):
        state = make()
        tracing = Tracer(os.path.join(root, f"{name}_same"), model=state[0], tokens=tokens)
        with tracing if traced else contextlib.nullcontext():
            losses = steps(state, bitwise_steps, False)
        outcome[traced] = (losses, [local(p).detach().clone() for p in state[0].parameters()])
    return [outcome[False][0] == outcome[True][0]] + [
        torch.equal(a, b) for a, b in zip(outcome[False][1], outcome[True][1])
    ]
