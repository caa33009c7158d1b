"""FLOP formulas of pooling: one FLOP per input element each window reads, as a reduction counts one per
input element (a max pool is a windowed amax, an average pool a windowed sum; the divide is not counted).

Windows read only positions inside the input (padding is never read), so a window at a border reads
fewer: the count per spatial dim is the sum, over the dim's output positions, of the positions its
window reads; a pool's FLOPs are the product of those sums times the leading (batch, channel) elements.
An adaptive pool's window for output o of a dim of In inputs and Out outputs spans
floor(o * In / Out) .. ceil((o + 1) * In / Out) (aten's own rule). The backward of an average pool adds
each gradient into every element its window read: the forward's count. The backward of a max pool (one
add per output gradient, into its argmax) and of nearest upsampling (each output gradient added into the
input it was copied from) count one per element of grad_output (tracer.flops.op_kinds `_PER_ELEMENT`);
nearest upsampling itself copies (`_NONE_OPS`). Composite pools (`max_pool2d`, `adaptive_avg_pool2d`,
...) reach the tracer whole under inference_mode and count what they run as in training.
`tracer.flops.op_kinds` imports this module to register them.
"""

from functools import lru_cache
from math import prod

from tracer.flops.formulas import _packets, register_flop_formula


def _per_dim(values, dims, default=None):
    """An int list argument as `dims` ints: one value stands for every dim, [] for `default`."""
    if values is None or (isinstance(values, (list, tuple)) and not len(values)):
        return default
    values = [values] if isinstance(values, int) else list(values)
    return values * dims if len(values) == 1 else values


@lru_cache(maxsize=1024)
def _reads(size, out, kernel, stride, pad, dilation):
    """Input positions read along one dim, summed over its `out` windows (padding not read)."""
    total = 0
    for j in range(kernel):
        offset = j * dilation - pad  # window o reads position o * stride + offset
        first = max(0, -(offset // stride))  # the first o whose position is >= 0
        last = min(out - 1, (size - 1 - offset) // stride)  # the last o whose position is < size
        total += max(0, last - first + 1)
    return total


@lru_cache(maxsize=1024)
def _adaptive_reads(size, out):
    """Input positions read along one dim by an adaptive pool's `out` windows."""
    return sum(-(-((o + 1) * size) // out) - (o * size) // out for o in range(out))


def _output(out_shape):
    """The pooled output's shape (max pools return the values and their indices)."""
    return out_shape[0] if out_shape and isinstance(out_shape[0], (list, tuple)) else out_shape


def _window_count(x, out, dims, kernel_size, stride, padding, dilation):
    """Elements read by a pool of `dims` spatial dims: input shape `x`, output shape `out`."""
    kernel = _per_dim(kernel_size, dims)
    stride = _per_dim(stride, dims, kernel)
    padding = _per_dim(padding, dims, [0] * dims)
    dilation = _per_dim(dilation, dims, [1] * dims)
    spatial = [_reads(*a) for a in zip(x[-dims:], out[-dims:], kernel, stride, padding, dilation)]
    return prod(x[:-dims]) * prod(spatial)


def _adaptive_count(x, out, dims):
    return prod(x[:-dims]) * prod(_adaptive_reads(i, o) for i, o in zip(x[-dims:], out[-dims:]))


def _max_pool(dims):
    def max_pool_flop(x, kernel_size, stride=(), padding=0, dilation=1, *args, out_shape=None, **kwargs) -> int:
        # NB: kernel_size, stride, padding, dilation as in the schema; stride [] is the kernel
        return _window_count(x, _output(out_shape), dims, kernel_size, stride, padding, dilation)

    return max_pool_flop


def _avg_pool(dims):
    def avg_pool_flop(x, kernel_size, stride=(), padding=0, *args, out_shape=None, **kwargs) -> int:
        return _window_count(x, _output(out_shape), dims, kernel_size, stride, padding, 1)

    return avg_pool_flop


def _avg_pool_backward(dims):
    def avg_pool_backward_flop(grad_out, x, kernel_size, stride=(), padding=0, *args, out_shape=None, **kwargs) -> int:
        # each output gradient is added into the elements its window read: the forward's count
        return _window_count(x, grad_out, dims, kernel_size, stride, padding, 1)

    return avg_pool_backward_flop


def _adaptive(dims):
    def adaptive_pool_flop(x, output_size, *args, out_shape=None, **kwargs) -> int:
        return _adaptive_count(x, _output(out_shape), dims)

    return adaptive_pool_flop


def _adaptive_backward(dims):
    def adaptive_pool_backward_flop(grad_out, x, *args, out_shape=None, **kwargs) -> int:
        return _adaptive_count(x, grad_out, dims)

    return adaptive_pool_backward_flop


for _d in (1, 2, 3):
    register_flop_formula(
        _packets(f"max_pool{_d}d", f"max_pool{_d}d_with_indices", f"mkldnn_max_pool{_d}d", f"quantized_max_pool{_d}d"),
        kind="reduction",
    )(_max_pool(_d))
    register_flop_formula(_packets(f"avg_pool{_d}d", f"mkldnn_avg_pool{_d}d"), kind="reduction")(_avg_pool(_d))
    register_flop_formula(
        _packets(
            f"adaptive_avg_pool{_d}d",
            f"_adaptive_avg_pool{_d}d",
            f"adaptive_max_pool{_d}d",
            f"mkldnn_adaptive_avg_pool{_d}d",
        ),
        kind="reduction",
    )(_adaptive(_d))
    register_flop_formula(_packets(f"avg_pool{_d}d_backward"), kind="elementwise")(_avg_pool_backward(_d))
    register_flop_formula(
        _packets(f"_adaptive_avg_pool{_d}d_backward", f"mkldnn_adaptive_avg_pool{_d}d_backward"), kind="elementwise"
    )(_adaptive_backward(_d))
