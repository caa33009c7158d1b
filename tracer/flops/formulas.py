"""Analytic FLOP counts for aten ops: the registry of formulas, and the counting conventions.

FLOPs count 2 per multiply-add (an [m, k] @ [k, n] matmul is 2*m*k*n), as PaLM and
`torch.utils.flop_counter` do; MAC-counting tools (fvcore, thop, ptflops) report half.

`tracer.flops.op_kinds.flop_rule(func)` gives one OpOverload a `FlopRule`: a kind from
`schema.FLOP_KINDS` and a fast `count(args, kwargs, out)` on the real tensors. It looks,
in order, at:

1. the registry, formulas of shapes filled by `register_flop_formula`: matmuls,
   convolutions, attention, softmax, norms. They equal `FlopCounterMode` on every op it
   counts, except the flash/efficient attention kernels it reads in the wrong layout.
2. a classification of every other op, by name table, schema and tags:
   - "elementwise": one FLOP per output element, whatever the function (gelu and exp count
     1, like add); an in-place op writes, and counts, its input. An in-place packet without
     the pointwise tag (`masked_fill_`, `gt_`, `gelu_`, `abs_`) takes its out-of-place twin's.
   - "foreach": `_foreach_*` and `_fused_adam(w)_`-style optimizer ops, one FLOP per element
     of the first tensor list. NB: `_foreach_addcmul_` and `_foreach_lerp_` count 1 per
     element, as `addcmul_` does as "elementwise"; a fused Adam step counts 1, not ~15.
   - "reduction": one FLOP per input element (sum, mean, amax, norm, cumsum, losses); a pool one per
     input element each window reads (tracer.flops.pool).
   - "none": views, copies, fills, factories, random draws: 0 FLOPs.
   - "unknown": anything else, counted as 0. `flop_rule` never raises.

Ops whose FLOPs depend on tensor values, not only shapes, have rules of their own in
`tracer.flops.op_kinds` that count a `FlopCount` (FLOPs, whether they are a bound, group sizes):
the grouped matmuls of mixture-of-experts layers (`_grouped_mm`, `_scaled_grouped_mm`) and
the flash / efficient attention kernels on packed sequences (tracer.flops.grouped).

`matmul`, `linear`, `einsum`, `softmax` and other CompositeImplicitAutograd ops decompose
into mm/bmm/addmm/_softmax before dispatch, which are counted. Under `torch.inference_mode()`
they reach the dispatch mode whole and run whole (the tracer never decomposes an op: that
could change what runs); `tracer.flops.composite` counts them as what they decompose
into, so the same forward counts the same FLOPs either way. A composite without a formula
counts 0 with kind "unknown".
"""

from collections.abc import Callable
from math import prod
from typing import NamedTuple

import torch

from tracer.errors import TraceError
from tracer.schema import FLOP_KINDS

__all__ = ["FlopCount", "register_flop_formula", "has_formula"]


class FlopCount(NamedTuple):
    """What a detailed rule counts (tracer.flops.grouped, nested tensors): FLOPs, whether they
    are an upper bound rather than a count (schema column flops_bound), and the group sizes
    (column group_sizes: rows per group of a grouped matmul, lengths per sequence), or None."""

    flops: int
    bound: bool = False
    group_sizes: tuple | None = None


aten = torch.ops.aten
_registry: dict[torch._ops.OpOverloadPacket, tuple[Callable[..., int], str]] = {}


def register_flop_formula(targets, kind: str = "matmul"):
    """Decorator: register fn as the FLOP formula of one op packet or a list of them.

    fn(*args, out_shape=None, **kwargs) -> int gets every tensor replaced by its shape (a
    tuple of ints; lists of tensors become lists of shapes) and out_shape, the output's
    shape (a tuple of shapes for multi-output ops), as in torch.utils.flop_counter.
    Targets are OpOverloadPackets (`torch.ops.aten.mm`, `torch.ops.mylib.foo`) and the
    formula covers every overload; an OpOverload (`aten.mm.default`) is refused, not
    widened silently. Register before tracing: the tracer caches rules per overload.
    """
    if kind not in FLOP_KINDS:
        raise TraceError(f"register_flop_formula: kind {kind!r} is not one of {', '.join(FLOP_KINDS)}")
    packets = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    for target in packets:
        if isinstance(target, torch._ops.OpOverload):
            raise TraceError(
                f"register_flop_formula: got the OpOverload {target}; pass its packet "
                f"{target.overloadpacket}, whose formula covers every overload"
            )
        if not isinstance(target, torch._ops.OpOverloadPacket):
            raise TraceError(
                "register_flop_formula: expected an OpOverloadPacket such as "
                f"torch.ops.aten.mm, got {target!r} of type {type(target).__name__}"
            )

    def decorator(fn):
        for target in packets:
            if target in _registry:
                raise TraceError(
                    f"register_flop_formula: {target._qualified_op_name} already has "
                    f"a FLOP formula ({getattr(_registry[target][0], '__name__', '?')})"
                )
        _registry.update((target, (fn, kind)) for target in packets)
        return fn

    return decorator


def _packets(*names) -> list:
    """The aten packets of these names that this torch has (older versions lack a few)."""
    return [getattr(aten, name) for name in names if hasattr(aten, name)]


# ---------------------------------------------------------------- matmul


@register_flop_formula(_packets("mm", "_int_mm", "_scaled_mm", "_sparse_mm"))
def mm_flop(a, b, *args, out_shape=None, **kwargs) -> int:
    """Matrix product."""
    # [m, k] @ [k, n] -> [m, n]
    # NB: 2k FLOPs per output element, not 2k - 1. _scaled_mm's scaling is not counted.
    return 2 * a[0] * a[1] * b[1]


@register_flop_formula(_packets("addmm", "addmm_", "_sparse_addmm", "_addmm_activation"))
def addmm_flop(bias, a, b, *args, out_shape=None, **kwargs) -> int:
    """bias + a @ b: the matmul only."""
    # [m, n] + [m, k] @ [k, n] -> [m, n]
    # NB: the m*n bias adds are not counted (nor by FlopCounterMode); nor is _addmm_activation's
    # relu or gelu of each output element (the same bias + a @ b, then the activation, in one kernel).
    return mm_flop(a, b)


@register_flop_formula(
    _packets(
        "_scaled_mm_v2",
        "_weight_int8pack_mm",
        "_weight_int4pack_mm",
        "_weight_int4pack_mm_for_cpu",
        "_weight_int4pack_mm_with_scales_and_zeros",
        "_dyn_quant_matmul_4bit",
    )
)
def input_times_weight_flop(a, *args, out_shape=None, **kwargs) -> int:
    """A matmul of an input [m, k] and a weight in a layout of its own: FP8 (_scaled_mm_v2) or packed int8 and
    int4 weights (weight-only and dynamic quantization); its output is [m, n]."""
    # [m, k] x (a weight of k * n values) -> [m, n]: 2 * m * k * n
    # NB: read from the input's and the output's shapes: a packed weight's shape is not [k, n]
    # (int4: [n / 8, k / (inner_k_tiles * 16), 32, inner_k_tiles / 2] on CUDA, [n, k / 2] on CPU),
    # and _scaled_mm_v2 may take the input transposed (contraction_dim). Dequantizing and scaling
    # are not counted, as for _scaled_mm.
    return 2 * prod(a) * out_shape[-1]


@register_flop_formula(_packets("bmm"))
def bmm_flop(a, b, *args, out_shape=None, **kwargs) -> int:
    """Batched matrix product."""
    # [b, m, k] @ [b, k, n] -> [b, m, n]
    return 2 * a[0] * a[1] * a[2] * b[2]


@register_flop_formula(_packets("baddbmm", "baddbmm_", "addbmm", "addbmm_"))
def baddbmm_flop(bias, a, b, *args, out_shape=None, **kwargs) -> int:
    """bias + a @ b, batched (baddbmm) or summed over the batch (addbmm): the matmuls only."""
    # [b, m, n] + [b, m, k] @ [b, k, n] -> [b, m, n]; addbmm: [m, n] + sum_b(...) -> [m, n]
    # NB: addbmm's sum over the batch is folded into the 2k convention; bias adds not counted.
    return bmm_flop(a, b)


@register_flop_formula(_packets("mv"))
def mv_flop(a, x, *args, out_shape=None, **kwargs) -> int:
    """Matrix-vector product."""
    # [m, n] @ [n] -> [m]
    return 2 * a[0] * a[1]


@register_flop_formula(_packets("addmv", "addmv_"))
def addmv_flop(bias, a, x, *args, out_shape=None, **kwargs) -> int:
    """bias + a @ x: the matrix-vector product only."""
    # [m] + [m, n] @ [n] -> [m]
    return mv_flop(a, x)


@register_flop_formula(_packets("dot", "vdot"))
def dot_flop(a, b, *args, out_shape=None, **kwargs) -> int:
    """Inner product of two vectors."""
    # [n] . [n] -> []
    return 2 * a[0]


@register_flop_formula(_packets("addr", "addr_"))
def addr_flop(bias, x, y, *args, out_shape=None, **kwargs) -> int:
    """bias + outer(x, y): a rank-1 update, one multiply-add per output element."""
    # [m, n] + [m] x [n] -> [m, n]
    # NB: outer() alone decomposes to mul, which counts m*n as "elementwise".
    return 2 * x[0] * y[0]


# ---------------------------------------------------------------- convolution


def conv_flop_count(x, w, out, transposed: bool = False) -> int:
    """One convolution: each weight tap meets each output (transposed: input) position."""
    # x [n, c_in, *spatial] * w [c_out, c_in / groups, *kernel] -> out [n, c_out, *spatial']
    # NB: taps over padding count; the bias is not counted.
    return 2 * x[0] * prod((x if transposed else out)[2:]) * prod(w)


@register_flop_formula(_packets("convolution", "_convolution", "convolution_overrideable"), kind="conv")
def conv_flop(x, w, bias, stride, padding, dilation, transposed, *args, out_shape=None, **kwargs) -> int:
    """Convolution forward, any dimension, transposed or not."""
    return conv_flop_count(x, w, out_shape, transposed)


@register_flop_formula(_packets("cudnn_convolution", "_slow_conv2d_forward", "mkldnn_convolution"), kind="conv")
def conv_kernel_flop(x, w, *args, out_shape=None, **kwargs) -> int:
    """Backend convolution kernels, whose schemas have no `transposed` argument."""
    # NB: FlopCounterMode reads cudnn_convolution's 7th argument (`deterministic`) as
    # `transposed`, and raises TypeError on _slow_conv2d_forward (6 arguments).
    return conv_flop_count(x, w, out_shape)


@register_flop_formula(_packets("convolution_backward"), kind="conv")
def conv_backward_flop(
    grad_out,
    x,
    w,
    bias,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
    out_shape=None,
    **kwargs,
) -> int:
    """Convolution backward: grad_input and grad_weight each cost what the forward costs."""

    # grad_input = conv_transpose(grad_out, w) -> x's shape (transposed: conv(grad_out, w)):
    # w is [c_out, c_in / groups, *kernel], so each input channel meets only its group's outputs.
    # grad_weight = conv(x^T, grad_out^T) with batch and channels swapped (transposed:
    # conv(grad_out^T, x^T)) -> w's shape: read as one convolution it pairs every input
    # channel with every output channel; a grouped convolution pairs only those of one group,
    # so that count divides by groups. Each term then equals the forward's count.
    # NB: FlopCounterMode (torch 2.13) does not divide the grad_weight term by groups: it
    # counts a depthwise conv's weight gradient c_in times too high.
    def t(shape):
        return (shape[1], shape[0], *shape[2:])

    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out, w, out_shape[0], not transposed)
    if output_mask[1]:
        first, second = (grad_out, x) if transposed else (x, grad_out)
        flops += conv_flop_count(t(first), t(second), t(out_shape[1])) // max(groups, 1)
    return flops


# ---------------------------------------------------------------- attention


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


# ---------------------------------------------------------------- softmax and norms


@register_flop_formula(_packets("_softmax", "_log_softmax", "_safe_softmax"), kind="softmax")
def softmax_flop(x, *args, out_shape=None, **kwargs) -> int:
    """Softmax or log-softmax along one dimension: 5 FLOPs per element."""
    # [..., n] -> [..., n]
    # NB: softmax: max, subtract, exp, sum, divide; log_softmax: max, subtract, exp, sum,
    # subtract (its one log per row is not counted). exp counts as 1 FLOP.
    return 5 * prod(x)


@register_flop_formula(_packets("_softmax_backward_data", "_log_softmax_backward_data"), kind="softmax")
def softmax_backward_flop(grad_out, *args, out_shape=None, **kwargs) -> int:
    """Softmax or log-softmax backward: 4 FLOPs per element."""
    # grad [..., n], output [..., n] -> [..., n]
    # NB: softmax dx = y * (g - sum(g * y)): multiply, sum, subtract, multiply;
    # log_softmax dx = g - exp(y) * sum(g): exp, sum, multiply, subtract.
    return 4 * prod(grad_out)


# NB: norm counts per input element; per-row or per-channel work (rsqrt(var + eps),
# running-stat updates) is not counted.
#   forward with batch statistics: mean, subtract, square, sum, scale by rstd = 5, +1 for a
#     weight, +1 for a bias; RMS norm: square, sum, scale = 3, +1 for a weight.
#   forward with running statistics (batch norm eval): one per-channel scale and shift = 2.
#   backward grad_input: recompute x_hat 2, two row sums (of g * w and g * w * x_hat) 3,
#     combine 4 = 9, +1 for g * w with a weight; RMS norm 6 (+1); batch norm eval 1.
#   backward grad_weight: g * x_hat and its sum = 2; grad_bias: the sum of g = 1.


def _norm_forward(x, weight, bias, per_element=5) -> int:
    return prod(x) * (per_element + (weight is not None) + (bias is not None))


def _norm_backward(x, mask, weight, grad_input=9) -> int:
    """Backward count from output_mask [grad_input, grad_weight(, grad_bias)]."""
    per_element = (grad_input + (weight is not None)) * bool(mask[0]) + 2 * bool(mask[1])
    return prod(x) * (per_element + (len(mask) > 2 and bool(mask[2])))


@register_flop_formula(_packets("native_layer_norm"), kind="norm")
def layer_norm_flop(x, normalized_shape, weight, bias, *args, out_shape=None, **kwargs) -> int:
    """Layer norm forward: 5 per element, +1 weight, +1 bias."""
    # [..., *normalized_shape] -> same; mean, rstd [..., 1]
    return _norm_forward(x, weight, bias)


@register_flop_formula(_packets("native_layer_norm_backward"), kind="norm")
def layer_norm_backward_flop(
    grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask, *args, out_shape=None, **kwargs
) -> int:
    """Layer norm backward: grad_input 9 (+1 weight), grad_weight 2, grad_bias 1 per element."""
    return _norm_backward(x, output_mask, weight)


# Formulas the compiled hook (tracer/native/_dispatch.cpp `native_flops`) computes itself, with the same arithmetic on the
# same sizes and arguments: {formula: its name there}. A formula registered in their place is called in Python.
NATIVE = {
    mm_flop: "mm",
    addmm_flop: "addmm",
    bmm_flop: "bmm",
    baddbmm_flop: "baddbmm",
    softmax_flop: "softmax",
    softmax_backward_flop: "softmax_backward",
    layer_norm_flop: "layer_norm",
    layer_norm_backward_flop: "layer_norm_backward",
}


@register_flop_formula(_packets("_fused_rms_norm"), kind="norm")
def rms_norm_flop(x, normalized_shape, weight, *args, out_shape=None, **kwargs) -> int:
    """RMS norm forward: 3 per element, +1 weight."""
    # [..., *normalized_shape] -> same; rstd [..., 1]
    return _norm_forward(x, weight, None, per_element=3)


@register_flop_formula(_packets("_fused_rms_norm_backward"), kind="norm")
def rms_norm_backward_flop(
    grad_out, x, normalized_shape, rstd, weight, output_mask, *args, out_shape=None, **kwargs
) -> int:
    """RMS norm backward: grad_input 6 (+1 weight), grad_weight 2 per element."""
    return _norm_backward(x, output_mask, weight, grad_input=6)


@register_flop_formula(
    _packets(
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "_native_batch_norm_legit_functional",
        "cudnn_batch_norm",
        "miopen_batch_norm",
        "_batch_norm_no_update",
    ),
    kind="norm",
)
def batch_norm_flop(x, weight, bias, *args, out_shape=None, **kwargs) -> int:
    """Batch norm forward: 5 per element (+1 weight, +1 bias) in training, 2 in eval."""
    # [n, c, *spatial] -> same; mean, invstd [c]
    # NB: `training` is the first bool argument of these schemas; those without one are eval.
    training = next((a for a in args if isinstance(a, bool)), kwargs.get("training", False))
    return _norm_forward(x, weight, bias) if training else 2 * prod(x)


@register_flop_formula(_packets("_batch_norm_with_update"), kind="norm")
def batch_norm_with_update_flop(x, weight, bias, *args, out_shape=None, **kwargs) -> int:
    """Batch norm forward in training (this op always uses batch statistics)."""
    return _norm_forward(x, weight, bias)


@register_flop_formula(_packets("native_batch_norm_backward", "batch_norm_backward"), kind="norm")
def batch_norm_backward_flop(
    grad_out,
    x,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    train,
    eps,
    output_mask,
    *args,
    out_shape=None,
    **kwargs,
) -> int:
    """Batch norm backward: as layer norm in training; grad_input 1 per element in eval."""
    return _norm_backward(x, output_mask, weight) if train else _norm_backward(x, output_mask, None, 1)


@register_flop_formula(_packets("cudnn_batch_norm_backward", "miopen_batch_norm_backward"), kind="norm")
def cudnn_batch_norm_backward_flop(x, grad_out, weight, *args, out_shape=None, **kwargs) -> int:
    """cuDNN / MIOpen batch norm backward (training): all three gradients."""
    return _norm_backward(x, (True, True, True), weight)


@register_flop_formula(_packets("native_group_norm"), kind="norm")
def group_norm_flop(x, weight, bias, *args, out_shape=None, **kwargs) -> int:
    """Group norm forward: 5 per element, +1 weight, +1 bias."""
    # [n, c, *spatial] -> same; mean, rstd [n, groups]
    return _norm_forward(x, weight, bias)


@register_flop_formula(_packets("native_group_norm_backward"), kind="norm")
def group_norm_backward_flop(
    grad_out, x, mean, rstd, weight, n, c, hxw, group, output_mask, *args, out_shape=None, **kwargs
) -> int:
    """Group norm backward: grad_input 9 (+1 weight), grad_weight 2, grad_bias 1 per element."""
    return _norm_backward(x, output_mask, weight)


def has_formula(func) -> bool:
    """Whether the op (an OpOverload) has a registered formula."""
    return func.overloadpacket in _registry
