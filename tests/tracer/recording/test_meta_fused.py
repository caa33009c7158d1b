"""Norms and losses on meta and fake tensors are traced as the CUDA kernels run them (tracer.recording.meta_fused).

rms_norm stands in as _fused_rms_norm (forward) and _fused_rms_norm_backward, keeping the input, the weight and
rstd as CUDA's autograd formula does; layer_norm and cross_entropy already reach the trace as the ops CUDA runs.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reports.loading.load import load
from tracer import Tracer, read_metadata

N, D = 64, 32  # a bf16 input [N, D] normalised over D


def _rms_norm_step(path, device="meta", weight_dtype=torch.bfloat16):
    """nn.RMSNorm's forward and backward on [N, D] bf16 (the input, its gradient and the weight made outside the
    trace); (trace, metadata)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = nn.RMSNorm(D, dtype=weight_dtype)
        x = torch.randn(N, D, dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(N, D, dtype=torch.bfloat16)
    with Tracer(path, model=model):
        model(x).backward(grad)
    return load(path), read_metadata(path)


def _assert_fused(df, meta):
    # the two fused ops and the two gradients' accumulation, nothing else
    assert df["op"].tolist() == [
        "aten._fused_rms_norm.default",
        "aten._fused_rms_norm_backward.default",
        "aten.detach.default",
        "aten.detach.default",
    ]
    assert [list(map(str, d)) for d in df["output_dtypes"][:2]] == [["bfloat16", "float32"], ["bfloat16", "bfloat16"]]
    assert df["flops"].tolist()[:2] == [8192, 18432]  # 64 * 32 * (3 + 1 weight); 64 * 32 * (6 + 1 weight + 2)
    # forward: the output 2 * 64 * 32 = 4,096 and rstd [64, 1] fp32 4 * 64 = 256; backward: the two gradients,
    # 2 * 64 * 32 + 2 * 32 = 4,160
    assert df["bytes_allocated"].tolist()[:2] == [4352, 4160]
    # the closed form of what a GPU keeps: x, grad, y and x's gradient 4 * (2 * N * D) = 16,384, rstd 4 * N = 256,
    # the weight and its gradient 2 * (2 * D) = 128: 16,768 at the backward, against 61,568 for the composite's
    # fp32 intermediates
    assert df["live_bytes"].max() == 4 * 2 * N * D + 4 * N + 2 * 2 * D == 16768
    assert meta["fused_standins"] == {"rms_norm": 1, "composite": 0}


def test_rms_norm_on_meta_keeps_what_the_fused_kernel_keeps(tmp_path):
    df, meta = _rms_norm_step(tmp_path / "meta")
    _assert_fused(df, meta)


def test_rms_norm_on_fake_tensors(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        df, meta = _rms_norm_step(tmp_path / "fake", device="cpu")
    _assert_fused(df, meta)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_a_weight_of_another_dtype_takes_the_composite(tmp_path):
    """rms_norm_symint calls _fused_rms_norm only when the weight has the input's dtype: CUDA decomposes this one too."""
    df, meta = _rms_norm_step(tmp_path / "mixed", weight_dtype=torch.float32)
    assert "aten._fused_rms_norm.default" not in set(df["op"])
    assert "aten.rsqrt.default" in set(df["op"])
    assert meta["fused_standins"] == {"rms_norm": 0, "composite": 1}


def test_real_cpu_tensors_are_left_alone(tmp_path):
    torch.manual_seed(0)
    model = nn.RMSNorm(D)
    x = torch.randn(N, D)
    expected = model(x)
    with Tracer(tmp_path / "cpu", model=model):
        y = model(x)
    assert torch.equal(y, expected)
    assert "fused_standins" not in read_metadata(tmp_path / "cpu")
    assert "aten._fused_rms_norm.default" not in set(load(tmp_path / "cpu")["op"])


def test_layer_norm_and_cross_entropy_on_meta_are_the_cuda_kernels(tmp_path):
    """No stand-in needed: native_layer_norm whole, with CUDA's fp32 mean and rstd for a bf16 input; cross_entropy as
    CUDA runs it, _log_softmax (its output kept for the backward) and nll_loss_forward."""
    with torch.device("meta"):
        model = nn.LayerNorm(D, dtype=torch.bfloat16)
        x = torch.empty(N, D, dtype=torch.bfloat16, requires_grad=True)
        target = torch.zeros(N, dtype=torch.long)
    with Tracer(tmp_path / "ln", model=model):
        F.cross_entropy(model(x), target).backward()
    df = load(tmp_path / "ln")
    row = df[df["op"] == "aten.native_layer_norm.default"].iloc[0]
    assert [list(s) for s in row["output_shapes"]] == [[64, 32], [64, 1], [64, 1]]
    assert list(row["output_dtypes"]) == ["bfloat16", "float32", "float32"]
    assert row["bytes_allocated"] == 4608  # 2 * 64 * 32 = 4,096 + mean and rstd 2 * 4 * 64 = 512
    ops = df["op"].tolist()
    assert ops.index("aten._log_softmax.default") < ops.index("aten.nll_loss_forward.default")
    assert "fused_standins" in read_metadata(tmp_path / "ln")  # installed, nothing stood in
    assert read_metadata(tmp_path / "ln")["fused_standins"] == {"rms_norm": 0, "composite": 0}


def test_a_double_backward_differentiates_through_the_composite(tmp_path):
    """With create_graph the backward runs the composite, as CUDA's formula does in grad mode (a graph to
    differentiate again); the second backward reaches the weight."""
    with torch.device("meta"):
        model = nn.RMSNorm(D, dtype=torch.bfloat16)
        x = torch.empty(N, D, dtype=torch.bfloat16, requires_grad=True)
    with Tracer(tmp_path / "twice", model=model):
        (grad,) = torch.autograd.grad(model(x).float().sum(), x, create_graph=True)
        grad.float().sum().backward()
    df = load(tmp_path / "twice")
    assert (df["op"] == "aten._fused_rms_norm.default").sum() == 1
    assert "aten._fused_rms_norm_backward.default" not in set(df["op"])
    assert "aten.rsqrt.default" in set(df.loc[df["phase"] == "backward", "op"])  # the composite, recomputed
    assert model.weight.grad.shape == (D,)


def test_forward_mode_ad_takes_the_composite(tmp_path):
    """A dual input (torch.autograd.forward_ad) on meta: the stand-in has no forward formula, so rms_norm runs the
    composite there, as without the tracer, rather than raising into the program."""
    import torch.autograd.forward_ad as fwAD

    with torch.device("meta"):
        model = nn.RMSNorm(D)
        x = torch.empty(N, D)
    with Tracer(tmp_path / "dual", model=model), fwAD.dual_level():
        tangent = fwAD.unpack_dual(model(fwAD.make_dual(x, torch.ones_like(x)))).tangent
    assert tangent.shape == (N, D)
    assert read_metadata(tmp_path / "dual")["fused_standins"] == {"rms_norm": 0, "composite": 1}
    assert "aten._fused_rms_norm.default" not in set(load(tmp_path / "dual")["op"])


def test_real_tensors_under_a_fake_trace_are_not_counted(tmp_path):
    """With fake tensors on the CPU the kernel sits on every CPU tensor's autograd key: a real tensor's rms_norm
    runs as without the tracer (the same values) and is none of the model's calls, so not a composite one."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    torch.manual_seed(0)
    real = torch.randn(N, D)
    expected = F.rms_norm(real, (D,))
    with FakeTensorMode():
        model = nn.RMSNorm(D)
        x = torch.randn(N, D)
        with Tracer(tmp_path / "fake", model=model):
            model(x)
            with unset_fake_temporarily():
                got = F.rms_norm(real, (D,))
    assert torch.equal(got, expected)
    assert read_metadata(tmp_path / "fake")["fused_standins"] == {"rms_norm": 1, "composite": 0}


def test_the_report_and_json_name_the_stand_in(tmp_path, capsys):
    import json

    from reports.output.cli import main

    _rms_norm_step(tmp_path / "meta")
    assert main(["report", "--json", str(tmp_path / "meta")]) in (0, None)
    caveats = {c["code"]: c["message"] for c in json.loads(capsys.readouterr().out)["caveats"]}
    assert caveats["fused_standins"].startswith("1 rms_norm call(s) on meta or fake tensors recorded as CUDA's fused")
    assert ", 0 left decomposed" in caveats["fused_standins"]
    assert main(["report", str(tmp_path / "meta")]) in (0, None)
    assert "fused_standins: 1 rms_norm call(s)" in capsys.readouterr().out
