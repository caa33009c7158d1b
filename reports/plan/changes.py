"""What would make a plan that does not fit fit: the changes the memory model (reports.plan.fit) can price.

With the per-op bytes of reports.plan.fit (fixed_op, scaled_op at the traced micro-batch) and the
allowances, a rank needs

  required(k) = (1 + fragmentation) x max over ops of (fixed_op + k x scaled_op) + context + NCCL

and each change moves one term:

  micro_batch               k = b / traced batch: the largest b that fits (fit's max_micro_batch), exact
                            under the model's linear extrapolation of the activation bytes
  world_size                FSDP's shards (parameters, gradients, optimizer state: `sharded_op`) are
                            1 / world size of the model's; over W ranks instead of w they are w / W of
                            the traced ones, so W is the least with, at every op,
                            sharded_op x (1 - w / W) >= the op's bytes over the budget. An estimate:
                            collectives and their buffers change with W, and FSDP pads a shard to
                            ceil(rows / W) rows (64 rows over 9 ranks: 8 rows, as over 8), which a
                            re-trace at W prices: it matters when a rank holds few rows.
                            Only a trace whose parameters are sharded (it holds unsharded_parameters)
                            gets one; replicated parameters do not shrink with more GPUs
  activation_checkpointing  a bound, not a figure: checkpointing keeps some activations (each
                            block's input, one block's recomputed ones), which only a re-trace with
                            it shows. Without any activation (activations_op = 0) a rank needs at
                            least required with scaled_op - activations_op; above the memory,
                            checkpointing cannot fit ("fits": False); else it may ("fits": None).
                            A trace that recomputes (checkpoint_recompute) has it already

Each change is {change, value, fits (True, False, or None: may), required_bytes, how}; the smallest
is the first that fits in the order above (a smaller micro-batch changes neither the code nor the
hardware; more GPUs change the hardware), else None.
"""

import math
from typing import NamedTuple

import numpy as np

__all__ = ["Need", "changes", "smallest"]


class Need(NamedTuple):
    """A rank's bytes per op and what it has to fit them (reports.plan.fit)."""

    fixed: np.ndarray
    scaled: np.ndarray
    parts: dict  # activations, sharded (int64 per op), fsdp, checkpointed (bool): reports.plan.fit._split
    k: float  # the planned micro-batch over the traced one
    frag: float
    allowances: float  # CUDA context and NCCL buffers, bytes
    memory: float

    def required(self, fixed, scaled):
        return (1 + self.frag) * float(np.max(fixed + scaled)) + self.allowances


def _micro_batch(need, batch, planned, max_micro_batch):
    if not batch:
        return {"change": "micro_batch", "value": None, "fits": None, "required_bytes": None,
                "how": "unknown: the traced micro-batch is not in the trace (--batch gives it)"}  # fmt: skip
    value = max_micro_batch if max_micro_batch and max_micro_batch < planned else 1
    required = need.required(need.fixed, value / batch * need.scaled.astype(np.float64))
    how = "the largest that fits" if required <= need.memory else "the least, and it does not fit"
    return {"change": "micro_batch", "value": value, "fits": required <= need.memory, "required_bytes": required,
            "how": how}  # fmt: skip


def _world_size(need, world):
    if world <= 1 or not need.parts["fsdp"]:
        how = "the parameters are not sharded in the trace: more ranks do not shrink one (FSDP needs a trace of it)"
        return {"change": "world_size", "value": None, "fits": None if world <= 1 else False,
                "required_bytes": None, "how": how}  # fmt: skip
    budget = (need.memory - need.allowances) / (1 + need.frag)
    live = need.fixed + need.k * need.scaled.astype(np.float64)
    sharded = need.parts["sharded"].astype(np.float64)
    over = live > budget
    floor = need.required(need.fixed - sharded, need.k * need.scaled.astype(np.float64))
    if (sharded[over] <= live[over] - budget).any():
        how = "does not fit over any number of ranks: what is not sharded needs more than the memory"
        return {"change": "world_size", "value": None, "fits": False, "required_bytes": floor, "how": how}
    value = max(world + 1, math.ceil(float(np.max(world * sharded[over] / (sharded[over] - live[over] + budget)))))

    def required(w):
        return need.required(need.fixed - sharded * (1 - world / w), need.k * need.scaled.astype(np.float64))

    while required(value) > need.memory:  # the rounding of the division
        value += 1
    how = "an estimate: parameters, gradients and optimizer state sharded over it; a re-trace at it confirms"
    return {"change": "world_size", "value": value, "fits": True, "required_bytes": required(value), "how": how}


def _checkpointing(need):
    if need.parts["checkpointed"]:
        how = "already in the trace (it recomputes ops in the backward)"
        return {"change": "activation_checkpointing", "value": None, "fits": False, "required_bytes": None,
                "how": how}  # fmt: skip
    kept = need.k * (need.scaled - need.parts["activations"]).astype(np.float64)
    least = need.required(need.fixed, kept)
    if least > need.memory:
        how = "cannot fit: without any saved activation a rank still needs more than the memory"
        return {"change": "activation_checkpointing", "value": None, "fits": False, "required_bytes": least,
                "how": how}  # fmt: skip
    how = "may fit: a rank needs at least this without saved activations; a re-trace with it tells"
    return {"change": "activation_checkpointing", "value": None, "fits": None, "required_bytes": least, "how": how}


def changes(need, batch, planned, max_micro_batch, world):
    """The changes of the module docstring, in its order, for a plan that does not fit."""
    return [_micro_batch(need, batch, planned, max_micro_batch), _world_size(need, world), _checkpointing(need)]


def smallest(found):
    """The first change of `found` that fits, else None."""
    return next((c for c in found if c["fits"] is True), None)
