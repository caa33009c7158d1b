"""The example GPT's FLOPs in closed form, checked exactly on a tiny configuration.

Tiny config: V = 32 tokens, S = 8 positions, L = 2 layers, H = 2 heads of e = 8, d = 16, batch B = 3.

    T = B * S = 3 * 8 = 24 tokens per step
    weight matrices per layer: qkv 3d*d + proj d*d + fc 4d*d + proj d*4d = 12 d^2 = 12 * 16 * 16 = 3072
    N = L * 12 d^2 + V * d = 2 * 3072 + 32 * 16 = 6144 + 512 = 6656
        (the output head is a matmul; the embeddings are lookups; biases and LayerNorm
        gains are elementwise, so none of those enter N)
    2NT = 2 * 6656 * 24 = 319488     4NT = 638976     6NT = 958464

    attention, per layer: q @ k^T is [B, H, S, e] @ [B, H, e, S]: 2 * B * H * S * S * e
        = 2 * B * S * S * d = 2 * 3 * 8 * 8 * 16 = 6144 FLOPs, and att @ v the same;
    so the forward is 2 * 6144 = 12288 per layer = 4 * d * S * T (4 * 16 * 8 * 24 = 12288),
    the backward 2x that (two matmuls per forward matmul), and forward + backward over the
    L layers is PaLM's 12 * L * d * S * T = 12 * 2 * 16 * 8 * 24 = 73728
    (PaLM writes 12 * L * H * Q * T per token with H * Q = d and T the sequence length).
"""

import gpt
import pandas as pd
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tracer import Tracer, read_metadata

TINY = dict(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=16)
B = 3
T = 24  # B * S = 3 * 8

WEIGHTS = [
    f"blocks.{i}.{name}.weight" for i in range(2) for name in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
] + ["lm_head.weight"]

# Each Linear: its forward matmul and each of its two backward matmuls (dL/dx, dL/dW) cost 2 * T * numel.
LINEARS = [
    (f"blocks.{i}.{name}", flops)
    for i in range(2)
    for name, flops in (
        ("attn.qkv", 36864),  # 2 * 24 * 48 * 16
        ("attn.proj", 12288),  # 2 * 24 * 16 * 16
        ("mlp.fc", 49152),  # 2 * 24 * 64 * 16
        ("mlp.proj", 49152),  # 2 * 24 * 16 * 64
    )
] + [("lm_head", 24576)]  # 2 * 24 * 32 * 16


def run(path, steps=1, dtype=None, **overrides):
    """Trace `steps` AdamW steps of the tiny GPT; return (trace, metadata)."""
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(**{**TINY, **overrides})
    model = gpt.GPT(cfg)
    opt = gpt.make_optimizer(model)
    idx, targets = gpt.make_batch(cfg, B)
    with Tracer(path, model=model, tokens=B * cfg.seq_len, run_name="tiny-gpt"):
        for _ in range(steps):
            gpt.train_step(model, opt, idx, targets, dtype)
    return pd.read_parquet(path), read_metadata(path)


def flop_counter_totals(**overrides):
    """FlopCounterMode's FLOPs per op packet for one training step of the same model and batch."""
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(**{**TINY, **overrides})
    model = gpt.GPT(cfg)
    opt = gpt.make_optimizer(model)
    idx, targets = gpt.make_batch(cfg, B)
    with FlopCounterMode(display=False) as counter:
        gpt.train_step(model, opt, idx, targets)
    return {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}


def per_packet(df):
    """Our FLOPs per op packet ("aten.mm.default" -> "aten.mm"), ops with FLOPs only."""
    packets = df["op"].astype(str).str.rsplit(".", n=1).str[0]
    totals = df.groupby(packets)["flops"].sum()
    return {op: int(flops) for op, flops in totals.items() if flops}


def split_matmuls(df, meta):
    """Matmul rows, with masks: takes a weight, makes a weight's gradient, attention (the rest).

    A weight is a parameter of 2 dims whose storage is an input of some matmul row; this
    leaves out biases (addmm adds them, 0 FLOPs in its formula) and embeddings (lookups).
    Under autocast the matmul reads the weight's bfloat16 copy: the output of an
    aten._to_copy whose input is the parameter's storage.
    """
    mm = df[df["flop_kind"] == "matmul"]
    matrices = {p["storage_id"]: name for name, p in meta["parameters"].items() if len(p["shape"]) == 2}
    copies = df[df["op"] == "aten._to_copy.default"]
    for ins, outs in zip(copies["input_storage_ids"], copies["output_storage_ids"]):
        if int(ins[0]) in matrices:
            matrices[int(outs[0])] = matrices[int(ins[0])]
    used = {int(i) for ids in mm["input_storage_ids"] for i in ids}
    sids = {sid for sid in matrices if sid in used}
    weights = {name: meta["parameters"][name] for sid, name in matrices.items() if sid in sids}
    shapes = {tuple(p["shape"]) for p in weights.values()} | {tuple(p["shape"][::-1]) for p in weights.values()}
    takes_weight = mm["input_storage_ids"].map(lambda ids: bool(sids & {int(i) for i in ids}))
    out_shape = mm["output_shapes"].map(lambda shapes_: tuple(int(n) for n in shapes_[0]))
    # dL/dW = x^T @ dL/dy reads no parameter: it is the backward matmul that produces a weight's shape
    makes_grad = ~takes_weight & (mm["phase"] == "backward") & out_shape.map(lambda s: s in shapes)
    return mm, weights, takes_weight, makes_grad, ~takes_weight & ~makes_grad


@pytest.fixture(scope="module")
def matmul_run(tmp_path_factory):
    """3 steps, attention="matmul" (explicit q @ k^T and att @ v)."""
    return run(tmp_path_factory.mktemp("gpt") / "matmul.parquet", steps=3)


@pytest.fixture(scope="module")
def sdpa_run(tmp_path_factory):
    """1 step, attention="sdpa" (on CPU: _scaled_dot_product_flash_attention_for_cpu)."""
    return run(tmp_path_factory.mktemp("gpt") / "sdpa.parquet", attention="sdpa")


def step0(run_):
    df, meta = run_
    return df[df["step"] == 0], meta


# ------------------------------------------------------------------ parity with FlopCounterMode
def test_flop_parity_with_flop_counter_mode_on_the_matmul_path(matmul_run):
    df, _ = step0(matmul_run)
    reference = flop_counter_totals(attention="matmul")
    assert reference == {
        "aten.addmm": 294912,  # forward Linears with bias: L * 2 * T * 12 d^2 = 2 * 2 * 24 * 3072
        "aten.mm": 663552,  # forward output head 2 * T * V * d = 24576, plus backward 4NT = 638976
        "aten.bmm": 73728,  # attention, forward and backward: 12 * L * d * S * T
    }
    ours = per_packet(df)
    for op, flops in reference.items():
        assert ours[op] == flops, op
    # ...and no other op counts as a matmul
    matmul_ops = set(df.loc[df["flop_kind"] == "matmul", "op"].astype(str).str.rsplit(".", n=1).str[0])
    assert matmul_ops == set(reference)


def test_flop_parity_with_flop_counter_mode_on_sdpa(sdpa_run):
    df, _ = step0(sdpa_run)
    reference = flop_counter_totals(attention="sdpa")
    # FlopCounterMode (torch 2.13) has no formula for the CPU flash kernel: it counts it as 0.
    assert reference == {"aten.addmm": 294912, "aten.mm": 663552}  # 2NT + 4NT = 958464 = 6NT
    ours = per_packet(df)
    for op, flops in reference.items():
        assert ours[op] == flops, op
    extra = {op: flops for op, flops in ours.items() if op not in reference and op.startswith("aten._scaled_dot")}
    assert extra == {
        "aten._scaled_dot_product_flash_attention_for_cpu": 24576,  # L * 12288 = 2 * 12288
        "aten._scaled_dot_product_flash_attention_for_cpu_backward": 61440,  # L * 2.5 * 12288 = 2 * 30720
    }
    counted = df.loc[df["flop_kind"].isin(["matmul", "attention"]), "flops"].sum()
    assert counted - sum(reference.values()) == 86016  # 24576 + 61440: exactly the CPU flash kernel


# ------------------------------------------------------------------ closed forms
@pytest.fixture(
    scope="module",
    params=[{}, {"bias": False}, {"tie_weights": True}],
    ids=["bias", "no-bias", "tied"],
)
def closed_form_run(request, tmp_path_factory, matmul_run):
    """(trace of step 0, metadata, config overrides)."""
    if not request.param:
        return (*step0(matmul_run), {})
    name = "-".join(f"{k}-{v}" for k, v in request.param.items())
    return (*run(tmp_path_factory.mktemp("gpt") / f"{name}.parquet", **request.param), request.param)


def test_weights_entering_matmuls(closed_form_run):
    df, meta, overrides = closed_form_run
    _, weights, *_ = split_matmuls(df, meta)
    expected = list(WEIGHTS)
    if overrides.get("tie_weights"):
        expected[-1] = "wte.weight"  # the head's weight is the token embedding's: one storage
        assert meta["params"]["total"] == 7232  # 7744 - 32 * 16
    assert sorted(weights) == sorted(expected)
    assert sorted(gpt.matmul_params(df, meta)) == sorted(expected)  # what print_summary calls N
    assert sum(p["numel"] for p in weights.values()) == 6656  # N = 2 * 12 * 16 * 16 + 32 * 16
    assert meta["tokens"] == 24  # T = 3 * 8


def test_closed_form_forward_2NT_backward_4NT_attention_12LdST(closed_form_run):
    df, meta, _ = closed_form_run
    mm, _, takes_weight, makes_grad, attention = split_matmuls(df, meta)
    forward, backward = mm["phase"] == "forward", mm["phase"] == "backward"
    assert set(mm["phase"]) == {"forward", "backward"}  # no matmul in the optimizer

    # forward: every weight is one multiply-add per token: 2NT = 2 * 6656 * 24
    assert mm.loc[forward & takes_weight, "flops"].sum() == 319488
    assert not (forward & makes_grad).any()
    # backward, dL/dx = dL/dy @ W: the same matmul sizes again, 2NT
    assert mm.loc[backward & takes_weight, "flops"].sum() == 319488
    # backward, dL/dW = x^T @ dL/dy: 2NT; together 4NT = 4 * 6656 * 24
    assert mm.loc[backward & makes_grad, "flops"].sum() == 319488
    assert mm.loc[backward & (takes_weight | makes_grad), "flops"].sum() == 638976
    assert (makes_grad.sum(), (backward & takes_weight).sum()) == (9, 9)  # one each per weight

    # attention: activation x activation, all bmm inside the attention modules
    assert set(mm.loc[attention, "op"]) == {"aten.bmm.default"}
    assert set(mm.loc[attention, "module"]) == {"blocks.0.attn", "blocks.1.attn"}
    assert mm.loc[forward & attention, "flops"].sum() == 24576  # 4 * L * d * S * T = 4 * 2 * 16 * 8 * 24
    assert mm.loc[backward & attention, "flops"].sum() == 49152  # twice the forward
    assert mm.loc[attention, "flops"].sum() == 73728  # 12 * L * d * S * T = 12 * 2 * 16 * 8 * 24

    # all matmuls: 6NT + 12 L d S T = 958464 + 73728
    assert mm["flops"].sum() == 1032192


def test_sdpa_backward_is_two_and_a_half_forward(sdpa_run):
    df, _ = step0(sdpa_run)
    att = df[df["flop_kind"] == "attention"]
    fwd = att[att["phase"] == "forward"]
    bwd = att[att["phase"] == "backward"]
    assert list(fwd["op"]) == ["aten._scaled_dot_product_flash_attention_for_cpu.default"] * 2
    assert list(bwd["op"]) == ["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"] * 2
    assert sorted(fwd["module"]) == sorted(bwd["module"]) == ["blocks.0.attn", "blocks.1.attn"]
    # forward: 2 score-sized matmuls, q @ k^T and att @ v: 2 * 6144 = 12288 per layer
    assert list(fwd["flops"]) == [12288, 12288]
    # backward: 5 of them. The fused kernel keeps no [S, S] score matrix, so it recomputes
    # q @ k^T (1), then dL/datt = dL/dy @ v^T (2), dL/dv = att^T @ dL/dy (3),
    # dL/dq = dL/dscores @ k (4), dL/dk = dL/dscores^T @ q (5): 5 * 6144 = 30720 = 2.5 * 12288
    assert list(bwd["flops"]) == [30720, 30720]
    # The full score matrix counts although the mask is causal (as in PaLM and FlopCounterMode).
    assert att["causal"].tolist() == [True] * 4
    # Everything else is as on the matmul path: the Linears still cost 6NT = 958464.
    assert df.loc[df["flop_kind"] == "matmul", "flops"].sum() == 958464


# ------------------------------------------------------------------ attribution
@pytest.mark.parametrize("module, flops", LINEARS)
def test_linear_matmuls_are_attributed_to_their_module(matmul_run, module, flops):
    df, _ = step0(matmul_run)
    mm = df[(df["flop_kind"] == "matmul") & (df["module"] == module)]
    # forward: y = x @ W^T (+ b); backward: dL/dx and dL/dW, both in the Linear's backward
    assert mm.loc[mm["phase"] == "forward", "flops"].tolist() == [flops]
    assert mm.loc[mm["phase"] == "backward", "flops"].tolist() == [flops, flops]


def test_attention_and_other_modules_are_attributed(matmul_run):
    df, _ = step0(matmul_run)
    for layer in (0, 1):
        bmm = df[(df["op"] == "aten.bmm.default") & (df["module"] == f"blocks.{layer}.attn")]
        assert bmm.loc[bmm["phase"] == "forward", "flops"].tolist() == [6144] * 2  # q @ k^T, att @ v
        assert bmm.loc[bmm["phase"] == "backward", "flops"].tolist() == [6144] * 4  # two per forward bmm
        for ln in ("ln1", "ln2"):
            rows = df[df["module"] == f"blocks.{layer}.{ln}"]
            assert set(rows["op"]) >= {"aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"}
    embed = df[df["op"].isin(["aten.embedding.default", "aten.embedding_dense_backward.default"])]
    assert sorted(zip(embed["phase"], embed["module"])) == [
        ("backward", "wpe"),
        ("backward", "wte"),
        ("forward", "wpe"),
        ("forward", "wte"),
    ]
    forward = df[df["phase"] == "forward"]
    # the root module is named by its class: the loss is computed in GPT.forward itself
    assert forward.loc[forward["op"] == "aten.nll_loss_forward.default", "module"].tolist() == ["GPT"]
    modules = set(df["module"])
    assert {"GPT", "blocks.0.attn.qkv", "blocks.1.mlp.act", "ln_f", "lm_head"} <= modules


def test_loss_backward_is_attributed_to_the_root_module(matmul_run):
    df, _ = step0(matmul_run)
    backward = df[df["phase"] == "backward"]
    # the loss is computed in GPT.forward itself: its backward belongs to the root module
    assert backward.loc[backward["op"] == "aten.nll_loss_backward.default", "module"].tolist() == ["GPT"]
    assert backward.loc[backward["op"] == "aten._log_softmax_backward_data.default", "module"].tolist() == ["GPT"]


# ------------------------------------------------------------------ phases and steps
def test_phases_steps_and_foreach_optimizer(matmul_run):
    df, meta = matmul_run
    assert sorted(df["step"].unique()) == [0, 1, 2]  # the step advances after each opt.step()
    assert {"forward", "backward", "optimizer"} <= set(df["phase"])
    assert df["seq"].tolist() == list(range(len(df)))
    for step in (0, 1, 2):
        rows = df[df["step"] == step]
        assert rows.loc[rows["flop_kind"] == "matmul", "flops"].sum() == 1032192  # 6NT + 12 L d S T
        assert list(dict.fromkeys(rows["phase"])) == ["forward", "backward", "optimizer"]

    opt = df[df["phase"] == "optimizer"]
    foreach = opt[opt["op"].astype(str).str.startswith("aten._foreach_")]
    # AdamW(foreach=True): exp_avg.lerp_(grad, 1 - beta1) and exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    assert {"aten._foreach_lerp_.Scalar", "aten._foreach_addcmul_.Scalar"} <= set(foreach["op"])
    assert set(df.loc[df["op"].astype(str).str.startswith("aten._foreach_"), "phase"]) == {"optimizer"}
    # one lerp_ per step over all 29 parameter tensors (exp_avgs and grads: 2 * 29 inputs):
    # wte, wpe, 12 per block (2 LayerNorms, 4 Linears, weight and bias each) * 2, ln_f (2), lm_head (1)
    lerp = foreach[foreach["op"] == "aten._foreach_lerp_.Scalar"]
    assert lerp["step"].tolist() == [0, 1, 2]
    shapes = lerp["input_shapes"].iloc[0]
    assert len(shapes) == 58  # 2 * 29
    assert sum(int(torch.Size(s).numel()) for s in shapes[:29]) == 7744 == meta["params"]["total"]


def test_metadata(matmul_run):
    _, meta = matmul_run
    assert meta["complete"] is True
    assert meta["root_module"] == "GPT"
    assert meta["tokens"] == 24  # B * S = 3 * 8
    # total: wte 32*16 + wpe 8*16 + 2 * 3280 per block + ln_f 2*16 + lm_head 32*16
    #      = 512 + 128 + 6560 + 32 + 512 = 7744; per block: 2 LayerNorms 2 * 32,
    #        qkv 768 + 48, proj 256 + 16, fc 1024 + 64, proj 1024 + 16 = 3280
    assert meta["params"] == {"total": 7744, "trainable": 7744, "embedding": 640}  # 512 + 128


def test_bf16_autocast_changes_dtypes_not_flops(tmp_path):
    df, meta = run(tmp_path / "bf16.parquet", dtype=torch.bfloat16)
    mm, weights, takes_weight, makes_grad, attention = split_matmuls(df, meta)
    forward = mm["phase"] == "forward"
    assert sorted(weights) == sorted(WEIGHTS)
    assert sorted(gpt.matmul_params(df, meta)) == sorted(WEIGHTS)
    assert mm.loc[forward & takes_weight, "flops"].sum() == 319488  # 2NT, as in float32
    assert mm.loc[makes_grad, "flops"].sum() == 319488  # dL/dW: 2NT
    assert mm["flops"].sum() == 1032192  # 6NT + 12 L d S T
    # autocast casts the weights to bfloat16 (_to_copy) before each matmul
    assert {d for dtypes in mm["input_dtypes"] for d in dtypes} == {"bfloat16"}


# ------------------------------------------------------------------ the model itself
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"d_model": 15}, r"GPTConfig.d_model \(15\) must be a multiple of n_head \(2\)"),
        ({"attention": "flash"}, r"GPTConfig.attention must be one of \('matmul', 'sdpa'\), got 'flash'"),
        ({"n_layer": 0}, r"GPTConfig.n_layer must be a positive int, got 0"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        gpt.GPTConfig(**{**TINY, **overrides})


def test_matmul_and_sdpa_attention_agree():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**TINY))
    idx, targets = gpt.make_batch(model.cfg, B)
    loss = model(idx, targets)
    model.cfg.attention = "sdpa"
    for block in model.blocks:
        block.attn.attention = "sdpa"
    torch.testing.assert_close(model(idx, targets), loss)
    assert model(idx).shape == (3, 8, 32)  # [B, S, V]
