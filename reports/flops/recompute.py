"""FLOPs that recompute work already done: model FLOPs leave them out, hardware FLOPs count them.

Two kinds, both per row (turn them into per-step figures with reports.steps.per_step):

  checkpoint  rows the tracer flagged `recompute`: forward work re-run in the backward
              by activation checkpointing (PaLM's MFU leaves rematerialisation out)
  attention   the part of a fused attention backward kernel that recomputes the
              scores q @ kᵀ (the kernel keeps no score matrix)
"""

import numpy as np
import pandas as pd

from reports.loading.columns import cell_objects, has_column
from tracer.rules import score_share

__all__ = ["attention_recompute", "checkpoint_recompute"]


def checkpoint_recompute(rows):
    """Boolean Series: the rows activation checkpointing re-ran (all False without a `recompute` column)."""
    if "recompute" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["recompute"].astype("boolean").fillna(False).astype(bool)


def attention_recompute(rows):
    """Int64 Series: per row, FLOPs a fused attention backward kernel spends recomputing q @ kᵀ.

    The tracer counts such a backward as 2·b·h·s_q·s_k·(3·d_qk + 2·d_v): five
    score-sized matmuls where four are needed (dP = dO @ vᵀ, dV = Pᵀ @ dO, dQ = dS @ k,
    dK = dSᵀ @ q); the fifth, 2·b·h·s_q·s_k·d_qk, recomputes q @ kᵀ. Every backward
    kernel takes (grad_out, q, k, v, ...), all with the head dimension last. Rows
    flagged `recompute` are left at 0: checkpoint_recompute already counts all of them."""
    out = pd.Series(0, index=rows.index, dtype="int64")
    bwd = (rows["flop_kind"] == "attention") & (rows["phase"] == "backward")
    bwd &= ~checkpoint_recompute(rows)
    if not bwd.any():
        return out
    at = np.flatnonzero(bwd.to_numpy())
    shapes = cell_objects(rows, "input_shapes", at) if has_column(rows, "input_shapes") else [None] * len(at)
    out[bwd] = [score_share(int(f), s) for f, s in zip(rows.loc[bwd, "flops"], shapes)]  # tracer/rules.py, shared with the meter
    return out
