"""FLOP formulas of softmax and of the norms (layer, RMS, batch, group), forward and backward, per input
element (tracer.flops.formulas: the conventions)."""

from math import prod

from tracer.flops.registry import _packets, register_flop_formula


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
