"""Nested tensors: matmuls count the sum over components; packed (jagged) attention counts the
sum over sequences from the real lengths, and the flagged max-length bound where the lengths
cannot be read. Lengths 32, 64, 96, 128: the bound is 2.13x the count."""

import warnings

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from tracer import Tracer
from tracer.flops.formulas import FlopCount
from tracer.flops.op_kinds import flop_rule

aten = torch.ops.aten
LENGTHS = (32, 64, 96, 128)
H, D = 2, 8
# one sequence's attention forward: 2 * h * s * s * (d + d); summed over the four lengths:
# 2 * 2 * 16 * (32**2 + 64**2 + 96**2 + 128**2) = 64 * 30720 = 1,966,080
EXACT = sum(2 * H * s * s * (D + D) for s in LENGTHS)
BOUND = len(LENGTHS) * 2 * H * 128 * 128 * (D + D)  # every sequence at 128: 4,194,304


def traced(tmp_path, fn):
    path = tmp_path / "t"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype warning for strided nested tensors
        with Tracer(path):
            fn()
    df = pd.read_parquet(path)
    return df[df["flops"] > 0]


def strided(*shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.randn(*s) for s in shapes])


def test_the_bound_is_2_13_times_the_count():
    assert EXACT == 1_966_080 and BOUND == 4_194_304
    assert round(BOUND / EXACT, 2) == 2.13


def test_jagged_matmul_and_bmm_count_the_stored_rows(tmp_path):
    torch.manual_seed(0)
    nt = torch.nested.nested_tensor([torch.randn(s, D) for s in LENGTHS], layout=torch.jagged)
    w, stacked = torch.randn(D, 4), torch.randn(len(LENGTHS), D, 4)
    rows = traced(tmp_path, lambda: (nt @ w, torch.bmm(nt, stacked)))
    # (32 + 64 + 96 + 128) rows of [8] @ [8, 4]: 2 * 320 * 8 * 4 = 20480, for each op
    assert rows[["op", "flops"]].values.tolist() == [["aten.matmul.default", 20480], ["aten.bmm.default", 20480]]
    assert set(rows["layout"]) == {"jagged"} and set(rows["flop_kind"]) == {"matmul"}


def test_strided_nested_matmul_bmm_linear_sum_their_components(tmp_path):
    torch.manual_seed(0)
    a, b = strided((2, 3, 8), (2, 5, 8)), strided((2, 8, 3), (2, 8, 5))
    x, y, w = strided((3, 8), (5, 8)), strided((8, 4), (8, 4)), torch.randn(4, 8)
    rows = traced(tmp_path, lambda: (torch.matmul(a, b), torch.bmm(x, y), F.linear(x, w)))
    # matmul: [2, 3, 8] @ [2, 8, 3] and [2, 5, 8] @ [2, 8, 5]: 2 * 8 * (2*3*3 + 2*5*5) = 1088
    # bmm and linear: [3, 8] @ [8, 4] and [5, 8] @ [8, 4]: 2 * 8 * 4 * (3 + 5) = 512 each
    assert rows["flops"].tolist() == [1088, 512, 512]
    assert set(rows["flop_kind"]) == {"matmul"} and set(rows["layout"]) == {"nested"}


def test_jagged_attention_on_cpu_counts_each_sequence(tmp_path):
    torch.manual_seed(0)
    q = torch.nested.nested_tensor([torch.randn(s, H, D) for s in LENGTHS], layout=torch.jagged).transpose(1, 2)
    rows = traced(tmp_path, lambda: F.scaled_dot_product_attention(q, q, q))
    matmuls = rows[rows["op"] == "aten.matmul.default"]
    # the CPU path runs q @ k^T and p @ v on strided nested tensors: each sum_i 2 * h * s_i**2 * d
    assert matmuls["flops"].tolist() == [EXACT // 2, EXACT // 2] and matmuls["flops"].sum() == EXACT
    softmax = rows[rows["op"] == "aten._safe_softmax.default"]
    assert softmax["flops"].tolist() == [5 * H * sum(s * s for s in LENGTHS)]  # 5 * 2 * 30720 = 307200
    assert not rows["flops_bound"].any()


def packed(device="cpu"):
    total = sum(LENGTHS)
    cum = torch.tensor([0, 32, 96, 192, 320], dtype=torch.int32, device=device)
    return torch.empty(total, H, D, device=device), cum


@pytest.mark.parametrize(
    "op",
    [
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
    ],
)
def test_fused_packed_attention_counts_each_sequence_from_the_offsets(op):
    rule = flop_rule(getattr(aten, op).default)
    backward = op.endswith("backward")
    for device in ("cpu", "meta"):
        q, cum = packed(device)
        if op.startswith("_efficient"):
            q = q.unsqueeze(0)  # [1, total, h, d]
            head = (q, q, q, None) if not backward else (q, q, q, q, None, q)
        else:
            head = (q, q, q) if not backward else (q, q, q, q, q, q)
        count = rule.count((*head, cum, cum, 128, 128), {}, None)
        scale = 2.5 if backward else 1  # backward: 5 score-sized matmuls against 2
        if device == "cpu":  # readable offsets: exact, with the lengths
            assert count == FlopCount(int(scale * EXACT), False, LENGTHS)
        else:  # meta: every sequence at the maximum length, flagged a bound
            assert count == FlopCount(int(scale * BOUND), True, None)


def test_dense_flash_attention_is_unchanged():
    rule = flop_rule(aten._flash_attention_forward.default)
    q = torch.empty(2, 16, H, D)  # [b, s, h, d]
    # 2 * 2 * 2 * 16 * 16 * (8 + 8) = 32768
    assert rule.count((q, q, q, None, None, 16, 16), {}, None) == FlopCount(32768)


@pytest.mark.parametrize("input_grad", [False, True])
def test_a_jagged_linear_s_backward_counts_what_the_packed_dense_one_counts(tmp_path, input_grad):
    """A linear on a jagged tensor runs its own backward op (linear_backward, which no dense linear reaches): its
    gradients count as the packed rows' dense backward counts them (it was 0, an op without a formula)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(D, 4)
    parts = [torch.randn(s, D) for s in (2, 6)]

    def backward_flops(x, path):
        lin.zero_grad(set_to_none=True)  # each run makes its gradients (none added into)
        with Tracer(tmp_path / path, model=lin):
            out = lin(x)
            (out.values() if out.is_nested else out).sum().backward()
        df = pd.read_parquet(tmp_path / path)
        return df.loc[df["phase"] == "backward", "flops"].sum(), df

    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=input_grad)
    packed = torch.cat(parts).requires_grad_(input_grad)
    nested_flops, df = backward_flops(jagged, "jagged")
    row = df[df["op"] == "aten.linear_backward.default"]
    # 8 rows: dL/dW = dL/dy.T @ x 2 * 8 * 4 * 8 = 512, dL/db 8 * 4 = 32, and with the input's gradient
    # dL/dx = dL/dy @ W another 512
    assert row["flops"].tolist() == [512 + 32 + (512 if input_grad else 0)]
    assert row["flop_kind"].tolist() == ["matmul"]
    assert nested_flops == backward_flops(packed, "packed")[0]


def _sdpa_fw_bw(make_qkv, unpack, backend=None):
    """F.scaled_dot_product_attention on make_qkv()'s [b, h, s, d] inputs, then the backward of its sum."""
    from contextlib import nullcontext

    from torch.nn.attention import sdpa_kernel

    q, k, v = make_qkv()
    with sdpa_kernel(backend) if backend is not None else nullcontext():
        out = F.scaled_dot_product_attention(q, k, v)
    unpack(out).sum().backward()


@pytest.mark.parametrize("collector", ["python", "compiled"])
def test_jagged_attention_forward_and_backward_count_the_dense_split(tmp_path, monkeypatch, collector):
    """The CPU path of jagged attention runs a strided nested matmul's own backward (matmul_backward, which no
    dense matmul reaches): it counts both gradients (it was 0 FLOPs, "unknown": fw+bw was a third of the dense
    split's). Lengths 3 and 5, 2 heads, head dim 8."""
    from torch.nn.attention import SDPBackend
    from torch.utils.flop_counter import FlopCounterMode

    from tracer import read_metadata
    from tracer.native import loader as native

    monkeypatch.setenv(native.ENV, collector)
    lengths = (3, 5)
    torch.manual_seed(0)
    parts = [[torch.randn(s, H, D) for s in lengths] for _ in range(3)]

    def jagged():
        return [torch.nested.nested_tensor(p, layout=torch.jagged, requires_grad=True).transpose(1, 2) for p in parts]

    def split(i):  # sequence i alone, dense [1, h, s, d]
        return lambda: [p[i].transpose(0, 1).unsqueeze(0).requires_grad_() for p in parts]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Tracer(tmp_path / "jagged"):
            _sdpa_fw_bw(jagged, lambda out: out.values())
        with Tracer(tmp_path / "dense"):
            for i in range(len(lengths)):
                _sdpa_fw_bw(split(i), lambda out: out, SDPBackend.MATH)
        counter = FlopCounterMode(display=False)  # it counts the dense split's bmm; it cannot run the jagged one
        with counter:
            for i in range(len(lengths)):
                _sdpa_fw_bw(split(i), lambda out: out, SDPBackend.MATH)
    assert read_metadata(tmp_path / "jagged")["collector"]["path"] == collector
    rows, dense = pd.read_parquet(tmp_path / "jagged"), pd.read_parquet(tmp_path / "dense")
    backward = rows[rows["op"] == "aten.matmul_backward.default"]
    # dL/dp = dL/dout @ v^T and dL/dv = p^T @ dL/dout: 2 * (2 * h * s * s * d) per sequence,
    # 2 * 2 * 2 * 8 * (3 * 3 + 5 * 5) = 2176; dL/dq and dL/dk of q @ k^T alike
    assert backward["flops"].tolist() == [2176, 2176] and set(backward["flop_kind"]) == {"matmul"}
    # forward: q @ k^T and p @ v, 2 * h * s * s * d each: 2 * 2 * 8 * 34 = 1088 each, 2176 in all;
    # backward: 4 products of the same size, 4352; the softmax, scalings and sum as the dense ones count them
    by_phase = rows.groupby("phase")["flops"].sum()
    dense_by_phase = dense.groupby("phase")["flops"].sum()
    assert (by_phase["forward"], by_phase["backward"]) == (dense_by_phase["forward"], dense_by_phase["backward"])
    assert (
        by_phase["backward"] == 4880
    )  # 4352 + softmax backward 4 * 2 * 34 = 272 + scalings of q and k 2 * (2 * 8 * 8) = 256
    matmuls = rows[rows["flop_kind"] == "matmul"]["flops"].sum()
    assert matmuls == counter.get_total_flops() == 6528  # 2176 + 4352: FlopCounterMode's bmm on the dense split


@pytest.mark.parametrize("input_grad", [False, True])
def test_a_jagged_matmul_s_backward_counts_what_the_packed_dense_one_counts(tmp_path, input_grad):
    """x @ W on a jagged x runs matmul_backward on the jagged layout: each gradient asked for counts as the
    packed rows' dense mm does (it was 0 FLOPs, "unknown")."""
    torch.manual_seed(0)
    parts, w = [torch.randn(s, D) for s in (3, 5)], torch.randn(D, 4, requires_grad=True)

    def backward_rows(x, path):
        with Tracer(tmp_path / path):
            out = x @ w
            (out.values() if out.is_nested else out).sum().backward()
        df = pd.read_parquet(tmp_path / path)
        return df[(df["phase"] == "backward") & (df["flops"] > 0)]

    jagged = backward_rows(torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=input_grad), "j")
    packed = backward_rows(torch.cat(parts).requires_grad_(input_grad), "p")
    # 8 rows of [8] @ [8, 4]: dL/dW = x^T @ dL/dy 2 * 8 * 8 * 4 = 512, and with the input's gradient
    # dL/dx = dL/dy @ W^T another 512
    # (the jagged path also sums dL/dW's per-sequence [2, 8, 4] parts: 2 * 8 * 4 = 64 adds, a reduction)
    assert jagged[["op", "flops", "layout"]].values.tolist() == [
        ["aten.matmul_backward.default", 512 + (512 if input_grad else 0), "jagged"],
        ["aten.sum.dim_IntList", 64, ""],
    ]
    assert jagged["flops"].iloc[0] == packed.loc[packed["flop_kind"] == "matmul", "flops"].sum()
