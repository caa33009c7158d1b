"""FLOP formulas of convolutions, forward and backward, any dimension, transposed or grouped
(tracer.flops.formulas: the conventions)."""

from math import prod

from tracer.flops.registry import _packets, register_flop_formula


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
