"""FLOP formulas of composite ops that reach the tracer whole, under inference_mode.

CompositeImplicitAutograd ops (linear, matmul, einsum, layer_norm, softmax, conv2d,
scaled_dot_product_attention, ...) normally decompose before dispatch, and the tracer
counts what they decompose into. Under `torch.inference_mode()` they reach the dispatch
mode whole and run whole: the tracer never decomposes an op itself, as that could change
what runs (a nested tensor's linear is not the composite's view + mm). These formulas
count them as what they would decompose into, so a forward counts the same FLOPs with
and without inference_mode. `tracer.flops.op_kinds` imports this module to register them.
"""

from math import prod

from tracer.flops.formulas import (
    _norm_forward,
    _packets,
    attention_flop_count,
    conv_flop_count,
    register_flop_formula,
    softmax_flop,
)


@register_flop_formula(_packets("linear"))
def linear_flop(x, w, *args, out_shape=None, **kwargs) -> int:
    """x @ w^T (+ bias): the matmul only."""
    # [..., in] @ [out, in]^T -> [..., out]: numel(x) / in rows of 2 * in * out
    # NB: the bias adds are not counted (as addmm's).
    return 2 * prod(x) * w[0]


@register_flop_formula(_packets("matmul"))
def matmul_flop(a, b, *args, out_shape=None, **kwargs) -> int:
    """torch.matmul with broadcasting: 2 * k per output element."""
    # [..., m, k] @ [..., k, n] -> [..., m, n]; a 1-d operand is a vector: [k] . [k] -> []
    return 2 * prod(out_shape) * a[-1]


def _einsum_letters(equation, shapes):
    """({letter: size}, [letters per operand], output letters) of an einsum, '...' expanded."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    sizes, operands = {}, []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            head, _, tail = term.partition("...")
            term = head + "".join(chr(0x100 + i) for i in range(len(shape) - len(head) - len(tail))) + tail
        # broadcast ellipsis dims right-aligned, so one letter per position from the end
        operands.append(term)
        for letter, size in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), size)
    if not arrow:
        counts = {c: sum(t.count(c) for t in operands) for c in sizes}
        rhs = "".join(sorted(c for c in sizes if c >= chr(0x100))) + "".join(
            sorted(c for c, n in counts.items() if n == 1 and c < chr(0x100))
        )
    elif "..." in rhs:
        ellipsis = sorted({c for t in operands for c in t if c >= chr(0x100)})
        rhs = rhs.replace("...", "".join(ellipsis))
    return sizes, operands, rhs


@register_flop_formula(_packets("einsum"))
def einsum_flop(equation, operands, *args, out_shape=None, **kwargs) -> int:
    """einsum as pairwise contractions, left to right: 2 per multiply-add of each pair."""
    # two operands: 2 * prod(size of every letter kept by the pair's bmm)
    # NB: more than two operands are contracted left to right (torch may pick another order
    # with opt_einsum); a letter summed within one operand is a reduction first, not counted.
    if len(operands) < 2:
        return 0
    sizes, terms, out = _einsum_letters(equation, operands)
    flops, left = 0, terms[0]
    for i, right in enumerate(terms[1:], start=1):
        later = set(out).union(*terms[i + 1 :])
        keep_left = {c for c in left if c in later or c in right}
        keep_right = {c for c in right if c in later or c in left}
        flops += 2 * prod(sizes[c] for c in keep_left | keep_right)
        left = "".join(sorted((keep_left | keep_right) & (later | set())))
    return flops


@register_flop_formula(_packets("conv1d", "conv2d", "conv3d"), kind="conv")
def conv_nd_flop(x, w, *args, out_shape=None, **kwargs) -> int:
    """conv1d/2d/3d: the convolution they call."""
    return conv_flop_count(x, w, out_shape)


@register_flop_formula(_packets("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"), kind="conv")
def conv_transpose_nd_flop(x, w, *args, out_shape=None, **kwargs) -> int:
    """conv_transpose1d/2d/3d: the transposed convolution they call."""
    return conv_flop_count(x, w, out_shape, transposed=True)


@register_flop_formula(_packets("scaled_dot_product_attention"), kind="attention")
def sdpa_composite_flop(q, k, v, *args, out_shape=None, **kwargs) -> int:
    """F.scaled_dot_product_attention on [..., s, d] tensors: the fused kernel's count."""
    # [*batch, s_q, d] x [*batch, s_k, d] x [*batch, s_k, d_v] -> [*batch, s_q, d_v]
    return attention_flop_count(prod(q[:-2]), 1, q[-2], k[-2], q[-1], v[-1])


@register_flop_formula(_packets("softmax", "log_softmax"), kind="softmax")
def softmax_composite_flop(x, *args, out_shape=None, **kwargs) -> int:
    """softmax / log_softmax: 5 per element, as _softmax."""
    return softmax_flop(x)


@register_flop_formula(_packets("cross_entropy_loss"), kind="softmax")
def cross_entropy_flop(x, target, *args, out_shape=None, **kwargs) -> int:
    """cross_entropy: log_softmax (5 per element) and nll_loss (1 per target)."""
    # [n, c] logits, [n] class indices -> []
    # NB: probability targets (target shaped like x) count 1 per element for the weighted sum.
    return softmax_flop(x) + prod(target)


@register_flop_formula(_packets("layer_norm"), kind="norm")
def layer_norm_composite_flop(x, normalized_shape, weight=None, bias=None, *args, out_shape=None, **kwargs) -> int:
    """layer_norm: as native_layer_norm."""
    return _norm_forward(x, weight, bias)


@register_flop_formula(_packets("rms_norm"), kind="norm")
def rms_norm_composite_flop(x, normalized_shape, weight=None, *args, out_shape=None, **kwargs) -> int:
    """rms_norm as it decomposes: pow, mean, mul (+ mul by weight) per element; add eps, rsqrt per row."""
    # [..., *normalized_shape] -> same
    # NB: 3 per element (+1 weight) + 2 per row: the ops it decomposes into on the CPU;
    # _fused_rms_norm, where a backend uses it, counts 3 (+1) per element.
    rows = prod(x) // max(prod(normalized_shape), 1)
    return prod(x) * (3 + (weight is not None)) + 2 * rows


@register_flop_formula(_packets("group_norm"), kind="norm")
def group_norm_composite_flop(x, num_groups, weight=None, bias=None, *args, out_shape=None, **kwargs) -> int:
    """group_norm: as native_group_norm."""
    return _norm_forward(x, weight, bias)


@register_flop_formula(_packets("batch_norm", "instance_norm"), kind="norm")
def batch_norm_composite_flop(
    x, weight, bias, running_mean, running_var, use_input_stats, *args, out_shape=None, **kwargs
) -> int:
    """batch_norm (training or eval) and instance_norm (batch statistics when use_input_stats)."""
    return _norm_forward(x, weight, bias) if use_input_stats or running_mean is None else 2 * prod(x)
