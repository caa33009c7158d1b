"""On the meta device, scaled_dot_product_attention is traced as the fused kernel a GPU would run
(tracer.recording.meta_attention), not PyTorch's math path; meta_attention="math" keeps the math path and the
report says so.

Shapes: b = 2, h = 4, s = 16, d = 32. Attention forward 2·b·h·s·s·(d_qk + d_v) = 2 * 2 * 4 * 16 * 16 * 64
= 262,144 FLOPs; a fused backward recomputes the scores: 2·b·h·s·s·(3·d_qk + 2·d_v) = 2 * 2 * 4 * 256 * 160
= 655,360."""

import json

import pytest
import torch
import torch.nn.functional as F

import reports
import tracer
from reports.output.cli import main
from tests import helpers
from tracer import TraceError, Tracer

B, H, S, D = 2, 4, 16, 32
FORWARD = 2 * B * H * S * S * (D + D)  # 262,144
BACKWARD = 2 * B * H * S * S * (3 * D + 2 * D)  # 655,360


class Attend(torch.nn.Module):
    def __init__(self, heads_kv=H, mask=False, gqa=False):
        super().__init__()
        self.q = torch.nn.Parameter(torch.empty(B, H, S, D))
        self.kv = torch.nn.Parameter(torch.empty(B, heads_kv, S, D))
        self.mask, self.gqa = mask, gqa

    def forward(self):
        mask = torch.ones(S, S, dtype=torch.bool, device=self.q.device).tril() if self.mask else None
        return F.scaled_dot_product_attention(
            self.q, self.kv, self.kv, attn_mask=mask, is_causal=not self.mask, enable_gqa=self.gqa
        )


def trace(path, dtype, meta_attention="fused", **kwargs):
    with torch.device("meta"):
        model = Attend(**kwargs).to(dtype)
    with Tracer(path, model=model, meta_attention=meta_attention):
        out = model()
        out.sum().backward()
    assert out.shape == (B, H, S, D) and out.dtype == dtype and out.device.type == "meta"
    return reports.load(path), tracer.read_metadata(path)


def _attention(df):
    return df[df["flop_kind"] == "attention"]


def test_bf16_runs_the_flash_kernel_with_its_flops_and_causal_flag(tmp_path):
    df, meta = trace(tmp_path / "t", torch.bfloat16)
    rows = _attention(df)
    assert list(rows["op"]) == [
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_flash_attention_backward.default",
    ]
    assert list(rows["flops"]) == [FORWARD, BACKWARD]
    assert rows["causal"].tolist() == [True, True]
    assert not (df["op"] == "aten.bmm.default").any()  # no math path
    assert meta["attention"] == {"meta": "fused", "flash": 1, "efficient": 0, "math": 0}


def test_fp32_and_a_mask_run_the_memory_efficient_kernel(tmp_path):
    df, meta = trace(tmp_path / "t", torch.float32)
    assert list(_attention(df)["op"]) == [
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_efficient_attention_backward.default",
    ]
    assert list(_attention(df)["flops"]) == [FORWARD, BACKWARD]
    df, meta = trace(tmp_path / "m", torch.bfloat16, mask=True)  # a mask: the efficient kernel takes it as a bias
    assert meta["attention"] == {"meta": "fused", "flash": 0, "efficient": 1, "math": 0}
    assert list(_attention(df)["flops"]) == [FORWARD, BACKWARD]


def test_grouped_query_attention_runs_flash(tmp_path):
    df, meta = trace(tmp_path / "t", torch.bfloat16, heads_kv=2, gqa=True)
    assert meta["attention"]["flash"] == 1
    assert list(_attention(df)["flops"]) == [FORWARD, BACKWARD]  # h counts the query heads


def test_math_path_is_kept_on_request_and_flagged_in_the_report(tmp_path, capsys):
    df, meta = trace(tmp_path / "t", torch.bfloat16, meta_attention="math")
    assert meta["attention"] == {"meta": "math", "flash": 0, "efficient": 0, "math": 1}
    assert not len(_attention(df)) and (df["op"] == "aten.bmm.default").sum() >= 2  # the scores, then @ v
    assert main(["report", str(tmp_path / "t")]) == 0
    assert (
        "1 scaled_dot_product_attention call(s) ran PyTorch's math path on the meta device"
        in helpers.unwrapped(capsys.readouterr().out)  # the caveat, wrapped to the width
    )
    assert main(["report", str(tmp_path / "t"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attention"]["math"] == 1


class Checkpointed(torch.nn.Module):
    """q = x Wq, then attention over it, checkpointed as a block: the backward re-runs the attention."""

    def __init__(self):
        super().__init__()
        self.wq = torch.nn.Linear(D, D, bias=False)

    def block(self, x):
        q = self.wq(x)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    def forward(self, x, reentrant):
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoints_re_run_runs_the_same_kernel(tmp_path, reentrant):
    """The re-run happens in the backward, where no torch-function mode is active: a math path there saves other
    tensors than the forward's flash kernel did, and a non-reentrant checkpoint raised CheckpointError."""
    with torch.device("meta"):
        model = Checkpointed().to(torch.bfloat16)
        x = torch.empty(B, H, S, D, dtype=torch.bfloat16, requires_grad=True)
    with Tracer(tmp_path / "t", model=model):
        model(x, reentrant).sum().backward()
    meta = tracer.read_metadata(tmp_path / "t")
    assert meta["complete"] and meta["attention"] == {"meta": "fused", "flash": 2, "efficient": 0, "math": 0}
    df = reports.load(tmp_path / "t")
    rows = _attention(df)
    assert rows["op"].tolist() == ["aten._scaled_dot_product_flash_attention.default"] * 2 + [
        "aten._scaled_dot_product_flash_attention_backward.default"
    ]
    assert rows["recompute"].tolist() == [False, True, False]
    assert rows["flops"].tolist() == [FORWARD, FORWARD, BACKWARD]
    assert not (df["op"] == "aten.bmm.default").any()  # no math path, also in the re-run
    q = torch.empty(B, H, S, D, dtype=torch.bfloat16, device="meta")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::scaled_dot_product_attention", "AutogradMeta") is False
    assert F.scaled_dot_product_attention(q, q, q).shape == q.shape  # after the trace: untouched


def test_real_tensors_are_untouched(tmp_path):
    torch.manual_seed(0)
    model = Attend().to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    expected = model()
    with Tracer(tmp_path / "t", model=model):
        out = model()
    assert torch.equal(out, expected)
    assert "attention" not in tracer.read_metadata(tmp_path / "t")


def test_bad_meta_attention_is_one_line():
    with pytest.raises(TraceError, match="meta_attention must be one of 'fused', 'math', got 'flash'"):
        Tracer("x", meta_attention="flash")


def test_a_4_layer_model_at_4096_tokens_keeps_the_fused_kernels_memory(tmp_path, capsys):
    """examples/gpt.py's GPT, 4 layers, d 128, 4 heads, S = 4096, bf16 on meta. Each flash forward allocates its
    output [1, 4, 4096, 32] bf16 (1,048,576 bytes), the log-sum-exp [1, 4, 4096] fp32 (65,536) and the philox seed
    (2 x 8) and offset (8): 1,114,136 bytes, never the [1, 4, 4096, 4096] scores. The math path allocates them in fp32:
    1 * 4 * 4096 * 4096 * 4 = 268,435,456 bytes per layer, and the report says so."""
    import sys

    sys.path.insert(0, str(helpers.EXAMPLES))
    from gpt import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=256, seq_len=4096, n_layer=4, n_head=4, d_model=128, bias=False, attention="sdpa")
    frames = {}
    for kind in ("fused", "math"):
        with torch.device("meta"):
            model = GPT(cfg).to(torch.bfloat16)
        idx = torch.zeros(1, 4096, dtype=torch.long, device="meta")
        with Tracer(tmp_path / kind, model=model, tokens=4096, meta_attention=kind):
            model(idx, idx).backward()
        frames[kind] = reports.load(tmp_path / kind)
    fused, math = frames["fused"], frames["math"]
    forward = fused[fused["op"] == "aten._scaled_dot_product_flash_attention.default"]
    assert list(forward["bytes_allocated"]) == [1_114_136] * 4  # 1,048,576 + 65,536 + 16 + 8
    assert list(forward["causal"]) == [True] * 4
    scores = 1 * 4 * 4096 * 4096 * 4  # 268,435,456
    # fused: the largest allocation is the fp32 logits [4096, 256] (4,194,304 bytes), not attention
    assert fused["bytes_allocated"].max() == 4096 * 256 * 4 and math["bytes_allocated"].max() == scores
    by_kind = {
        k: dict(zip(reports.by_category(f)["category"], reports.by_category(f)["bytes"])) for k, f in frames.items()
    }
    assert by_kind["math"]["activations"] > 15 * by_kind["fused"]["activations"]
    assert main(["report", str(tmp_path / "math")]) == 0
    assert (
        "4 scaled_dot_product_attention call(s) ran PyTorch's math path on the meta device"
        in helpers.unwrapped(capsys.readouterr().out)  # the caveat, wrapped to the width
    )
