"""FLOPs that recompute work already done: model FLOPs leave them out, hardware FLOPs count them.

Two kinds, both per row (turn them into per-step figures with reports.steps.per_step):

  checkpoint  rows the tracer flagged `recompute`: forward work re-run in the backward
              by activation checkpointing (PaLM's MFU leaves rematerialisation out)
  attention   the part of a fused attention backward kernel that recomputes the
              scores q @ kᵀ (the kernel keeps no score matrix)
"""

import numpy as np

from reports.flops.rows import as_rows
from tracer.rules import score_share

__all__ = ["attention_recompute", "checkpoint_recompute"]


def checkpoint_recompute(rows):
    """Boolean array: the rows (reports.flops.rows.Rows, or a DataFrame) activation checkpointing re-ran (all False
    without a `recompute` column)."""
    return as_rows(rows, ("recompute",)).flag("recompute")


def attention_recompute(rows):
    """Int64 array: per row (of reports.flops.rows.Rows, or a DataFrame), FLOPs a fused attention backward kernel spends recomputing q @ kᵀ.

    The tracer counts such a backward as 2·b·h·s_q·s_k·(3·d_qk + 2·d_v): five
    score-sized matmuls where four are needed (dP = dO @ vᵀ, dV = Pᵀ @ dO, dQ = dS @ k,
    dK = dSᵀ @ q); the fifth, 2·b·h·s_q·s_k·d_qk, recomputes q @ kᵀ. Every backward
    kernel takes (grad_out, q, k, v, ...), all with the head dimension last. Rows
    flagged `recompute` are left at 0: checkpoint_recompute already counts all of them."""
    rows = as_rows(rows, ("flop_kind", "phase", "recompute", "flops", "input_shapes"))
    out = np.zeros(len(rows), dtype=np.int64)
    bwd = rows.labels("flop_kind").eq("attention") & rows.labels("phase").eq("backward")
    bwd &= ~checkpoint_recompute(rows)
    if not bwd.any():
        return out
    at = np.flatnonzero(bwd)
    shapes = rows.cells("input_shapes", at) if "input_shapes" in rows else [None] * len(at)
    out[at] = [
        score_share(int(f), s) for f, s in zip(rows["flops"][at].tolist(), shapes)
    ]  # tracer.rules, shared with the meter
    return out
