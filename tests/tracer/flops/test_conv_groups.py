"""Grouped, depthwise and transposed convolutions: forward and backward FLOPs, literal figures.

A grouped convolution's backward costs twice its forward (grad_input and grad_weight each
cost the forward); FlopCounterMode agrees on the forward and on grad_input, and counts the
weight gradient `groups` times too high (tracer.flops.formulas conv_backward_flop)."""

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tracer.flops.op_kinds import flop_rule

aten = torch.ops.aten


class _Conv(torch.utils._python_dispatch.TorchDispatchMode):
    """FLOPs of the convolution ops that ran, by packet."""

    def __init__(self):
        super().__init__()
        self.flops = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket in (aten.convolution, aten.convolution_backward):
            name = func.overloadpacket.__name__
            self.flops[name] = self.flops.get(name, 0) + flop_rule(func).count(args, kwargs, out)
        return out


def conv_flops(run):
    with _Conv() as mode:
        run()
    return mode.flops


def torch_counts(run):
    with FlopCounterMode(display=False) as counter:
        run()
    return {op.__name__: n for op, n in counter.get_flop_counts()["Global"].items()}


def _leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


def test_grouped_conv2d_forward_and_backward():
    torch.manual_seed(0)
    x, w = _leaf(1, 2, 4, 4), _leaf(4, 1, 2, 2)
    run = lambda: F.conv2d(x, w, groups=2).backward(torch.ones(1, 4, 3, 3))  # noqa: E731
    # out [1, 4, 3, 3]; each output meets 1 input channel x 2 x 2 taps: 2 * 1 * 9 * (4 * 1 * 4) = 288
    # backward: grad_input 288 + grad_weight 288 = 576
    assert conv_flops(run) == {"convolution": 288, "convolution_backward": 576}
    theirs = torch_counts(run)
    assert theirs["convolution"] == 288
    assert theirs["convolution_backward"] == 864  # FlopCounterMode: grad_weight as if ungrouped, 2 * 288


def test_grouped_conv2d_grad_input_matches_flop_counter_mode():
    torch.manual_seed(0)
    x, w = _leaf(1, 2, 4, 4), torch.randn(4, 1, 2, 2)  # the weight needs no gradient: grad_input alone
    run = lambda: F.conv2d(x, w, groups=2).backward(torch.ones(1, 4, 3, 3))  # noqa: E731
    assert conv_flops(run) == {"convolution": 288, "convolution_backward": 288} == torch_counts(run)


def test_depthwise_3x3_backward_is_twice_the_forward():
    torch.manual_seed(0)
    x, w = _leaf(2, 8, 6, 6), _leaf(8, 1, 3, 3)
    run = lambda: F.conv2d(x, w, padding=1, groups=8).backward(torch.ones(2, 8, 6, 6))  # noqa: E731
    # 2 * 2 * 36 * (8 * 1 * 9) = 10368 forward; grad_input 10368 + grad_weight 10368
    assert conv_flops(run) == {"convolution": 10368, "convolution_backward": 20736}
    # FlopCounterMode's weight gradient pairs all 8 x 8 channels: 10368 + 8 * 10368 = 93312
    assert torch_counts(run)["convolution_backward"] == 93312


def test_depthwise_conv_of_the_issue_on_meta():
    x = torch.empty(8, 64, 56, 56, device="meta", requires_grad=True)
    w = torch.empty(64, 1, 3, 3, device="meta", requires_grad=True)
    run = lambda: F.conv2d(x, w, padding=1, groups=64).backward(torch.empty(8, 64, 56, 56, device="meta"))  # noqa: E731
    # 2 * 8 * 3136 * (64 * 1 * 9) = 28,901,376 forward; backward 2x = 57,802,752 (optrace said 1,878,589,440)
    assert conv_flops(run) == {"convolution": 28_901_376, "convolution_backward": 57_802_752}


def test_transposed_grouped_conv_forward_and_backward():
    torch.manual_seed(0)
    x, w = _leaf(1, 4, 3, 3), _leaf(4, 3, 2, 2)  # w [c_in, c_out / groups, k, k], groups 2: c_out 6
    run = lambda: F.conv_transpose2d(x, w, stride=2, groups=2).backward(torch.ones(1, 6, 6, 6))  # noqa: E731
    # each input position meets c_out / groups x 2 x 2 taps: 2 * 1 * 9 * (4 * 3 * 4) = 864
    # backward: grad_input 864 + grad_weight 864 = 1728
    assert conv_flops(run) == {"convolution": 864, "convolution_backward": 1728}
    theirs = torch_counts(run)
    assert theirs["convolution"] == 864 and theirs["convolution_backward"] == 864 + 2 * 864


def test_ungrouped_conv_backward_matches_flop_counter_mode():
    torch.manual_seed(0)
    x, w = _leaf(2, 3, 5, 5), _leaf(4, 3, 3, 3)
    run = lambda: F.conv2d(x, w).backward(torch.ones(2, 4, 3, 3))  # noqa: E731
    # 2 * 2 * 9 * (4 * 3 * 9) = 3888 forward; backward 2 * 3888 = 7776
    assert conv_flops(run) == {"convolution": 3888, "convolution_backward": 7776} == torch_counts(run)
