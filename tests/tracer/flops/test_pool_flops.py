"""Pooling and nearest upsampling FLOPs (tracer.flops.pool): one per input element each window reads."""

import pytest
import torch
import torch.nn.functional as F

import reports
from tests.tracer.flops.test_flops import record
from tracer import Tracer

aten = torch.ops.aten


def counted(fn, packet):
    """(FLOPs, kinds) of the rows of `packet` while running fn."""
    rows = [r for r in record(fn) if r[0].overloadpacket is packet]
    assert rows, f"{packet} was not dispatched"
    return sum(r[2] for r in rows), {r[1] for r in rows}


def window_reads(x_shape, **pool):
    """Brute force: input elements all windows read, from im2col of ones (padding reads zeros, not counted)."""
    ones = torch.ones(x_shape[0], 1, *x_shape[2:], dtype=torch.float64)
    return int(F.unfold(ones, **pool).sum()) * x_shape[1]


def test_max_pool2d_forward_and_backward_literal():
    x = torch.ones(2, 3, 17, 17, requires_grad=True)
    # out = (17 + 2 - 3) // 2 + 1 = 9 per dim; each dim's windows read 8 + 9 + 8 = 25 positions (the
    # first window's left column and the last's right column are padding): 2 * 3 * 25 * 25 = 3750
    assert counted(lambda: F.max_pool2d(x, 3, 2, 1), aten.max_pool2d_with_indices) == (3750, {"reduction"})
    # backward: each of the 2 * 3 * 9 * 9 = 486 output gradients is added into its argmax
    assert counted(lambda: F.max_pool2d(x, 3, 2, 1).sum().backward(), aten.max_pool2d_with_indices_backward) == (
        486,
        {"elementwise"},
    )


@pytest.mark.parametrize(
    "kernel, stride, padding, dilation",
    [
        (2, 2, 0, 1),
        (3, 1, 1, 1),
        (3, 2, 1, 2),
        ((2, 5), (1, 3), (1, 2), (3, 1)),
        (4, 3, 2, 1),
    ],
)
def test_max_pool2d_equals_im2col_count(kernel, stride, padding, dilation):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 13, 11)
    flops, _ = counted(lambda: F.max_pool2d(x, kernel, stride, padding, dilation), aten.max_pool2d_with_indices)
    assert flops == window_reads(x.shape, kernel_size=kernel, stride=stride, padding=padding, dilation=dilation)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_avg_pool_forward_and_backward_equal_the_windows_reads(ceil_mode):
    x = torch.ones(2, 3, 10, 10, requires_grad=True)
    # with divisor 1 and padding counted as zeros, each output sums the input elements its window read
    reads = int(F.avg_pool2d(x.detach(), 3, 2, 1, ceil_mode, count_include_pad=True, divisor_override=1).sum())
    assert counted(lambda: F.avg_pool2d(x, 3, 2, 1, ceil_mode), aten.avg_pool2d) == (reads, {"reduction"})
    assert counted(lambda: F.avg_pool2d(x, 3, 2, 1, ceil_mode).sum().backward(), aten.avg_pool2d_backward) == (
        reads,
        {"elementwise"},
    )
    if not ceil_mode:  # out 5 per dim, windows read 2 + 4 * 3 = 14 positions per dim: 2 * 3 * 14 * 14 = 1176
        assert reads == 1176


def test_adaptive_avg_pool_literal():
    x = torch.ones(2, 3, 17, 17, requires_grad=True)
    # 17 -> 4: windows 0..5, 4..9, 8..13, 12..17 read 5 each, 20 per dim: 2 * 3 * 20 * 20 = 2400
    assert counted(lambda: F.adaptive_avg_pool2d(x, 4), aten._adaptive_avg_pool2d) == (2400, {"reduction"})
    assert counted(lambda: F.adaptive_avg_pool2d(x, 4).sum().backward(), aten._adaptive_avg_pool2d_backward)[0] == 2400
    # 17 -> 17 (the identity): each window reads one element: 2 * 3 * 17 * 17 = 1734
    assert counted(lambda: F.adaptive_max_pool2d(x, 17), aten.adaptive_max_pool2d)[0] == 1734


def test_nearest_upsampling_copies_and_its_backward_adds():
    x = torch.ones(2, 3, 5, 5, requires_grad=True)
    assert counted(lambda: F.interpolate(x, scale_factor=2), aten.upsample_nearest2d) == (0, {"none"})
    # each of the 2 * 3 * 10 * 10 = 600 output gradients is added into the input it was copied from
    assert counted(lambda: F.interpolate(x, scale_factor=2).sum().backward(), aten.upsample_nearest2d_backward) == (
        600,
        {"elementwise"},
    )


@pytest.mark.parametrize(
    "pool",
    [
        lambda x: F.max_pool2d(x, 3, 2, 1),
        lambda x: F.avg_pool2d(x, 3, 2, 1),
        lambda x: F.adaptive_avg_pool2d(x, 4),
        lambda x: F.adaptive_max_pool2d(x, (3, 5)),
        lambda x: F.max_pool1d(x.flatten(2), 4, 3),
        lambda x: F.avg_pool3d(x.unsqueeze(2), (1, 3, 3)),
        lambda x: F.adaptive_avg_pool1d(x.flatten(2), 7),
        lambda x: F.interpolate(x, scale_factor=3, mode="nearest-exact"),
    ],
)
def test_inference_mode_counts_the_composite_as_training_runs_it(pool):
    """Under inference_mode the composite pools arrive whole; they count what their kernels count in training."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 17, 17)

    def total(rows):
        return sum(flops for _, _, flops, _ in rows), {kind for _, kind, _, _ in rows} - {"none"}

    training = total(record(lambda: pool(x)))
    with torch.inference_mode():
        whole = total(record(lambda: pool(x)))
    assert whole == training and "unknown" not in whole[1]


def test_a_small_cnn_step_has_no_uncounted_op(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Upsample(scale_factor=2),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    )
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    with Tracer(tmp_path / "cnn.parquet", model=model):
        F.cross_entropy(model(x), y).backward()
    df = reports.load(tmp_path / "cnn.parquet")
    assert reports.uncounted(df).empty
    pool = df[df.op == "aten.max_pool2d_with_indices.default"]
    assert pool.flops.tolist() == [4 * 8 * 16 * 16]  # 2x2 windows, stride 2: each of the 8,192 inputs read once
    assert df[df.op == "aten.mean.dim"].flops.tolist() == [4 * 8 * 16 * 16]  # the adaptive pool to 1: a mean
