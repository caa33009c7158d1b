"""The step a plan prices, read from a run's rows (reports.plan.rows.PlanRows): which rows, and what they hold
besides the ops' prices.

    steady_step        the last complete training step of a trace of several (the first holds one-off work)
    training_steps     the steps with forward or backward ops
    measured           each row's traced op time; traced_step the traced step time a calibrated plan is judged by
    causal_masked      the half of causal attention's model FLOPs its kernels skip
    flop_bounds        the FLOPs per step that are upper bounds (the flops_bound column)
    groups_used        the process groups with a collective in the trace
    tensor_parallel    the trace's tensor-parallel degree, with its note
"""

import numpy as np

from reports.flops.coverage import bounded
from reports.flops.recompute import attention_recompute, checkpoint_recompute
from reports.flops.rows import per_step
from reports.plan.comm import tensor_parallel as _tensor_parallel

__all__ = [
    "causal_masked",
    "flop_bounds",
    "groups_used",
    "measured",
    "steady_step",
    "tensor_parallel",
    "traced_step",
    "training_steps",
]

_TRAINING = ("forward", "backward")


def causal_masked(rows):
    """Per step, the half of causal attention's model FLOPs that its kernels skip (reports.plan.plan's docstring)."""
    phase = rows.objects("phase")
    causal = (rows.objects("flop_kind") == "attention") & rows.flag("causal")
    causal &= np.isin(phase, _TRAINING) & ~checkpoint_recompute(rows)
    if not causal.any():
        return 0.0
    model = rows.floats("flops") - attention_recompute(rows)
    return float(per_step(rows, values=np.where(causal, model, 0.0))) / 2


def steady_step(rows):
    """(rows to price, note or None): of a trace of several training steps, the last complete one (forward,
    backward and optimizer rows, when the trace has any), without the first step's one-off work (AdamW's
    zeros_like making its state; under FakeTensorMode the lift_fresh of its scalars); else every row. The plan's
    batch is read from the first step's forward (reports.plan.fit.traced_batch): a last step whose forward FLOPs
    differ from the first's (a DataLoader's partial last batch) is passed over for the last complete one whose forward
    FLOPs are the first's, and where none is, the note says that the step priced is unlike the first. Forward FLOPs
    only: a backward's may differ at the same batch (gradients accumulated into those a step before left, as
    zero_grad(set_to_none=False) or a GAN's generator step leave them, add one FLOP per element from the second step)."""
    step = rows.ints("step")
    phase = rows.objects("phase")
    seen = {}
    for s in np.unique(step).tolist():
        seen[s] = {str(p) for p in np.unique(phase[step == s].astype(str))}
    training = [s for s, phases in seen.items() if phases & set(_TRAINING)]
    if len(training) < 2:
        return rows, None
    need = set(_TRAINING) | ({"optimizer"} & set().union(*seen.values()))
    complete = [s for s in training if need <= seen[s]]
    if not complete:
        return rows, None
    last = max(complete)
    flops = np.where(phase.astype(str) == "forward", rows.floats("flops"), 0.0)
    ids, at = np.unique(step, return_inverse=True)
    sums = dict(zip(ids.tolist(), np.bincount(at, weights=flops, minlength=len(ids)).tolist()))
    work = {s: sums[s] for s in (training[0], *complete)}  # forward FLOPs of each step
    like = [s for s in complete if s != training[0] and work[s] == work[training[0]]]
    unlike = ""
    if work[last] != work[training[0]]:
        if like:
            unlike = (
                f" with the first step's forward FLOPs ({work[training[0]]:,.0f}), whose batch the plan "
                f"reads; step {last} has {work[last]:,.0f}: a partial last batch or another length"
            )
            last = max(like)
        else:
            unlike = (
                f"; its forward FLOPs ({work[last]:,.0f}) are not the first step's "
                f"({work[training[0]]:,.0f}), whose batch the plan reads: the steps ran other batches or lengths, "
                "which the plan does not follow"
            )
    return rows.take(step == last), (
        f"step time, FLOPs and MFU are those of step {last}, the last complete one of the {len(training)} traced "
        f"(the first holds one-off work, such as an optimizer making its state){unlike}; the memory peak is over "
        "every step"
    )


def tensor_parallel(rows, tokens, notes):
    """The tensor-parallel degree of the trace (reports.plan.comm.tensor_parallel), noted when above 1: the
    ranks of a tensor-parallel group share their tokens, so each GPU's tokens/s is the rank's over the degree."""
    degree, group = _tensor_parallel(rows, tokens)
    if degree > 1:
        notes.append(
            f"tensor parallelism of degree {degree} (process group {group or 'unnamed'} all-reduces or "
            f"reduce-scatters activations in the forward): its {degree} ranks read the same tokens, so tokens/s "
            f"per GPU is the trace's tokens over {degree}"
        )
    return degree


def groups_used(rows):
    """Process groups with a collective in the trace (by the rows' process_group; 1 when collectives name
    none): NCCL makes its buffers for a group at its first collective, not for every group made."""
    comm = rows.valid("comm_bytes")
    if not comm.any():
        return 0
    names = {str(g) for g in rows.objects("process_group")[comm] if g is not None}
    return max(1, len(names))


def measured(rows):
    """Per row, the traced op time in seconds (busy_ns where recorded, else duration_ns)."""
    busy = rows.floats("busy_ns")
    return np.where(np.isnan(busy), rows.floats("duration_ns"), busy) / 1e9


def training_steps(rows, steps):
    """The steps with forward or backward ops (all steps when none has)."""
    fb = set(rows.ints("step")[np.isin(rows.objects("phase"), _TRAINING)].tolist())
    return [s for s in steps if s in fb] or list(steps)


def traced_step(rows, meta):
    """(the traced step time in seconds, how it was found): the untraced median step time when recorded, else the
    sum of the traced op times per step."""
    median = (meta.get("step_time") or {}).get("median_s")
    if median:
        return float(median), "the untraced median step time"
    return float(per_step(rows, values=measured(rows))), "the traced op times per step"


def flop_bounds(rows):
    """{"flops": per-step FLOPs of the rows whose count is an upper bound (the flops_bound column), "rows": how many
    rows} (reports.flops.coverage.bounds of the rows); zeros for a trace without the column."""
    return bounded(rows, rows.flag("flops_bound"))
