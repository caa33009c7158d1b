"""An fp8 training step: torch._scaled_mm's FLOPs at the fp8 peak, and MFU weighted by the dtype each matmul ran in.

Float8Linear is a Float8 linear layer in the usual recipe (per-tensor scales, e4m3 for the forward's operands, e5m2
for the gradient): the forward is one _scaled_mm, the backward two (the input's gradient and the weight's).
_scaled_mm runs on the CPU in the torch this project uses, so the step is traced as it runs.
"""

import pandas as pd
import pytest
import torch
from torch import nn

from reports.flops.mfu import mfu
from reports.loading.load import load
from tracer import Tracer

M, N, K = 16, 32, 64  # x [M, K] @ weight [N, K]ᵀ -> y [M, N]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
H100 = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}  # the H100 SXM: 989.4 TFLOP/s bf16, 1,978.9 fp8 dense
A100 = {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB"}  # no fp8


def _to_float8(t, dtype):
    """t in `dtype` with one scale for the whole tensor (amax to the format's largest value); (fp8 tensor, scale)."""
    scale = t.abs().max().float().clamp(min=1e-12) / torch.finfo(dtype).max
    return (t.float() / scale).to(dtype), scale


def _column_major(t):
    """The same values with column-major strides: _scaled_mm's second operand."""
    return t.t().contiguous().t()


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        x8, sx = _to_float8(x, E4M3)
        w8, sw = _to_float8(weight, E4M3)
        ctx.save_for_backward(x8, sx, w8, sw)
        return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = _to_float8(grad, E5M2)
        grad_x = torch._scaled_mm(g8, _column_major(w8), scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)
        grad_w = torch._scaled_mm(
            g8.t().contiguous(), _column_major(x8), scale_a=sg, scale_b=sx, out_dtype=torch.bfloat16
        )
        return grad_x, grad_w


class Float8Linear(nn.Module):
    """y = x @ weightᵀ in fp8 (bf16 in and out), no bias."""

    def __init__(self, k, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, k, dtype=torch.bfloat16))

    def forward(self, x):
        return _Float8Matmul.apply(x, self.weight)


def fp8_step():
    """(model, run): one Float8Linear training step on a seeded [M, K] input (x needs its gradient, as a hidden
    layer's input does)."""
    model = Float8Linear(K, N)
    x = torch.randn(M, K, dtype=torch.bfloat16, requires_grad=True)

    def run():
        model(x).float().square().mean().backward()

    return model, run


def _scaled_mm_rows(df):
    return df[df["op"] == "aten._scaled_mm.default"]


def test_fp8_step_counts_three_scaled_mm(tmp_path):
    torch.manual_seed(0)
    model, run = fp8_step()
    with Tracer(tmp_path / "fp8", model=model, run_name="fp8"):
        run()
    df = load(tmp_path / "fp8")
    rows = _scaled_mm_rows(df)
    assert rows["phase"].tolist() == ["forward", "backward", "backward"]
    assert rows["flop_kind"].tolist() == ["matmul"] * 3
    # each a 16 x 32 x 64 product, whatever the order of its sides: 2 * 16 * 32 * 64 = 65,536
    assert rows["flops"].tolist() == [65_536] * 3
    first = [list(d)[:2] for d in rows["input_dtypes"]]
    assert first == [
        ["float8_e4m3fn", "float8_e4m3fn"],
        ["float8_e5m2", "float8_e4m3fn"],
        ["float8_e5m2", "float8_e4m3fn"],
    ]


class _HalfFp8(nn.Module):
    """A forward of one bf16 mm and one fp8 _scaled_mm of the same 16 x 32 x 64 shape, and nothing else."""

    def forward(self, a, b, a8, b8, sa, sb):
        return torch.mm(a, b), torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def _half_fp8_half_bf16(path):
    """_HalfFp8 traced (its operands made outside the trace), as run on an H100: model FLOPs 2 * 65,536 = 131,072,
    half in each dtype."""
    torch.manual_seed(0)
    model = _HalfFp8()
    a, b = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)
    a8, sa = _to_float8(a, E4M3)
    b8, sb = _to_float8(b, E4M3)
    b8 = _column_major(b8)
    with Tracer(path, model=model, run_name="half"):
        model(a, b, a8, b8, sa, sb)
    df = load(path)
    df.attrs["runs"]["half"]["device"] = dict(H100)
    return df


def test_mfu_weighted_by_dtype_half_fp8(tmp_path):
    df = _half_fp8_half_bf16(tmp_path / "half")
    assert df.loc[df["flops"] > 0, "flops"].tolist() == [65_536, 65_536]  # 2 * 16 * 32 * 64 each
    row = mfu(df, step_time_s=1e-9, dtype="bfloat16").iloc[0]  # the usual convention: every FLOP at the bf16 peak
    assert row["model_flops_per_step"] == 131_072  # 2 * 65,536
    assert row["achieved_flops_per_s"] == pytest.approx(131.072e12)  # 131,072 FLOPs / 1e-9 s
    assert row["peak_flops_per_s"] == 989.4e12
    assert row["mfu"] == pytest.approx(0.13247625)  # 131.072e12 / 989.4e12
    # each half at its own dtype's peak: 65,536 / 989.4e12 + 65,536 / 1978.9e12 = 6.6238e-11 + 3.3117e-11
    # = 9.93555e-11 s at peak; 131,072 / 9.93555e-11 s = 1319.2222e12 FLOP/s, the harmonic mean
    # 2 / (1 / 989.4 + 1 / 1978.9) TFLOP/s
    assert row["weighted_peak_flops_per_s"] == pytest.approx(1319.2222e12, rel=1e-7)
    assert row["mfu_weighted"] == pytest.approx(0.0993555, rel=1e-6)  # 9.93555e-11 s at peak / 1e-9 s
    assert row["weighted_peak_source"] == "per dtype: bfloat16, float8"
    # the weighted figure does not depend on the dtype the usual column is priced at
    fp8 = mfu(df, step_time_s=1e-9, dtype="fp8").iloc[0]
    assert fp8["mfu"] == pytest.approx(0.0662348)  # 131.072e12 / 1978.9e12
    assert fp8["mfu_weighted"] == row["mfu_weighted"]


def test_mfu_weighted_unknown_without_an_fp8_peak(tmp_path):
    df = _half_fp8_half_bf16(tmp_path / "half")
    df.attrs["runs"]["half"]["device"] = dict(A100)
    row = mfu(df, step_time_s=1e-9, dtype="bfloat16").iloc[0]
    assert row["mfu"] == pytest.approx(0.4201026)  # 131.072e12 / 312e12: the usual column stands
    assert pd.isna(row["mfu_weighted"]) and pd.isna(row["weighted_peak_flops_per_s"])
    assert row["weighted_peak_source"].startswith("no float8 peak: A100 has no dense float8 peak")


def test_mfu_weighted_is_mfu_when_one_dtype(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(K, N, dtype=torch.bfloat16)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    with Tracer(tmp_path / "bf16", model=model, run_name="bf16"):
        model(x).sum().backward()
    df = load(tmp_path / "bf16")
    df.attrs["runs"]["bf16"]["device"] = dict(H100)
    row = mfu(df, step_time_s=1e-6).iloc[0]
    assert row["dtype"] == "bfloat16" and row["peak_flops_per_s"] == 989.4e12
    assert row["weighted_peak_flops_per_s"] == 989.4e12 and row["mfu_weighted"] == row["mfu"]
    assert mfu(df, step_time_s=1e-6, peak_flops=1e12).iloc[0]["weighted_peak_source"] == "given"


def test_mfu_weighted_prices_fp32_matmuls_at_tf32_when_told(tmp_path):
    """dtype="tfloat32" says the fp32 matmuls ran on TF32 tensor cores: mfu_weighted prices them there too, as mfu
    does, rather than at the non-tensor fp32 rate (which put it above 1)."""
    model = nn.Linear(1024, 1024, bias=False)
    x = torch.ones(1024, 1024)
    with Tracer(tmp_path / "fp32", model=model, run_name="fp32"):
        model(x)
    df = load(tmp_path / "fp32")
    df.attrs["runs"]["fp32"]["device"] = dict(A100)  # 19.5 TFLOP/s fp32, 156 TF32 dense
    row = mfu(df, step_time_s=1e-4, dtype="tfloat32").iloc[0]
    assert row["model_flops_per_step"] == 2 * 1024**3 == 2_147_483_648
    assert row["mfu"] == pytest.approx(0.1376592)  # 2,147,483,648 / 1e-4 s = 21.47e12 FLOP/s over 156e12
    assert row["weighted_peak_flops_per_s"] == 156e12 and row["mfu_weighted"] == row["mfu"]
    assert row["weighted_peak_source"] == "per dtype: tfloat32"
    # without dtype=, the fp32 rate for both: 21.47e12 / 19.5e12 = 1.1013
    plain = mfu(df, step_time_s=1e-4).iloc[0]
    assert plain["mfu_weighted"] == plain["mfu"] == pytest.approx(1.1012736)


def test_report_json_carries_the_weighted_mfu(tmp_path, capsys):
    import json

    from reports.output.cli import main

    torch.manual_seed(0)
    model, x = torch.nn.Linear(32, 16), torch.randn(8, 32)
    with Tracer(tmp_path / "fp32", model=model, tokens=8):
        model(x).sum().backward()
    assert main(["report", "--json", "--step-time", "0.001", str(tmp_path / "fp32")]) in (0, None)
    found = json.loads(capsys.readouterr().out)
    # one matmul dtype (float32): every op at the float32 peak, so the weighted figures are the usual ones
    assert found["mfu_source"] == "step_time" and found["mfu_weighted"] == pytest.approx(found["mfu"], rel=1e-12)
    assert found["weighted_peak_flops_per_s"] == found["peak_flops_per_s"] > 0
