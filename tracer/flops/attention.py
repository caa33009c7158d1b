"""FLOP formulas of fused attention kernels, forward and backward: scaled-dot-product attention on
[b, h, s, d] tensors, the flash and memory-efficient kernels on [b, s, h, d] ones (tracer.flops.formulas: the
conventions; tracer.flops.grouped: packed sequences counted per sequence)."""

from tracer.flops.registry import _packets, register_flop_formula


def attention_flop_count(b, h, s_q, s_k, d_qk, d_v) -> int:
    """Attention forward: scores = q @ k^T, then out = scores @ v."""
    # [b, h, s_q, d_qk] @ [b, h, d_qk, s_k] -> [b, h, s_q, s_k] @ [b, h, s_k, d_v] -> [b, h, s_q, d_v]
    # NB: the full score matrix counts even when causal, as in PaLM, nanoGPT and FlopCounterMode.
    # NB: GQA: h counts query heads; key/value heads are broadcast to them.
    # NB: the softmax, scaling and masking inside the kernel are not counted.
    return 2 * b * h * s_q * s_k * (d_qk + d_v)


def attention_backward_flop_count(b, h, s_q, s_k, d_qk, d_v) -> int:
    """Attention backward: 5 matmuls of the score size against 2 forward, 2.5x when d_qk == d_v.

    Fused kernels keep no score matrix, so the backward recomputes scores = q @ k^T, then
    computes dP = dO @ v^T, dV = P^T @ dO, dQ = dS @ k and dK = dS^T @ q.
    """
    return 2 * b * h * s_q * s_k * (3 * d_qk + 2 * d_v)


def _bhsd(q, k, v):
    """(b, h, s_q, s_k, d_qk, d_v) of [b, h, s, d] query, key and value shapes."""
    return q[0], q[1], q[2], k[2], q[3], v[3]


def _bshd(q, k, v, cum_seq_q, max_q, max_k):
    """(b, h, s_q, s_k, d_qk, d_v) of [b, s, h, d] shapes, or of packed varlen ones."""
    if cum_seq_q is None:
        return q[0], q[2], q[1], k[1], q[3], v[3]
    # NB: from shapes alone, packed sequences ([total, h, d] or [1, total, h, d]) all count at
    # the maximum length, an upper bound (FlopCounterMode always does this). The tracer counts
    # each sequence at its length when the offsets can be read (tracer.flops.grouped).
    s_q, s_k = (max_q if max_q is not None else q[-3]), (max_k if max_k is not None else k[-3])
    return cum_seq_q[0] - 1, q[-2], s_q, s_k, q[-1], v[-1]


@register_flop_formula(
    _packets(
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
    ),
    kind="attention",
)
def sdpa_flop(q, k, v, *args, out_shape=None, **kwargs) -> int:
    """Fused scaled-dot-product attention forward on [b, h, s, d] tensors."""
    return attention_flop_count(*_bhsd(q, k, v))


@register_flop_formula(
    _packets(
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    ),
    kind="attention",
)
def sdpa_backward_flop(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    """Fused attention backward on [b, h, s, d] tensors: 2.5x forward, as scores are recomputed."""
    return attention_backward_flop_count(*_bhsd(q, k, v))


# NB: the four kernels below take [b, s, h, d] tensors. FlopCounterMode (torch 2.13) reads
# them as [b, h, s, d], swapping heads and sequence length (pytorch/pytorch#178064); on
# dense inputs we follow the kernels, and differ from it.


@register_flop_formula(_packets("_flash_attention_forward"), kind="attention")
def flash_attention_flop(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, *args, out_shape=None, **kwargs) -> int:
    """Flash attention kernel forward."""
    return attention_flop_count(*_bshd(q, k, v, cum_seq_q, max_q, max_k))


@register_flop_formula(_packets("_flash_attention_backward"), kind="attention")
def flash_attention_backward_flop(
    grad_out, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, *args, out_shape=None, **kwargs
) -> int:
    """Flash attention kernel backward: 2.5x forward, as scores are recomputed."""
    return attention_backward_flop_count(*_bshd(q, k, v, cum_seq_q, max_q, max_k))


@register_flop_formula(_packets("_efficient_attention_forward"), kind="attention")
def efficient_attention_flop(
    q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_q, max_k, *args, out_shape=None, **kwargs
) -> int:
    """Memory-efficient attention kernel forward."""
    return attention_flop_count(*_bshd(q, k, v, cu_seqlens_q, max_q, max_k))


@register_flop_formula(_packets("_efficient_attention_backward"), kind="attention")
def efficient_attention_backward_flop(
    grad_out, q, k, v, bias, out, cu_seqlens_q, cu_seqlens_k, max_q, max_k, *args, out_shape=None, **kwargs
) -> int:
    """Memory-efficient attention kernel backward: 2.5x forward, as scores are recomputed."""
    return attention_backward_flop_count(*_bshd(q, k, v, cu_seqlens_q, max_q, max_k))
