"""FLOP formulas of matrix products: mm, addmm, bmm, baddbmm, mv, dot, addr and the quantized and FP8
matmuls (tracer.flops.formulas: the conventions)."""

from math import prod

from tracer.flops.registry import _packets, register_flop_formula


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
