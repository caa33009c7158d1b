"""The one place where totals become per-step figures.

A run's rows carry a `step` number. Every report that gives a figure per training
step asks this module how many steps a phase ran in and divides by it here, once:

  phase_steps(rows)   {phase: steps it has ops in}; each phase is averaged over its
                      own steps, so a trace cut mid-step (a forward without its
                      backward) does not halve the backward
  count_steps(rows)   the run's training steps: steps with forward or backward ops
  per_step(rows, ...) sum a column (or any values) per phase, divide each phase's
                      total by its steps, add the phases up: one figure per step,
                      or one per key with `by=`

Integer totals are summed before the one division, so a trace of k identical steps
gives exactly the figures of one step (k·a / k == a in floating point; summing
a/k row by row would not).
"""

import pandas as pd

from tracer.schema import PHASES

__all__ = ["count_steps", "per_step", "phase_steps"]

_FORWARD_BACKWARD = ("forward", "backward")


def phase_steps(rows):
    """{phase: number of distinct steps with ops of that phase} for one run's rows."""
    if not len(rows):
        return {}
    counts = rows.groupby(rows["phase"].astype(object), sort=False)["step"].nunique()
    return {phase: max(1, int(n)) for phase, n in counts.items()}


def count_steps(rows):
    """Training steps in one run's rows: steps with forward or backward ops (at least 1)."""
    if len(rows) == 0:
        return 1
    fb = rows.loc[rows["phase"].isin(_FORWARD_BACKWARD), "step"]
    return max(1, int(fb.nunique() if len(fb) else rows["step"].nunique()))


def _phase_order(phases):
    known = [p for p in PHASES if p in phases]
    return known + sorted(p for p in phases if p not in PHASES)


def per_step(rows, values="flops", mask=None, by=None):
    """Per-step figure(s) of `values` over one run's `rows`.

    values  a column name or a Series aligned with `rows`
    mask    a boolean Series aligned with `rows`: sum only these rows (the steps a
            phase ran in are still counted over all rows)
    by      None for one number, or a column name / Series aligned with `rows`: a
            Series with one figure per key (keys in order of first appearance)"""
    v = rows[values] if isinstance(values, str) else values
    phase = rows["phase"].astype(object)
    key = rows[by].astype(object) if isinstance(by, str) else (by.astype(object) if by is not None else None)
    if mask is not None:
        v, phase = v[mask], phase[mask]
        key = key[mask] if key is not None else None
    steps = phase_steps(rows)
    if key is None:
        totals = v.groupby(phase, sort=False).sum()
        return sum((totals[p] / steps[p] for p in _phase_order(list(totals.index))), 0.0)
    frame = pd.DataFrame({"key": key.to_numpy(), "phase": phase.to_numpy(), "v": v.to_numpy()})
    keys = pd.unique(frame["key"])
    out = pd.Series(0.0, index=pd.Index(keys, dtype=object))
    totals = frame.groupby(["phase", "key"], sort=False)["v"].sum()
    for p in _phase_order(list(pd.unique(frame["phase"]))):
        part = totals.loc[p]
        out = out.add(part / steps[p], fill_value=0.0)
    return out.reindex(keys)
