"""reports.breakdown: traced FLOPs against 2·N·T / 4·N·T / 6·N·T on tiny models, golden numbers."""

import pandas as pd
import pytest
import torch
from torch import nn

import reports
from reports.errors import ReportError
from reports.flops.breakdown import breakdown, explain
from reports.loading.load import load
from tracer import Tracer

B, D, H, K = 32, 8, 16, 4  # tokens (rows of x), input width, hidden width, outputs


class XW(nn.Module):
    """The lecture's linear model y = x @ w, w [D, K] its only parameter."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, K))

    def forward(self, x):
        return x @ self.w


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, H)
        self.fc2 = nn.Linear(H, K)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).square().mean()


class TiedLM(nn.Module):
    """Embedding [V, E] -> Linear(E, E) -> output head that shares the embedding's weight."""

    V, E = 16, 8

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(self.V, self.E)
        self.mix = nn.Linear(self.E, self.E)
        self.head = nn.Linear(self.E, self.V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(self.mix(self.emb(idx))).logsumexp(-1).mean()


def trace(path, model, step, tokens=B, **kwargs):
    from tracer import Tracer

    with Tracer(path, model=model, tokens=tokens, **kwargs):
        step()
    return load(path)


def trace_xw(path, x_requires_grad=False):
    torch.manual_seed(0)
    model = XW()
    x = torch.randn(B, D, requires_grad=x_requires_grad)

    def step():
        y = model(x)
        y.backward(torch.ones_like(y))  # no loss op: the trace is the matmuls and nothing else

    return trace(path, model, step, run_name="xw")


def trace_mlp(path, steps=1, **kwargs):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(B, D)

    def step():
        for _ in range(steps):
            model(x).backward()
            opt.step()
            opt.zero_grad()

    return trace(path, model, step, **kwargs)


@pytest.fixture(scope="module")
def xw(tmp_path_factory):
    return trace_xw(tmp_path_factory.mktemp("xw") / "xw")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return trace_mlp(tmp_path_factory.mktemp("mlp") / "mlp")


def test_linear_without_input_grad_is_2NT_both_ways(xw):
    t = breakdown(xw).set_index("phase")
    n, tokens = D * K, B  # N = 8 * 4 = 32 weights, T = 32 rows of x
    assert t.loc["forward", "n_params"] == n and t.loc["forward", "tokens"] == tokens
    # forward: x @ w, [32, 8] @ [8, 4] = 2 * 32 * 8 * 4 = 2,048 = 2·N·T
    assert t.loc["forward", "flops"] == 2 * n * tokens == 2048
    assert t.loc["forward", "weight_matmul_flops"] == 2048
    # backward: only dL/dw = x^T @ dL/dy, [8, 32] @ [32, 4] = 2,048 = 2·N·T; dL/dx is skipped
    assert t.loc["backward", "flops"] == 2 * n * tokens == 2048
    assert t.loc["backward", "expected_flops"] == 4 * n * tokens
    assert t.loc["backward", "ratio"] == 0.5
    assert t.loc["total", "flops"] == 4096 and t.loc["total", "expected_flops"] == 6 * n * tokens
    assert pd.isna(t.loc["optimizer", "expected_flops"]) and t.loc["optimizer", "flops"] == 0
    text = "\n".join(explain(xw))
    assert "needs no gradient" in text
    assert "w (32 parameters: 2,048 FLOPs)" in text  # the skipped dL/dx: 2 * 32 * 8 * 4
    assert "the backward is 2·N·T, not 4·N·T" in text


def test_linear_with_input_grad_is_4NT(tmp_path):
    t = breakdown(trace_xw(tmp_path / "xg", x_requires_grad=True)).set_index("phase")
    # dL/dx = dL/dy @ w^T, [32, 4] @ [4, 8] = 2,048 more: 4,096 = 4·N·T
    assert t.loc["backward", "flops"] == t.loc["backward", "expected_flops"] == 4 * 32 * 32


def test_mlp_weight_matmuls(mlp):
    t = breakdown(mlp).set_index("phase")
    n = D * H + H * K  # 8 * 16 + 16 * 4 = 192 weights in matmuls (biases are added, not multiplied)
    assert t.loc["total", "n_params"] == 192 and t.loc["total", "n_kind"] == "matmul"
    # forward: fc1 2 * 32 * 8 * 16 = 8,192 + fc2 2 * 32 * 16 * 4 = 4,096 = 12,288 = 2·N·T exactly
    assert t.loc["forward", "weight_matmul_flops"] == 2 * n * B == 12288
    # backward: 4·N·T = 24,576, less fc1's input gradient (x is data): 2 * 32 * 8 * 16 = 8,192
    assert t.loc["backward", "weight_matmul_flops"] == 4 * n * B - 2 * B * D * H == 16384
    assert t.loc["forward", "attention_flops"] == t.loc["backward", "attention_flops"] == 0
    for phase in ("forward", "backward", "optimizer", "total"):
        row = t.loc[phase]
        assert row["weight_matmul_flops"] + row["attention_flops"] + row["other_flops"] == row["flops"]
    # AdamW's _foreach ops: FLOPs of their own, no expectation, all "other"
    assert t.loc["optimizer", "flops"] == t.loc["optimizer", "other_flops"] > 0
    assert pd.isna(t.loc["optimizer", "ratio"])
    assert t.loc["total", "flops"] == t.loc[["forward", "backward", "optimizer"], "flops"].sum()
    lines = explain(mlp)
    assert lines[0].startswith("mlp: per training step (1 step traced; T = 32 tokens per step; N = 192 ")
    text = "\n".join(lines)
    assert "fc1.weight (128 parameters: 8,192 FLOPs)" in text
    assert "Optimizer: " in text and "Output head" not in text  # no embedding: fc2 is a layer, not an LM head


def test_mlp_other_n_choices(mlp):
    # total: 192 weights + 16 + 4 biases = 212; no embedding, so non_embedding is the same
    assert breakdown(mlp, n="total")["n_params"].iloc[0] == 212
    assert breakdown(mlp, n="non_embedding")["n_params"].iloc[0] == 212
    given = breakdown(mlp, n=100, tokens=10).set_index("phase")
    assert given.loc["forward", "expected_flops"] == 2 * 100 * 10
    assert given.loc["forward", "n_kind"] == "given" and given.loc["forward", "tokens"] == 10
    assert "20 parameters of biases and norms" in "\n".join(explain(mlp, n="total"))


def test_flops_are_per_step(tmp_path, mlp):
    two = breakdown(trace_mlp(tmp_path / "two", steps=2, run_name="two")).set_index("phase")
    one = breakdown(mlp).set_index("phase")
    assert (two["steps"] == 2).all()
    for col in ("flops", "weight_matmul_flops", "other_flops"):
        assert two.loc["forward", col] == one.loc["forward", col]
        assert two.loc["backward", col] == one.loc["backward", col]


def test_tied_head_counts_once_and_its_gradient_is_a_weight_matmul(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    idx = torch.randint(0, TiedLM.V, (B,))
    df = trace(tmp_path / "tied", model, lambda: model(idx).backward(), run_name="tied")
    t = breakdown(df).set_index("phase")
    n = 8 * 8 + 16 * 8  # mix.weight 64 + the shared emb/head weight 128, once = 192
    assert t.loc["forward", "n_params"] == n
    assert t.loc["forward", "weight_matmul_flops"] == 2 * n * B
    # every weight's input needs a gradient here (the embedding is trained), and the head's
    # dL/dW is summed into the embedding's gradient: still a weight matmul, 4·N·T exactly
    assert t.loc["backward", "weight_matmul_flops"] == 4 * n * B
    assert t.loc["backward", "attention_flops"] == 0
    # non_embedding: total 128 + 64 + 8 = 200 less the 128 embedding = 72, the tied head left out
    assert breakdown(df, n="non_embedding")["n_params"].iloc[0] == 72
    text = "\n".join(explain(df, n="non_embedding"))
    assert "leaves the embedding out of N, and with it this head" in text


def test_attention_matmuls_and_fused_kernel(tmp_path):
    b, h, s, e = 2, 2, 8, 4  # batch, heads, sequence, head width; d = h * e = 8

    class Attn(nn.Module):
        def __init__(self, fused):
            super().__init__()
            self.qkv = nn.Linear(h * e, 3 * h * e, bias=False)
            self.fused = fused

        def forward(self, x):
            q, k, v = self.qkv(x).view(b, s, 3, h, e).permute(2, 0, 3, 1, 4)
            if self.fused:
                y = nn.functional.scaled_dot_product_attention(q, k, v)
            else:
                y = (q @ k.transpose(-1, -2)).softmax(-1) @ v
            return y.sum()

    x = torch.randn(b, s, h * e, requires_grad=True)
    for fused in (False, True):
        model = Attn(fused)
        df = trace(tmp_path / f"attn{fused}", model, lambda: model(x).backward(), tokens=b * s)
        t = breakdown(df).set_index("phase")
        # scores q @ k^T and att @ v: 2 * (2 * b * h * s * s * e) = 2 * 2,048 = 4,096 forward
        assert t.loc["forward", "attention_flops"] == 4096
        # matmul attention: backward = 2x forward; fused: 2.5x (the kernel recomputes q @ k^T)
        assert t.loc["backward", "attention_flops"] == (10240 if fused else 8192)
        text = "\n".join(explain(df))
        assert "L·S·d = 64" in text  # 4,096 / (4 * T) with T = 16: 1 layer x 8 positions x width 8
        assert ("recomputes q @ kᵀ: 2,048 FLOPs of recomputation" in text) == fused  # 2 * b * h * s * s * e

        # an evaluation under no_grad in the step (nanoGPT's estimate_loss): its attention is no training's L·S·d
        def train_and_evaluate():
            with torch.no_grad():
                model(x)
            model(x).backward()

        df = trace(tmp_path / f"eval{fused}", model, train_and_evaluate, tokens=b * s)
        assert breakdown(df).set_index("phase").loc["forward", "attention_flops"] == 2 * 4096  # both forwards
        text = "\n".join(explain(df))
        assert "L·S·d = 64" in text  # it was 128: the evaluation's 4,096 counted as training's forward
        assert ("backward 10,240 (2.500 x forward)" if fused else "backward 8,192 (2.000 x forward)") in text
        assert "Another 4,096 FLOPs per step of attention ran in forward passes that no backward reads" in text


class _SelfAttention(nn.Module):
    """q, k, v from x (or k, v from `memory`: cross-attention), fused attention, causal or not as built."""

    def __init__(self, causal, width=8, heads=2):
        super().__init__()
        self.q, self.kv, self.causal, self.heads = nn.Linear(width, width), nn.Linear(width, 2 * width), causal, heads

    def forward(self, x, memory=None):
        b, s, w = x.shape
        split = lambda t: t.view(b, -1, self.heads, w // self.heads).transpose(1, 2)  # noqa: E731
        k, v = self.kv(x if memory is None else memory).chunk(2, -1)
        y = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(k), split(v), is_causal=self.causal)
        return y.transpose(1, 2).reshape(b, s, w)


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = _SelfAttention(causal=False)

    def forward(self, x):
        return self.self_attn(x)


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.cross_attn = _SelfAttention(causal=True), _SelfAttention(causal=False)

    def forward(self, y, memory):
        return self.cross_attn(self.self_attn(y), memory)


class _EncoderDecoder(nn.Module):
    def __init__(self, decoder=True):
        super().__init__()
        self.encoder = _Encoder()
        self.decoder = _Decoder() if decoder else None

    def forward(self, x, y):
        memory = self.encoder(x)
        return (memory if self.decoder is None else self.decoder(y, memory)).square().mean()


def _explain_encoder_decoder(path, decoder):
    torch.manual_seed(0)
    model = _EncoderDecoder(decoder)
    x, y = torch.randn(2, 4, 8), torch.randn(2, 4, 8)
    return "\n".join(explain(trace(path, model, lambda: model(x, y).backward(), tokens=8)))


def test_explain_says_causal_only_where_the_causal_column_does(tmp_path):
    text = _explain_encoder_decoder(tmp_path / "encdec", decoder=True)
    # the decoder's self-attention ran is_causal=True; the encoder's self-attention and the decoder's cross-attention
    # did not (it said "Causal attention: the full score matrix is counted ..." for all three)
    assert (
        "Causal attention (the causal column) in decoder.self_attn: the full score matrix is counted (as PaLM "
        "does), though a causal kernel can skip the masked half. Attention that is not causal (the causal column) "
        "in decoder.cross_attn, encoder.self_attn: every score is computed, and counted."
    ) in text
    assert (
        "multiply activations by activations (fused attention kernels, which compute q @ kᵀ and softmax(·) @ v: "
        "aten._scaled_dot_product_flash_attention_for_cpu.default)"
    ) in text
    encoder = _explain_encoder_decoder(tmp_path / "enc", decoder=False)
    assert (
        "Attention that is not causal (the causal column) in encoder.self_attn: every score is computed, and counted."
    ) in encoder
    assert "Causal attention" not in encoder


def test_explain_names_activation_products_by_their_ops(tmp_path):
    """A state-space-like mixer whose activation x activation products are bmm, with no softmax: not "q @ kᵀ"."""

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_proj = nn.Linear(4, 8, bias=False)

        def forward(self, x):
            u, g = self.in_proj(x).chunk(2, -1)  # [2, 4, 4] each
            state = torch.bmm(u.transpose(1, 2), g)  # [2, 4, 4] @ [2, 4, 4]: 2·2·4·4·4 = 256 FLOPs
            return torch.bmm(u, state).square().mean()  # another 256

    torch.manual_seed(0)
    model, x = Mixer(), torch.randn(2, 4, 4)
    text = "\n".join(explain(trace(tmp_path / "mixer", model, lambda: model(x).backward(), tokens=8)))
    # forward 2 x 256 = 512; backward: both inputs of each bmm need a gradient, 2 bmms of 256 each per bmm = 1,024
    assert "Activation x activation matmuls: 1,536 FLOPs (" in text
    assert (
        "multiply activations by activations (matmuls of two activations: aten.bmm.default), so no parameter "
        "accounts for them"
    ) in text
    assert "q @ kᵀ" not in text and "softmax(·)" not in text and "ausal" not in text


def test_errors(xw, tmp_path):
    with pytest.raises(
        ReportError,
        match=r"breakdown: n must be one of 'matmul', 'total', 'non_embedding' or a positive int, got 'bogus'",
    ):
        breakdown(xw, n="bogus")
    with pytest.raises(ReportError, match=r"explain: n must be one of .* got True"):
        explain(xw, n=True)
    with pytest.raises(
        ReportError, match=r"breakdown: tokens must be a positive int \(tokens per training step\), got 0"
    ):
        breakdown(xw, tokens=0)
    with pytest.raises(ReportError, match=r"breakdown: the trace lacks column\(s\) \['flop_kind'\]; load it with them"):
        breakdown(xw.drop(columns=["flop_kind"]))
    with pytest.raises(ReportError, match=r"explain: the trace lacks column\(s\) \['input_shapes'\]"):
        explain(xw.drop(columns=["input_shapes"]))
    with pytest.raises(ReportError, match=r"expected a DataFrame returned by reports.load"):
        breakdown(pd.DataFrame(xw))  # attrs dropped

    no_tokens = trace_mlp(tmp_path / "no_tokens", run_name="nt", tokens=None)
    with pytest.raises(ReportError, match=r"breakdown: run 'nt' has no tokens per step in its metadata; pass tokens="):
        breakdown(no_tokens)
    assert breakdown(no_tokens, tokens=B)["tokens"].iloc[0] == B

    from tracer import Tracer

    w = torch.randn(D, K, requires_grad=True)
    with Tracer(tmp_path / "no_model", tokens=B, run_name="bare"):
        (torch.randn(B, D) @ w).sum().backward()
    with pytest.raises(ReportError, match=r"run 'bare' has no parameter metadata, .* Tracer\(\.\.\., model=model\)"):
        breakdown(load(tmp_path / "no_model"))


def test_parameter_counts_missing(mlp):
    df = mlp.copy()
    df.attrs = {"runs": {"mlp": {k: v for k, v in mlp.attrs["runs"]["mlp"].items() if k != "params"}}}
    with pytest.raises(ReportError, match=r"breakdown: run 'mlp' has no parameter counts; .* or pass n=<int>"):
        breakdown(df, n="total")
    assert breakdown(df, n="matmul")["n_params"].iloc[0] == 192  # counted from the trace itself


# ------------------------------------------------------------------ cases found in review
def _tiny_gpt_trace(path, *, tie=False, dtype=None, extra_forward=False):
    import gpt

    torch.manual_seed(0)
    cfg = gpt.GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16, tie_weights=tie)
    model = gpt.GPT(cfg)
    opt = gpt.make_optimizer(model)
    idx, targets = gpt.make_batch(cfg, 2)
    with Tracer(path, model=model, tokens=16):  # T = 2 * 8
        gpt.train_step(model, opt, idx, targets, dtype)
        if extra_forward:
            model(idx, targets)  # the trace ends in the middle of step 1
    return reports.load(path)


def test_tied_weights_under_bf16_autocast_keep_4NT_backward(tmp_path):
    # the head's dW goes mm -> cast to fp32 -> add to the embedding's gradient: two hops
    df = _tiny_gpt_trace(tmp_path / "tied_bf16.parquet", tie=True, dtype=torch.bfloat16)
    table = reports.breakdown(df).set_index("phase")
    N = int(table.loc["total", "n_params"])
    assert N == 3584  # 768 + 256 + 1024 + 1024 + 512, the tied head counted once
    assert table.loc["backward", "weight_matmul_flops"] == 4 * N * 16  # 229,376


def test_a_trace_cut_mid_step_averages_each_phase_over_its_own_steps(tmp_path):
    whole = reports.breakdown(_tiny_gpt_trace(tmp_path / "one.parquet")).set_index("phase")
    cut = reports.breakdown(_tiny_gpt_trace(tmp_path / "cut.parquet", extra_forward=True)).set_index("phase")
    for phase in ("forward", "backward", "optimizer"):
        assert cut.loc[phase, "flops"] == whole.loc[phase, "flops"]


def test_a_model_without_matmuls_reports_instead_of_crashing(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3, padding=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "conv.parquet"
    with Tracer(path, model=model, tokens=16):
        model(torch.randn(2, 4, 8)).sum().backward()
        opt.step()
    table = reports.breakdown(reports.load(path)).set_index("phase")
    assert table.loc["total", "n_params"] == 0 and table.loc["forward", "flops"] > 0


# ------------------------------------------------------------------ explain tells the truth
def test_an_evaluation_pass_under_no_grad_is_its_own_line(tmp_path):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(B, D)

    def step():
        with torch.no_grad():
            model(torch.randn(B, D))  # evaluation on another batch, in the same step
        model(x).backward()

    df = trace(tmp_path / "eval", model, step)
    text = "\n".join(explain(df))
    # training's forward: fc1 2·32·8·16 = 8,192 + fc2 2·32·16·4 = 4,096 = 12,288 = 2·N·T (N = 192); the evaluation
    # pass's 12,288 more is its own line, not a weight "shared, or called twice"
    assert "Forward weight matmuls: 12,288 FLOPs = 2.00·N·T" in text
    assert (
        "Evaluation: 12,288 FLOPs per step of forward matmuls ran with grad mode off (grad_mode no_grad; weight "
        "matmuls 12,288): an evaluation pass, which no backward follows." in text
    )
    assert "Above 2·N·T" not in text and "Forward work without a backward" not in text
    assert breakdown(df).set_index("phase").loc["forward", "weight_matmul_flops"] == 2 * 12288
    # skipped dL/dx over training's forward only: fc1's, 8,192 (not 16,384 with the evaluation's)
    assert "Skipped: fc1.weight (128 parameters: 8,192 FLOPs)." in text


def _train_then_evaluate_the_same_batch(path):
    """One step: a training forward, backward and SGD step, and between the backward and the step an evaluation of the
    same model under no_grad on the batch being trained (its first layer reads what fc1's dL/dW reads)."""
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(B, D)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(x).backward()
        with torch.no_grad():
            model(x)
        opt.step()

    return trace(path, model, step)


def _as_v3(path, to):
    """The trace at `path` rewritten at `to` as a v3 trace: no grad_mode column, schema_version 3."""
    import json

    import pyarrow.parquet as pq

    from tracer.schema import METADATA_KEY, V4_DEFAULTS, part_paths, read_part

    to.mkdir()
    for part in part_paths(path):
        table = read_part(part)
        meta = dict(json.loads(table.schema.metadata[METADATA_KEY]), schema_version=3)
        table = table.drop_columns(list(V4_DEFAULTS)).replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
        pq.write_table(table, to / part.rsplit("/", 1)[1])
    return to


def test_an_evaluation_of_the_batch_being_trained_is_evaluation_by_its_grad_mode(tmp_path):
    from reports.sql.engine import Trace
    from reports.sql.flops import frame

    df = _train_then_evaluate_the_same_batch(tmp_path / "t")
    # training: t, addmm, relu, detach, t, addmm, pow, mean, ones_like (the loss's gradient seed); the evaluation: t,
    # addmm, relu, t, addmm, pow, mean
    assert df.loc[df["phase"] == "forward", "grad_mode"].astype(str).value_counts().to_dict() == {
        "grad": 9,
        "no_grad": 7,
    }
    text = "\n".join(explain(df))
    # training's forward: fc1 2·32·8·16 = 8,192 + fc2 2·32·16·4 = 4,096 = 12,288 = 2·N·T (N = 192); the evaluation's
    # 12,288 ran under no_grad. Before the grad_mode column its fc1 (whose input fc1's dL/dW reads) counted as
    # training: fc1 "2.00x (64 tokens)", and the skipped dL/dx doubled to 16,384
    assert "Forward weight matmuls: 12,288 FLOPs = 2.00·N·T" in text and "Above 2·N·T" not in text
    assert (
        "Evaluation: 12,288 FLOPs per step of forward matmuls ran with grad mode off (grad_mode no_grad; weight "
        "matmuls 12,288): an evaluation pass, which no backward follows." in text
    )
    assert "Forward work without a backward" not in text
    # the skipped dL/dx over training's forward only: fc1's, 2·32·8·16 = 8,192
    assert "never computed because the input x needs no gradient" in text
    assert "Skipped: fc1.weight (128 parameters: 8,192 FLOPs)." in text
    assert breakdown(df).set_index("phase").loc["forward", "weight_matmul_flops"] == 2 * 12288  # both forwards: 24,576
    with Trace(tmp_path / "t") as sql:  # the SQL engine's frame says the same
        assert explain(frame(sql)) == explain(df)


def test_a_v3_trace_without_grad_mode_reads_and_reports_as_before(tmp_path):
    from reports.sql.engine import Trace
    from reports.sql.flops import frame

    _train_then_evaluate_the_same_batch(tmp_path / "t")
    df = load(_as_v3(tmp_path / "t", tmp_path / "v3"))
    assert df["grad_mode"].isna().all() and len(df) == 45  # 16 forward, 25 backward, 4 optimizer rows
    text = "\n".join(explain(df))
    # as v3 read it: the evaluation's fc1 reads the batch fc1's dL/dW reads, so it counts as training (2 x 32 tokens);
    # its fc2, 2·32·16·4 = 4,096, is forward work without a backward; the skipped dL/dx is 2 x 8,192
    assert "fc1.weight 2.00x (64 tokens)" in text
    assert "Forward work without a backward: 4,096 FLOPs per step of forward weight matmuls" in text
    assert "Skipped: fc1.weight (128 parameters: 16,384 FLOPs)." in text and "Evaluation:" not in text
    with Trace(tmp_path / "v3") as sql:  # the SQL engine reads a v3 trace, grad_mode null
        assert explain(frame(sql)) == explain(df)
        assert sql.sql("SELECT count(*) AS n, count(grad_mode) AS known FROM rows").iloc[0].tolist() == [45, 0]


def test_frozen_weights_get_the_flops_of_their_skipped_weight_gradients(tmp_path):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(B, D)
    model.fc1.requires_grad_(False)
    df = trace(tmp_path / "frozen", model, lambda: model(x).backward())
    text = "\n".join(explain(df))
    # fc1: frozen, its input is data: no dL/dW and no dL/dx, 2·32·8·16 = 8,192 FLOPs each; autograd records
    # nothing, so its forward is work without a backward
    assert "Frozen weights (requires_grad=False) skip dL/dW = xᵀ @ dL/dy" in text
    assert "fc1.weight (128 parameters: 8,192 FLOPs)." in text
    assert "Forward work without a backward: 8,192 FLOPs per step" in text and "frozen weights whose inputs" in text
    # backward: fc2's dL/dW 4,096 only (its input comes from the frozen fc1: no dL/dx)
    assert breakdown(df).set_index("phase").loc["backward", "weight_matmul_flops"] == 4096


@pytest.mark.parametrize(
    "how, words",
    [
        ({"fused": True}, "fused kernel (aten._fused_adamw_.default) counts what the same optimizer's _foreach ops"),
        ({"foreach": True}, "its _foreach ops (foreach=True) count 1 FLOP per element each"),
        ({"foreach": False}, "its per-parameter elementwise ops count 1 FLOP per element"),
    ],
)
def test_the_optimizer_line_says_which_adamw_ran(tmp_path, how, words):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(B, D)
    opt = torch.optim.AdamW(model.parameters(), **how)

    def step():
        model(x).backward()
        opt.step()

    text = "\n".join(explain(trace(tmp_path / "opt", model, step)))
    assert words in text and "over the 212 parameters its steps updated" in text  # 192 weights + 16 + 4 biases


def test_a_tied_head_is_named_by_the_module_that_uses_it(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    df = trace(tmp_path / "tied", model, lambda: model(torch.randint(0, TiedLM.V, (B,))).backward())
    # the head's forward: [32, 8] @ [8, 16] = 2·32·8·16 = 8,192 FLOPs
    assert "Output head: head (its weight emb.weight, 128 parameters, tied to the embedding) costs 8,192 FLOPs" in (
        "\n".join(explain(df))
    )


def test_n_of_a_convolutional_model_says_which_weights_it_counts(tmp_path):
    class PatchNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 8, 4, stride=4)  # stride = kernel: a matmul on 4x4 patches
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.head = nn.Linear(8, 4, bias=False)

        def forward(self, img):
            return self.head(self.conv(self.patch(img)).flatten(2).transpose(1, 2)).sum()

    torch.manual_seed(0)
    model = PatchNet()
    df = trace(
        tmp_path / "patch", model, lambda: model(torch.randn(2, 3, 8, 8)).backward(), tokens=8
    )  # 2 x 2x2 patches
    text = "\n".join(explain(df))
    # N = the head's 8·4 = 32; the convolutions' 8·3·4·4 = 384 and 8·8·3·3 = 576 weights are named and left out
    assert breakdown(df)["n_params"].iloc[0] == 32
    assert "Convolution weights: patch.weight, conv.weight (960 parameters) are not in N" in text
    assert "patch.weight: stride = kernel, a patch embedding" in text and "n=416 counts it" in text  # 32 + 384
    assert "conv.weight: stride" not in text
    assert explain(load(tmp_path / "patch", lists="arrow")) == explain(df)  # the shapes as Arrow lists: the same words


@pytest.mark.parametrize("grad_off", ["no_grad", "inference_mode"])
def test_weights_cast_by_autocast_in_inference_mode_are_weights(tmp_path, grad_off):
    """Under inference_mode autocast's cast of a weight reaches the tracer as aten.to.dtype (and linear whole): it was
    no copy of the weight, so N was 0 and every weight matmul counted as attention."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 32, bias=False))
    with Tracer(tmp_path / grad_off, model=model, tokens=16):
        with getattr(torch, grad_off)(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(16, 64))
    t = breakdown(load(tmp_path / grad_off)).set_index("phase")
    assert t.loc["forward", "n_params"] == 64 * 64 + 32 * 64 == 6144
    # 2·16·64·64 + 2·16·64·32 = 131,072 + 65,536 = 196,608
    assert t.loc["forward", "weight_matmul_flops"] == 196_608 and t.loc["forward", "attention_flops"] == 0


def test_a_gradient_penalty_is_not_called_checkpointing(tmp_path):
    """A double backward (autograd.grad(create_graph=True), then backward) runs more backward weight matmuls than
    4·N·T with no recompute row and no weight used twice: the line named activation checkpointing first."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Tanh(), nn.Linear(16, 4, bias=False))
    x = torch.randn(32, 8, requires_grad=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        (grad,) = torch.autograd.grad(model(x).square().sum(), x, create_graph=True)
        grad.square().sum().backward()
        opt.step()

    df = trace(tmp_path / "gp", model, step)
    line = next(x for x in explain(df) if x.startswith("Backward weight matmuls"))
    assert "a backward ran through the backward's own graph (a gradient penalty" in line
    assert "checkpointing" not in line and not df["recompute"].any()
