"""Which forward rows of a run are an evaluation: forward work with grad mode off (the grad_mode column, v4 on), which
autograd records nothing of and no backward reads (reports.flops.roles.Roles.evaluation; explain names it).
"""

import numpy as np

from tracer.schema import GRAD_MODES, GradMode

__all__ = ["NO_GRAD_MODES", "evaluation_rows"]

# the grad modes of a forward no backward can read: an evaluation
NO_GRAD_MODES = (GRAD_MODES[GradMode.NO_GRAD], GRAD_MODES[GradMode.INFERENCE_MODE])


def evaluation_rows(rows, param=None):
    """Boolean array, per row of `rows` (reports.flops.rows.Rows): forward work run with grad mode off (the grad_mode column: no_grad or inference_mode), which autograd
    records nothing of: an evaluation. False where the trace does not say (before v4, or a row summed without it).

    Reentrant activation checkpointing runs its forward under no_grad too, and re-runs it in the backward (rows
    flagged recompute): in a step that re-ran checkpointed work, a forward row without grad is training's when a
    re-run row multiplies by the same weight (`param`: per row, the weight it multiplies, -1 none), and every such
    row that multiplies no weight is. NB: so an evaluation in a checkpointed step counts as training."""
    if "grad_mode" not in rows:
        return np.zeros(len(rows), dtype=bool)
    off = rows.labels("phase").eq("forward") & rows.labels("grad_mode").isin(NO_GRAD_MODES)
    again = rows.flag("recompute")
    if off.any() and again.any():
        step = rows["step"]
        weight = param if param is not None else np.full(len(rows), -1, dtype=np.int64)
        rerun_steps = np.isin(step, step[again])
        keys = step << 32 | (weight & 0xFFFFFFFF)
        rerun_weights = np.isin(keys, keys[again & (weight >= 0)])
        off = off & ~(rerun_steps & ((weight < 0) | rerun_weights))
    return off
