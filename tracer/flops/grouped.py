"""FLOPs that depend on tensor values, not only shapes: grouped matmuls and packed attention.

A mixture-of-experts layer multiplies each expert's tokens by that expert's weights in one
`_grouped_mm` call; packed (jagged, varlen) attention runs one attention per sequence in one
kernel call. How much work that is depends on integer tensors passed beside the operands:
the group offsets (`offs`) and the cumulative sequence lengths (`cum_seq_q`, `cum_seq_k`).
When these are concrete the count is exact and the sizes become the row's `group_sizes`;
on meta and fake tensors (and under CUDA graph capture) they cannot be read, and the count
is the upper bound the shapes prove, flagged `flops_bound` (tracer.schema).

Reading CUDA offsets copies a few integers to the host: one synchronisation per call.
"""

import torch

from tracer.device import is_fake
from tracer.flops.formulas import FlopCount, attention_backward_flop_count, attention_flop_count

__all__ = ["concrete_ints", "grouped_mm_count", "varlen_attention_count"]


def concrete_ints(t):
    """The values of a small integer tensor as a tuple, or None when they cannot be read without
    harm: meta and fake tensors, tensor subclasses, CUDA while a graph is being captured."""
    if type(t) is not torch.Tensor or t.device.type == "meta" or is_fake(t):
        return None
    if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None  # a copy to the host would break the capture
    try:
        values = t.tolist()  # no op is dispatched: modes below the tracer's see nothing
    except Exception:  # a device that cannot copy to the host: no values
        return None
    return tuple(int(v) for v in values) if isinstance(values, list) and t.dim() == 1 else None


def _sizes(ends):
    """Group sizes from cumulative ends [e_0, e_1, ...]: [e_0, e_1 - e_0, ...] (a negative step counts 0)."""
    sizes, start = [], 0
    for end in ends:
        sizes.append(max(end - start, 0))
        start = max(end, start)
    return tuple(sizes)


def grouped_mm_count(a, b, ends) -> FlopCount:
    """_grouped_mm / _scaled_grouped_mm: one [m, k] @ [k, n] matmul per group, 2 per multiply-add.

    `a`, `b` are the operands' shapes, `ends` the offsets' values (cumulative group ends) or
    None when they cannot be read. The grouped dimension of each case:

      [t, k] @ [e, k, n] -> [t, n]     rows of a (tokens) by expert: the MoE forward
      [e, m, k] @ [k, t] -> [m, t]     columns of b by group
      [k, t] @ [t, n] -> [e, k, n]     the contraction by group: the experts' weight gradient
      [e, m, k] @ [e, k, n]            no offsets: a batched matmul, exact

    NB: without readable offsets, every index of the grouped dimension counts once: an upper
    bound, exact when the offsets end at that dimension's size (MoE routing's cumulative
    token counts do), flagged a bound because the trace cannot tell. With offsets, indices
    past the last offset are not computed and not counted. The scaling of
    _scaled_grouped_mm is not counted (as _scaled_mm's)."""
    if len(a) == 3 and len(b) == 3:
        return FlopCount(2 * a[0] * a[1] * a[2] * b[2])
    if len(a) == 2 and len(b) == 3:
        per_index, size = 2 * a[1] * b[2], a[0]
    elif len(a) == 3:
        per_index, size = 2 * a[1] * a[2], b[1]
    else:
        per_index, size = 2 * a[0] * b[1], a[1]
    if ends is None:
        return FlopCount(per_index * size, bound=True)
    sizes = _sizes(ends)
    return FlopCount(per_index * sum(sizes), group_sizes=sizes)


def varlen_attention_count(q, k, v, sequences, cum_q, cum_k, max_q, max_k, backward=False) -> FlopCount:
    """Flash / efficient attention kernels on packed sequences (`sequences` of them).

    q [total_q, h, d] (or [1, total_q, h, d]) with cumulative lengths: each sequence is one
    attention of its own lengths, sum_i 2 * h * s_q_i * s_k_i * (d_qk + d_v) forward, 2.5x
    that backward (tracer.flops.attention.attention_backward_flop_count). `cum_q`, `cum_k` are the
    cumulative lengths' values, or None when they cannot be read: then every sequence counts
    at the maximum lengths, an upper bound flagged as such (FlopCounterMode counts this bound
    always). `group_sizes` records the query lengths.
    NB: a key length capped by `seqused_k` is not read; the full key length counts."""
    count = attention_backward_flop_count if backward else attention_flop_count
    h, d_qk, d_v = q[-2], q[-1], v[-1]
    if cum_q is None or cum_k is None:
        s_q = max_q if max_q is not None else q[-3]
        s_k = max_k if max_k is not None else k[-3]
        return FlopCount(count(sequences, h, s_q, s_k, d_qk, d_v), bound=True)
    lengths_q = tuple(b - a for a, b in zip(cum_q, cum_q[1:]))
    lengths_k = tuple(b - a for a, b in zip(cum_k, cum_k[1:]))
    flops = sum(count(1, h, s_q, s_k, d_qk, d_v) for s_q, s_k in zip(lengths_q, lengths_k))
    return FlopCount(flops, group_sizes=lengths_q)
