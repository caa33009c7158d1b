"""`optrace plan TRACE --gpu G --calibrate MEASURED`: the efficiencies fitted from a trace measured on G.

MEASURED is a trace taken on the target GPU with op times (CUDA event times: duration_ns, or busy_ns
where recorded); TRACE may be any trace (a meta or fake one of a larger job, typically). From MEASURED's
last complete step (reports.plan.plan's steady step), reports.plan.ops.calibrate measures per class:

  matmul_stack, attention_stack   for the ops reports.plan.efficiency's tables price (bf16/fp16 matmuls
                                  by shape, fused attention by kernel, on an A100 or a Hopper): the stack
                                  factor times their predicted time over their measured time
  <class>_efficiency              for the other ops bound by the class: their time at the roof over their
                                  measured time (matmul and attention: those without a table's figure;
                                  vector; memory)

A figure the measured step has no op for stays as assumed. The fitted values replace the defaults in the
plan of TRACE, under the source "calibrated on MEASURED: ..."; an assumption given with --assume wins
over its calibration. `changes` lists, per fitted figure, the value before and after, with the matmuls'
and attention's efficiency on MEASURED's own ops (what they reach together) before and after.

Without a measured trace, the matmul_stack of a published run is fitted from its published step
(`stack_step`, the fixed point that scales only the matmul-bound time), and the default of a generation
is the median of its published runs' fits (`pooled`); `leave_one_out` gives each run the median of the
others' fits, of its generation (by="generation") or, stricter, of its generation's other sources
(by="source"): benchmarks/plan_validation.py judges the defaults on those.
"""

import math

import numpy as np

from reports.errors import ReportError
from reports.plan import assumptions as assumed
from reports.plan.assumptions import RANGES
from reports.plan.ops import CLASSES, STACKS, calibrate, price, roofs
from reports.plan.step import measured as op_seconds
from reports.plan.step import steady_step
from reports.plan.target import generation, on_target, table_notes, target

__all__ = ["measured_step", "fit", "leave_one_out", "pooled", "stack_step"]


def _reach(p, eff, c):
    """What the ops of class index `c` with a compute time reach together on `eff` (their roof time over their
    priced compute time), or None when the step has none."""
    pick = (p["klass"] == c) & (p["compute"] > 0) & p["kernel"]
    if not pick.any():
        return None
    seconds, _ = price(p, eff, 0.0)
    e = p["compute"][pick] / np.maximum(seconds[pick], 1e-300)
    return float(p["compute"][pick].sum() / (p["compute"][pick] / e).sum())


def fit(measured, gpu, assumptions=None):
    """({name: (value, source)} to plan with, [{name, old, new, source}]) fitted from `measured` (a loaded trace
    of one run, timed on `gpu`; or its reports.plan.rows.Runs, as `optrace plan --calibrate` reads them). A trace
    not measured on `gpu` (meta, fake, untimed, another device) is a ReportError naming where it ran."""
    if not isinstance(measured, list):
        from reports.loading.load import require
        from reports.plan.rows import frame_runs

        require(
            measured,
            ("run", "flop_kind", "flops", "duration_ns", "busy_ns", "op", "output_shapes"),
            "plan --calibrate",
        )
        measured = frame_runs(measured)
    name, p, measured_s, table, others = measured_step(measured, gpu, assumptions)
    a = {n: v for n, (v, _) in table.items()}
    eff = {c: a[f"{c}_efficiency"] for c in CLASSES} | {s: a[s] for s in STACKS.values()}
    before = {c: _reach(p, eff, i) for i, c in enumerate(("matmul", "attention"))}
    fitted, changes = {}, []
    where = f"run {name}" if name else "the measured trace"
    for key, (value, source) in calibrate(p, measured_s, eff).items():
        if source.startswith("assumed"):
            continue
        fitted[key] = (value, f"calibrated on {where}: {source}")
        changes.append({"name": key, "old": a[key], "new": value, "source": source})
        eff[key.removesuffix("_efficiency")] = value
    for i, c in enumerate(("matmul", "attention")):
        after = _reach(p, eff, i)
        if (
            before[c] is not None
            and after is not None
            and any(ch["name"] in (STACKS[i], f"{c}_efficiency") for ch in changes)
        ):
            changes.append(
                {
                    "name": f"{c} ops reach",
                    "old": before[c],
                    "new": after,
                    "source": f"the measured step's {c} ops together, as priced before and after",
                }
            )
    if others:
        changes.append(
            {"name": "note", "old": None, "new": None, "source": f"fitted on {where}, the first of its runs"}
        )
    return fitted, changes


def stack_step(stack, matmul_s, step_s, published_step_s):
    """One step of the matmul_stack fit of a published run: a plan at `stack` takes `step_s` a step, `matmul_s` of
    it matmul-bound; only that time scales with the stack, so the published step needs it at matmul_s + published
    - step and the stack at stack x matmul_s / that. Clamped to the assumption's range (reports.plan.assumptions
    RANGES); a published step the other terms already exceed gives the range's top."""
    low, high, _ = RANGES["matmul_stack"]
    needed = matmul_s + published_step_s - step_s
    return min(max(stack * matmul_s / needed, low), high) if needed > 0 else high


def _median(values):
    values = sorted(values)
    n = len(values)
    return (values[(n - 1) // 2] + values[n // 2]) / 2 if n else math.nan


def pooled(fits):
    """{generation: the median of its runs' fitted stacks} of `fits` ({run: {"generation", "source", "stack"}})."""
    out = {}
    for f in fits.values():
        out.setdefault(f["generation"], []).append(f["stack"])
    return {g: _median(v) for g, v in out.items()}


def leave_one_out(fits, by="generation", runs=None):
    """{run: (stack, how many fits it is the median of)} for each of `runs` ({run: {"generation", "source"}};
    default `fits`' own) from `fits` ({run: {"generation", "source", "stack"}}): the median of the fits of the
    other runs of its generation (by="generation") or of its generation's runs from other sources (by="source");
    nan where there are none. A run outside `fits` (one whose fit is not pooled) is left out by being absent."""
    if by not in ("generation", "source"):
        raise ValueError(f"leave_one_out: by must be 'generation' or 'source', got {by!r}")
    out = {}
    for name, f in (fits if runs is None else runs).items():
        others = [
            o["stack"]
            for other, o in fits.items()
            if other != name
            and o["generation"] == f["generation"]
            and (by == "generation" or o["source"] != f["source"])
        ]
        out[name] = (_median(others), len(others))
    return out


def measured_step(runs, gpu, assumptions=None):
    """For reports.plan.calibration: (run name, priced rows of the steady step of the first of `runs`
    (reports.plan.rows.Run) on `gpu` (reports.plan.ops.roofs, the tables' efficiencies dropped where
    `assumptions` gives the class's), their op times in seconds, the assumptions table, whether there are other
    runs). A run not timed on `gpu` is a ReportError naming where it ran."""
    run, *others = runs
    meta = run.meta
    entry, peak_of, bandwidth, _, _ = target(gpu, meta)
    if not on_target(entry, meta):
        device = meta.get("device") or {}
        how = "fake tensors" if device.get("fake") else f"{device.get('type')} {device.get('name') or ''}".strip()
        untimed = ", untimed" if (meta.get("timing") or {}).get("mode") == "off" else ""
        raise ReportError(
            f"plan: --calibrate needs a trace measured on {gpu} with op times; this one ran on {how}{untimed}"
        )
    rows, _ = steady_step(run.rows)
    p = roofs(rows, peak_of, bandwidth, 1.0, None, generation(entry))
    table = assumed.resolve(assumptions, generation(entry))
    table_notes(p, {n: s for n, (_, s) in table.items()}, entry)
    op_times = op_seconds(rows)
    if not (op_times > 0).any():
        raise ReportError(f"plan: --calibrate: the measured trace has no op times ({run.name})")
    return run.name, p, op_times, table, bool(others)
