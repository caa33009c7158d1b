"""Counting rules shared by the reports (reports/flops/) and the tracer's run-time meter (tracer.metering.meter).

Written once here so that the two cannot drift: pure Python and numpy, no torch, pandas or pyarrow.

  ADD_FIRST         ops whose first tensor input is added to the product, not multiplied
                    (bias + a @ b): a matmul row's multiplied operands start after it
  PACKED_WEIGHT     matmuls whose second operand is a weight by definition (packed int8 or int4 weights
                    of weight-only and dynamic quantization): a weight even when it is no parameter
  DTYPE_KINDS       the flop kinds whose FLOPs decide a run's dtype (the peak MFU is measured against)
  dtype_rows        which rows decide it: matmul and attention rows with FLOPs, else any row with FLOPs
                    (a conv net's dtype comes from its convolutions)
  carrying_dtype    the dtype carrying most FLOPs of those rows; the first seen wins a tie
  score_share       what a fused attention backward kernel spends recomputing the scores q @ kᵀ
"""

import numpy as np

__all__ = ["ADD_FIRST", "DTYPE_KINDS", "PACKED_WEIGHT", "carrying_dtype", "dtype_rows", "score_share", "skipped_input"]

ADD_FIRST = frozenset(
    "aten.addmm aten.addmm_ aten._addmm_activation aten.addmv aten.addmv_ aten.addr aten.addr_ "
    "aten.baddbmm aten.baddbmm_ aten.addbmm aten.addbmm_".split()
)
PACKED_WEIGHT = frozenset(
    "aten._weight_int8pack_mm aten._weight_int4pack_mm aten._weight_int4pack_mm_for_cpu "
    "aten._weight_int4pack_mm_with_scales_and_zeros aten._dyn_quant_matmul_4bit".split()
)
DTYPE_KINDS = ("matmul", "attention")


def skipped_input(op, count):
    """Index of the first multiplied input of a row of op `op` ('aten.addmm.default') with `count` tensor
    inputs: 1 for addmm's bias when it has one, else 0."""
    return 1 if ".".join(op.split(".")[:2]) in ADD_FIRST and count > 1 else 0


def dtype_rows(is_kind, flops):
    """Boolean array: the rows whose dtype decides the run's. `is_kind`: the rows of a DTYPE_KINDS kind."""
    flops = np.asarray(flops)
    pick = np.asarray(is_kind, dtype=bool) & (flops > 0)
    return pick if pick.any() else flops > 0


def carrying_dtype(names, flops):
    """The name among `names` (one per row) whose rows carry most `flops`; the first seen wins a tie; None if empty.
    Sums in float64: an int64 sum of a 405B model's FLOPs wraps."""
    names = np.asarray(names, dtype=object)
    flops = np.asarray(flops, dtype=np.float64)
    best, most = None, -1.0
    for name in dict.fromkeys(names.tolist()):  # first-seen order
        total = float(flops[names == name].sum())
        if total > most:
            best, most = name, total
    return None if best is None else str(best)


def score_share(flops, shapes):
    """FLOPs of one fused attention backward row that recompute the scores.

    The tracer counts such a backward as 2·b·h·s_q·s_k·(3·d_qk + 2·d_v): five score-sized
    matmuls where four are needed; the fifth, 2·b·h·s_q·s_k·d_qk, recomputes q @ kᵀ. Every
    backward kernel takes (grad_out, q, k, v, ...), all with the head dimension last."""
    try:
        d_qk, d_v = int(shapes[1][-1]), int(shapes[3][-1])
        return flops * d_qk // (3 * d_qk + 2 * d_v)
    except (TypeError, IndexError, ValueError, ZeroDivisionError):
        return flops // 5  # d_qk == d_v: one of five score-sized matmuls
