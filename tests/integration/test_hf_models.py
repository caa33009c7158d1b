"""Hugging Face models people train in 2026, each one AdamW step from a tiny config built in code.

Every model: hidden 32, 2 layers, 4 heads of 8 (2 KV heads where the model has GQA), vocabulary 128,
batch B = 2 of S = 16 tokens (T = 32), random weights (nothing downloaded). For each, the traced step
computes bit for bit what the untraced one does; the matmul, attention and convolution FLOPs of each
phase equal `torch.utils.flop_counter.FlopCounterMode`'s on the ops it counts, and a closed form on the
ops it has no formula for (the CPU flash-attention kernel and `_grouped_mm`: it counts 0 for them);
the forward weight matmuls are exactly 2·N_active·T; the memory categories add up to live_bytes and
hold the parameters, their gradients and AdamW's two moments (+ one 4-byte step per tensor).

Closed forms used below (d = 32, h = 4 query heads of 8, kv = 2 heads of 8, f = 64, V = 128):
    attention, one layer, forward: q @ kᵀ and p @ v, 2·B·h·S·S·8 each = 2 x 2·2·4·16·16·8 = 65,536
    Llama block: q 32·32 + k 32·16 + v 32·16 + o 32·32 = 3,072; gate, up, down 3·32·64 = 6,144: 9,216
"""

import contextlib
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import reports
from tests.helpers import tiny_gpt2, trainer_arguments
from tracer import Tracer

# transformers, set by `_transformers` before this module's first test; not imported at the top, where every
# pytest-xdist worker importing the module to collect it paid about 0.7 CPU-s for it, running these tests or not.
tf = None


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    """transformers as `tf`; the module's tests skipped when it is not installed."""
    global tf
    tf = pytest.importorskip("transformers")


B, S, V, T = 2, 16, 128, 32
KINDS = ("matmul", "attention", "conv")
CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu"  # FlopCounterMode has no formula for it
COMMON = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)


def llama(attn="sdpa"):
    return tf.LlamaForCausalLM(
        tf.LlamaConfig(intermediate_size=64, num_key_value_heads=2, attn_implementation=attn, **COMMON)
    )


def qwen3_moe(router_logits=False):
    # 4 experts, top-2, expert width 16; decoder_sparse_step=1: both layers are MoE
    return tf.Qwen3MoeForCausalLM(
        tf.Qwen3MoeConfig(
            intermediate_size=64,
            moe_intermediate_size=16,
            num_key_value_heads=2,
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            output_router_logits=router_logits,
            **COMMON,
        )
    )


def t5():
    return tf.T5ForConditionalGeneration(
        tf.T5Config(
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
        )
    )


def vit():
    # 16x16 images in 4x4 patches: 16 patches + [CLS] = 17 tokens per image, 10 classes
    return tf.ViTForImageClassification(
        tf.ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=4,
            num_channels=3,
            num_labels=10,
        )
    )


def qwen3():  # q and k RMS-normed per head
    return tf.Qwen3ForCausalLM(tf.Qwen3Config(intermediate_size=64, num_key_value_heads=2, head_dim=8, **COMMON))


def olmoe():  # top-2 of 4 experts of width 16, the load-balancing loss on
    return tf.OlmoeForCausalLM(
        tf.OlmoeConfig(
            intermediate_size=16,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            output_router_logits=True,
            **COMMON,
        )
    )


def deepseek_v3():  # MLA (q rank 16, kv rank 16, q·k heads 8 + 4 rope, v heads 8); layer 0 dense, layer 1 MoE
    return tf.DeepseekV3ForCausalLM(
        tf.DeepseekV3Config(
            intermediate_size=64,
            moe_intermediate_size=16,
            num_key_value_heads=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=4,
            qk_nope_head_dim=8,
            v_head_dim=8,
            **COMMON,
        )
    )


def gemma3():  # text only; the head is tied to the embedding
    return tf.Gemma3ForCausalLM(
        tf.Gemma3TextConfig(intermediate_size=64, num_key_value_heads=2, head_dim=8, sliding_window=8, **COMMON)
    )


def phi3():  # fused qkv_proj and gate_up_proj
    return tf.Phi3ForCausalLM(tf.Phi3Config(intermediate_size=64, num_key_value_heads=2, pad_token_id=0, **COMMON))


def bert():  # masked LM, the decoder tied to the word embedding
    return tf.BertForMaskedLM(
        tf.BertConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )


def batch_for(model, decoder_len=S):
    torch.manual_seed(1)
    if isinstance(model, tf.ViTForImageClassification):
        return dict(pixel_values=torch.randn(B, 3, 16, 16), labels=torch.randint(0, 10, (B,)))
    ids = torch.randint(1, V, (B, S))
    if isinstance(model, tf.T5ForConditionalGeneration):
        return dict(input_ids=ids, labels=torch.randint(1, V, (B, decoder_len)))
    if isinstance(model, tf.BertForMaskedLM):  # the loss on about 15% of the positions, the head on all of them
        return dict(input_ids=ids, labels=ids.masked_fill(torch.rand(B, S) > 0.15, -100))
    return dict(input_ids=ids, labels=ids)


def one_step(build, path=None, tokens=T, **batch_kw):
    """One AdamW step from seed 0 (traced when path is given): the loss, the parameters after it, the model."""
    torch.manual_seed(0)
    model = build()
    batch = batch_for(model, **batch_kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(2)  # dropout draws the same masks in both runs
    if path is None:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    else:
        with Tracer(path, model=model, tokens=tokens):
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    return loss.detach(), [p.detach().clone() for p in model.parameters()], model


def flop_counter(build):
    """FlopCounterMode's counts per op packet: the forward alone, and the backward (forward+backward less it)."""
    torch.manual_seed(0)
    model = build()
    batch = batch_for(model)
    torch.manual_seed(2)
    with FlopCounterMode(display=False) as fcm:
        loss = model(**batch).loss
        fwd = {str(k): v for k, v in fcm.get_flop_counts()["Global"].items()}
        loss.backward()
        both = {str(k): v for k, v in fcm.get_flop_counts()["Global"].items()}
    return {"forward": fwd, "backward": {k: v - fwd.get(k, 0) for k, v in both.items()}}


def traced_flops(df):
    """{phase: {op packet: FLOPs}} of the matmul, attention and convolution rows."""
    rows = df[df["flop_kind"].astype(str).isin(KINDS)]
    packet = rows["op"].astype(str).str.rsplit(".", n=1).str[0]
    return {
        ph: rows[rows["phase"] == ph].groupby(packet)["flops"].sum().astype(int).to_dict()
        for ph in ("forward", "backward")
    }


def trace_and_check(tmp_path, build, **kw):
    """Trace one step; assert it is bit for bit the untraced step (loss and every parameter after AdamW);
    return the trace, its per-phase FLOPs by op packet (traced_flops) and the traced model."""
    loss0, params0, _ = one_step(build, **kw)
    loss1, params1, model = one_step(build, tmp_path / "trace", **kw)
    assert torch.equal(loss0, loss1)
    assert len(params0) == len(params1) and all(torch.equal(a, b) for a, b in zip(params0, params1))
    df = reports.load(tmp_path / "trace")
    return df, traced_flops(df), model


def assert_agrees_with_flop_counter(ours, theirs, missing):
    """Equal on every op FlopCounterMode has a formula for; `missing` lists the ops it lacks (it counts 0 for
    them: the callers check those by a closed form)."""
    for phase in ("forward", "backward"):
        for op in set(ours[phase]) | set(theirs[phase]):
            if op in missing:
                assert theirs[phase].get(op, 0) == 0, (phase, op)
            else:
                assert ours[phase].get(op, 0) == theirs[phase].get(op, 0), (phase, op)


def assert_cpu_flash_rows(df):
    """Each CPU flash-attention row counts what FlopCounterMode's formula for the CUDA SDPA kernels gives on its
    shapes (that formula broadcasts GQA's KV heads to the query's): forward sdpa_flop_count(q, k, v), backward
    sdpa_backward_flop_count(grad_out, q, k, v)."""
    rows = df[df["op"].astype(str).str.startswith(CPU_FLASH)]
    assert len(rows)
    for op, shapes, flops in zip(rows["op"].astype(str), rows["input_shapes"], rows["flops"]):
        shapes = [tuple(int(d) for d in s) for s in shapes]
        count = sdpa_backward_flop_count(*shapes[:4]) if "backward" in op else sdpa_flop_count(*shapes[:3])
        assert flops == count, (op, shapes)


def assert_memory(df, model):
    """Categories add up to live_bytes; parameters, gradients (end of backward), AdamW state (end of step)."""
    params = list(model.parameters())
    p_bytes = 4 * sum(p.numel() for p in params)
    live = df.set_index("seq")["live_bytes"]
    peak = reports.by_category(df).set_index("category")
    assert peak["bytes"].sum() == live.max() and peak.loc["parameters", "bytes"] == p_bytes
    end_bwd = int(df.loc[df["phase"] == "backward", "seq"].max())
    at = reports.by_category(df, at=end_bwd).set_index("category")
    assert at["bytes"].sum() == live[end_bwd] and at.loc["gradients", "bytes"] == p_bytes
    end_opt = int(df.loc[df["phase"] == "optimizer", "seq"].max())
    at = reports.by_category(df, at=end_opt).set_index("category")
    assert at["bytes"].sum() == live[end_opt]
    assert at.loc["optimizer_state", "bytes"] == 2 * p_bytes + 4 * len(params)  # exp_avg, exp_avg_sq, step


def test_llama_gqa_sdpa_and_eager(tmp_path):
    df, ours, model = trace_and_check(tmp_path / "sdpa", llama)
    # N: 2 blocks x 9,216 + lm_head 128·32 = 4,096 (not tied) = 22,528; all 26,784 with embedding and norms
    t = reports.breakdown(df).set_index("phase")
    assert t.loc["total", "n_params"] == t.loc["total", "n_active"] == 22528
    # each weight multiplies each of the 32 tokens once: 2·N·T = 2·22,528·32 = 1,441,792, all of it aten.mm
    assert t.loc["forward", "weight_matmul_flops"] == ours["forward"]["aten.mm"] == 1441792
    assert t.loc["backward", "weight_matmul_flops"] == ours["backward"]["aten.mm"] == 2883584  # 4·N·T
    # the CPU flash kernel, GQA's 2 KV heads repeated to 4: 2 layers x 65,536 = 131,072; backward 2.5x = 327,680
    assert ours["forward"][CPU_FLASH] == 131072 and ours["backward"][CPU_FLASH + "_backward"] == 327680
    # GQA reaches the kernel unrepeated: q [2, 4, 16, 8], k and v [2, 2, 16, 8]; each row 65,536 forward, 163,840
    # backward, as FlopCounterMode's formula for the CUDA kernels gives (it has none for the CPU kernel)
    flash = df[df["op"].astype(str) == CPU_FLASH + ".default"]
    assert [[int(s[1]) for s in shapes[:3]] for shapes in flash["input_shapes"]] == [[4, 2, 2]] * 2
    assert_cpu_flash_rows(df)
    # FlopCounterMode counts the same mm FLOPs in each phase and nothing for the CPU flash kernel
    assert_agrees_with_flop_counter(ours, flop_counter(llama), {CPU_FLASH, CPU_FLASH + "_backward"})
    assert_memory(df, model)  # parameters 26,784·4 = 107,136 bytes; AdamW 2·107,136 + 4·21 = 214,356
    # eager attention: the same scores as bmm, which FlopCounterMode counts too; its backward is 2x (no recompute)
    df, ours, _ = trace_and_check(tmp_path / "eager", lambda: llama("eager"))
    assert ours["forward"]["aten.bmm"] == 131072 and ours["backward"]["aten.bmm"] == 262144
    assert_agrees_with_flop_counter(ours, flop_counter(lambda: llama("eager")), set())


@pytest.mark.parametrize("router_logits", [False, True])
def test_qwen3_moe_top2_of_4(tmp_path, router_logits, capsys):
    build = lambda: qwen3_moe(router_logits)  # noqa: E731
    df, ours, model = trace_and_check(tmp_path, build)
    t = reports.breakdown(df).set_index("phase")
    # per layer: attention 3,072 + router 32·4 = 128 + experts gate_up 4·32·32 = 4,096 + down 4·16·32 = 2,048;
    # x 2 layers + lm_head 4,096 = 22,784; a token uses 2 of 4 experts: N_active = 22,784 - 2·6,144/2 = 16,640
    assert (t.loc["total", "n_params"], t.loc["total", "n_active"]) == (22784, 16640)
    # experts: 2·32 = 64 token-expert pairs per layer: gate_up 2·64·32·32 = 131,072 + down 2·64·16·32 = 65,536;
    # x 2 layers = 393,216 in _grouped_mm, whatever the routing; the rest aten.mm: 2·(2·3,200 + 4,096)·32 = 671,744
    assert ours["forward"]["aten._grouped_mm"] == 393216 and ours["forward"]["aten.mm"] == 671744
    assert ours["backward"]["aten._grouped_mm"] == 786432  # dL/dx and dL/dW of each
    # 393,216 + 671,744 = 1,064,960 = 2·N_active·T = 2·16,640·32
    assert t.loc["forward", "weight_matmul_flops"] == 1064960 and t.loc["backward", "weight_matmul_flops"] == 2129920
    assert_cpu_flash_rows(df)
    assert_agrees_with_flop_counter(ours, flop_counter(build), {"aten._grouped_mm", CPU_FLASH, CPU_FLASH + "_backward"})
    assert_memory(df, model)
    assert "N_active = 16,640 (top-2 of 4 experts)" in "\n".join(reports.explain(df))
    # the router's sort, histc and topk have no formula: named, never a silent zero
    from reports.output.cli import main

    assert main(["report", str(tmp_path / "trace"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    uncounted = {u["op"] for u in summary["uncounted_ops"]}
    assert {"aten.sort.default", "aten.histc.default", "aten.topk.default"} <= uncounted
    assert (summary["params"], summary["n_active"]) == (22784, 16640)


def test_t5_encoder_decoder_equal_lengths(tmp_path, capsys):
    df, ours, model = trace_and_check(tmp_path, t5)
    t = reports.breakdown(df).set_index("phase")
    # encoder block: q, k, v, o 4·32·32 = 4,096 + wi, wo 2·32·64 = 4,096; decoder block adds cross-attention 4,096:
    # 2·8,192 + 2·12,288 + the head tied to the embedding 4,096 = 45,056 (the relative position biases are lookups)
    assert t.loc["total", "n_params"] == t.loc["total", "n_active"] == 45056
    # source and target both 16 tokens: every weight multiplies T = 32 tokens (cross-attention's k and v the
    # encoder's, q and o the decoder's): 2·N·T = 2·45,056·32 = 2,883,584
    assert t.loc["forward", "weight_matmul_flops"] == ours["forward"]["aten.mm"] == 2883584
    # eager attention, 6 of them (2 encoder, 2 decoder self, 2 cross) x 65,536 = 393,216; backward 2x
    assert ours["forward"]["aten.bmm"] == 393216 and ours["backward"]["aten.bmm"] == 786432
    assert_agrees_with_flop_counter(ours, flop_counter(t5), set())
    assert_memory(df, model)
    text = "\n".join(reports.explain(df))
    assert "Output head: lm_head (its weight shared.weight, 4,096 parameters, tied to the embedding)" in text
    assert "Above 2·N·T" not in text and "N_active" not in text
    from reports.output.cli import main

    assert main(["report", str(tmp_path / "trace")]) == 0
    assert "N = 45,056 parameters (matmul), T = 32 tokens per step" in capsys.readouterr().out


def test_t5_a_shorter_target_is_not_called_a_shared_weight(tmp_path):
    # target 8 tokens, source 16: tokens=16 (the decoder's) leaves the encoder's weights at 2 x 16 = 32 tokens;
    # they are not shared or called twice, they see the source tokens
    _, _, model = one_step(t5, tmp_path / "t5", tokens=16, decoder_len=8)
    text = "\n".join(reports.explain(reports.load(tmp_path / "t5")))
    assert "encoder.block.0.layer.0.SelfAttention.q.weight 2.00x (32 tokens)" in text
    assert "or tokens= counts fewer tokens than they see" in text
    assert "multiply each token more than once" not in text
    # tokens= source + target = 32 + 16 = 48: every weight is partly used and N_active is the parameters an average
    # token uses: (encoder 16,384 + cross k, v 4,096)·32/48 + (decoder self + FF 16,384 + cross q, o 4,096 + head
    # 4,096)·16/48 = 13,653.3 + 8,192; forward 2·(20,480·32 + 24,576·16) = 2,097,152 = 2·N_active·T exactly
    one_step(t5, tmp_path / "all", tokens=48, decoder_len=8)
    t = reports.breakdown(reports.load(tmp_path / "all")).set_index("phase")
    assert abs(t.loc["total", "n_active"] - (20480 * 32 + 24576 * 16) / 48) < 1e-6
    assert t.loc["forward", "weight_matmul_flops"] == t.loc["forward", "expected_active_flops"] == 2097152


def test_vit_patches_and_the_cls_token(tmp_path):
    df, ours, model = trace_and_check(tmp_path / "cls", vit, tokens=34)
    t = reports.breakdown(df).set_index("phase")
    # T = B x (16 patches + [CLS]) = 34 tokens reach the encoder. N: 2 blocks x (4·32·32 + 2·32·64 = 8,192)
    # + classifier 10·32 = 320 = 16,704 (the patch convolution is not a matmul); the classifier reads only the
    # 2 [CLS] tokens: N_active = 16,384 + 320·2/34
    assert t.loc["total", "n_params"] == 16704 and abs(t.loc["total", "n_active"] - (16384 + 320 * 2 / 34)) < 1e-6
    # 2·16,384·34 + 2·320·2 = 1,114,112 + 1,280 = 1,115,392 = 2·N_active·T, as addmm
    assert t.loc["forward", "weight_matmul_flops"] == ours["forward"]["aten.addmm"] == 1115392
    # patch embedding: 2 x 1,536 weights x 32 patches = 98,304, forward and backward (the pixels need no gradient)
    assert ours["forward"]["aten.convolution"] == ours["backward"]["aten.convolution_backward"] == 98304
    # attention over 17 tokens: 2 layers x 2 x 2·2·4·17·17·8 = 147,968
    assert ours["forward"][CPU_FLASH] == 147968
    assert_cpu_flash_rows(df)
    assert_agrees_with_flop_counter(ours, flop_counter(vit), {CPU_FLASH, CPU_FLASH + "_backward"})
    assert_memory(df, model)
    text = "\n".join(reports.explain(df))
    assert "Above 2·N·T" not in text and "(classifier.weight)" in text


def test_vit_tokens_given_as_patches_are_not_called_shared_weights(tmp_path):
    # tokens=32 (the patches) while each encoder weight multiplies 34 tokens: 34/32 = 1.0625, said as T's
    # doing, not as weights shared or called several times, nor as activation checkpointing
    one_step(vit, tmp_path / "patches", tokens=32)
    text = "\n".join(reports.explain(reports.load(tmp_path / "patches")))
    assert "vit.layers.0.attention.q_proj.weight 1.06x (34 tokens)" in text
    assert "16,384 of the N = 16,704 parameters multiplied 34 tokens per step each: is tokens= (32)" in text
    # backward 4·(16,384·34 + 320·2) = 2,230,784 against 4·N_active·T with T = 32: the same cause, said again
    assert "Above 4·N·T: a weight multiplies more than T tokens (see the forward's line)." in text  # no recompute
    assert "multiply each token more than once" not in text


# model, N, N_active, forward attention op and its FLOPs; forward weight matmuls are 2·N_active·T in every row
MATRIX = [
    # Qwen3: the Llama block with 4 heads of 8 (q/k norms are no matmul): N = 2·9,216 + 4,096 = 22,528
    (qwen3, 22528, 22528, CPU_FLASH, 131072),
    # OLMoE: attention 3,072 + router 128 + experts 4·32·32 + 4·16·32 = 6,144 per layer, x 2 + head 4,096 = 22,784;
    # top-2 of 4: N_active = 22,784 - 6,144 = 16,640
    (olmoe, 22784, 16640, CPU_FLASH, 131072),
    # DeepSeek-V3 MLA per layer: q_a 32·16 + q_b 16·48 + kv_a 32·20 + kv_b 16·64 + o 32·32 = 3,968; layer 0 MLP
    # 3·32·64 = 6,144; layer 1 router 128 + experts 6,144 + shared expert 3·32·16 = 1,536; head 4,096: 25,984;
    # N_active = 25,984 - 6,144/2 = 22,912. q·k heads of 12 and v heads of 8: SDPA falls back to its math path
    # (bmm): 2 layers x 2·2·4·16·16·(12 + 8) = 163,840
    (deepseek_v3, 25984, 22912, "aten.bmm", 163840),
    # Gemma3: the Llama shapes, the head tied to the embedding (counted once): 22,528; the sliding window is a mask
    (gemma3, 22528, 22528, CPU_FLASH, 131072),
    # Phi3: qkv_proj 32·64 + o 32·32 + gate_up 32·128 + down 64·32 = 9,216 per layer: 22,528
    (phi3, 22528, 22528, CPU_FLASH, 131072),
    # BERT MLM: q, k, v, o 4·32·32 + 2·32·64 = 8,192 per layer + transform 32·32 + the tied decoder 4,096 = 21,504;
    # attention dropout 0.1 in training: SDPA's math path, bmm. T = all 32 input tokens though the labels keep ~15%
    (bert, 21504, 21504, "aten.bmm", 131072),
]


@pytest.mark.parametrize(
    "build, n, n_active, attention_op, attention_flops", MATRIX, ids=[row[0].__name__ for row in MATRIX]
)
def test_model_matrix(tmp_path, build, n, n_active, attention_op, attention_flops):
    df, ours, model = trace_and_check(tmp_path, build)
    t = reports.breakdown(df).set_index("phase")
    assert (t.loc["total", "n_params"], t.loc["total", "n_active"]) == (n, n_active)
    assert t.loc["forward", "weight_matmul_flops"] == 2 * n_active * T
    assert t.loc["backward", "weight_matmul_flops"] == 4 * n_active * T
    assert ours["forward"][attention_op] == attention_flops
    if attention_op == CPU_FLASH:
        assert_cpu_flash_rows(df)
    assert_agrees_with_flop_counter(ours, flop_counter(build), {"aten._grouped_mm", CPU_FLASH, CPU_FLASH + "_backward"})
    assert_memory(df, model)


def test_an_in_place_op_counts_as_its_out_of_place_twin(tmp_path):
    # T5 shifts the labels right with masked_fill_ (no pointwise tag on the in-place packet, which masked_fill
    # carries): it was 0 FLOPs and listed as without a formula, while masked_fill counts 1 per element
    x, mask = torch.randn(2, 16), torch.rand(2, 16) > 0.5
    with Tracer(tmp_path / "fill"):
        x.masked_fill(mask, 0.0)
        x.masked_fill_(mask, 0.0)
        x.gt_(0.0)  # the comparisons, abs_, gelu_, threshold_, true_divide_ lack the tag the same way
    df = reports.load(tmp_path / "fill")
    counted = dict(zip(df["op"].astype(str), zip(df["flops"], df["flop_kind"].astype(str))))
    # 2·16 = 32 elements written each
    assert counted["aten.masked_fill.Scalar"] == counted["aten.masked_fill_.Scalar"] == (32, "elementwise")
    assert counted["aten.gt_.Scalar"] == (32, "elementwise")


def test_deepseek_v3_mla_attention_width(tmp_path):
    # MLA's q·k heads are 8 + 4 = 12 wide, its v heads 8: 4 heads give 48 and 32, and L·S·d = 163,840 / (4·32)
    # = 1,280 = 2 layers x 16 x 40, the mean of the two widths (the model's width is 32)
    one_step(deepseek_v3, tmp_path / "mla")
    text = "\n".join(reports.explain(reports.load(tmp_path / "mla")))
    assert (
        "forward 163,840 = 4·T·(L·S·d) with L·S·d = 1,280 (layers x sequence length x width; where q·k and v "
        "heads differ in width, d is the mean of the two)" in text
    )


def test_llama_gradient_checkpointing(tmp_path):
    def checkpointed():
        model = llama()
        model.activation_checkpointing_enable()  # non-reentrant torch.utils.checkpoint around each decoder layer
        return model

    df, ours, _ = trace_and_check(tmp_path, checkpointed)
    t = reports.breakdown(df).set_index("phase")
    again = df["recompute"] & (df["op"].astype(str) == "aten.mm.default")
    # each layer re-runs q, k, v, o, gate, up (3,072 + 4,096 = 7,168 weights) but not down_proj, whose output
    # the backward does not need (the early stop): 2 layers x 2·7,168·32 = 917,504 on top of 4·N·T = 2,883,584
    assert df.loc[again, "flops"].sum() == 917504
    assert t.loc["backward", "weight_matmul_flops"] == 2883584 + 917504
    assert_agrees_with_flop_counter(ours, flop_counter(checkpointed), {CPU_FLASH, CPU_FLASH + "_backward"})
    text = "\n".join(reports.explain(df))
    assert (
        "Activation checkpointing: 1,086,208 FLOPs per step re-run forward work in the backward (rows flagged "
        "recompute; 917,504 of them weight matmuls"
    ) in text
    # the re-run forward kernel is checkpointing's, not part of the fused attention backward
    assert (
        "Recomputation: the fused attention backward (aten._scaled_dot_product_flash_attention_for_cpu_backward"
        ".default) counts 2.500 x its forward (327,680 vs 131,072 FLOPs)"
    ) in text
    # no weight multiplies more than T tokens here: the re-run is the one cause
    assert "Above 4·N·T: forward matmuls re-run in the backward by activation checkpointing (917,504 FLOPs)." in text


@pytest.mark.parametrize("build", [llama, qwen3_moe, t5], ids=["llama", "qwen3_moe", "t5"])
def test_three_identical_steps_give_the_per_step_figures_of_one(tmp_path, build):
    """k identical AdamW steps: every step's FLOPs per phase are those of a trace of one step (the MoE's routing
    moves with the weights, the number of routed tokens does not)."""
    per_step = {}
    for k in (1, 3):
        torch.manual_seed(0)
        model = build()
        batch = batch_for(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        with Tracer(tmp_path / f"k{k}", model=model, tokens=T):
            for _ in range(k):
                torch.manual_seed(2)
                model(**batch).loss.backward()
                opt.step()
                opt.zero_grad()
        table = reports.by_step(reports.load(tmp_path / f"k{k}"))
        per_step[k] = table[[c for c in table.columns if c.startswith("flops_")]].values.tolist()
    assert len(per_step[3]) == 3 and per_step[3] == per_step[1] * 3
    assert per_step[1][0][0] > 0  # the forward's FLOPs: not a table of zeros


def _trainer_run(out, path, steps=3):
    """`steps` optimizer steps of transformers.Trainer on a GPT-2 of one layer (width 16, 2 heads, vocabulary 32):
    batches of 2 sequences of 8 tokens, 2 accumulated per step (T = 32), gradients clipped to norm 1.0, AdamW; traced
    into `path` unless None, the Trainer's output directory `out`. (logged losses, parameters, RNG state)."""
    model, ids = tiny_gpt2(tf, rows=64)
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = trainer_arguments(
        tf, out, max_steps=steps, gradient_accumulation_steps=2, max_grad_norm=1.0, dataloader_num_workers=0
    )
    trainer = tf.Trainer(model=model, args=args, train_dataset=data)
    if path is None:
        trainer.train()
    else:
        with Tracer(path, model=model, tokens=2 * 8 * 2):
            trainer.train()
    losses = [h.get("loss") for h in trainer.state.log_history]
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()


def test_the_trainer_runs_as_untraced_and_each_of_its_steps_counts_the_same(tmp_path):
    """transformers.Trainer's loop (accumulation, clipping, logging a loss each step) traced for 3 steps: the losses,
    parameters and RNG state are those of the untraced run, and every step's forward, backward and optimizer FLOPs
    and bytes are the same (but the bytes of the optimizer's first step, which makes AdamW's state). The other phase differs from step to step by the Trainer's own work (it counts the
    labels of the batches it fetches ahead, and the last step fetches none): the program's, not the trace's."""
    pytest.importorskip("accelerate")  # the Trainer needs it
    untraced = _trainer_run(tmp_path / "untraced-out", None)
    traced = _trainer_run(tmp_path / "traced-out", tmp_path / "trainer")
    assert traced[0] == untraced[0] and len([loss for loss in traced[0] if loss is not None]) == 3
    assert all(torch.equal(traced[1][k], untraced[1][k]) for k in untraced[1]) and torch.equal(traced[2], untraced[2])
    df = reports.load(tmp_path / "trainer")
    per = df[df["phase"] != "other"].groupby(["step", "phase"], observed=True)[["flops", "bytes_read"]].sum()
    per = per.unstack("step")
    assert sorted(df["step"].unique()) == [0, 1, 2] and (per["flops"].nunique(axis=1) == 1).all()
    # bytes: the same every step, but the optimizer's first, which makes AdamW's state (its zeros read too)
    read = per["bytes_read"]
    assert read.nunique(axis=1).to_dict() == {"forward": 1, "backward": 1, "optimizer": 2}
    assert read.loc["optimizer", 1] == read.loc["optimizer", 2] < read.loc["optimizer", 0]
    # N = 3,584 weights in matmuls: c_attn 16·48 + attn c_proj 16·16 + c_fc 16·64 + mlp c_proj 64·16 + the tied
    # head 32·16; T = 2 micro-batches x 2 x 8 = 32 tokens: forward weight matmuls 2·N·T = 229,376 a step
    row = reports.breakdown(df).set_index("phase").loc["forward"]
    assert row["weight_matmul_flops"] == 229_376 == 2 * 3_584 * 32 and row["expected_flops"] == 229_376
    assert per.loc["forward", ("flops", 0)] == 288_034 and per.loc["backward", ("flops", 0)] == 555_158


def _checkpointed_trainer_run(out, path, reentrant):
    """3 optimizer steps of transformers.Trainer on the GPT-2 of `_trainer_run` with gradient_checkpointing=True
    (use_reentrant `reentrant`), 2 micro-batches accumulated per step (T = 32), a cosine schedule after 1 warm-up
    step; traced into `path` unless None. (logged losses and learning rates, parameters)."""
    model, ids = tiny_gpt2(tf, rows=64)
    data = [{"input_ids": row, "labels": row} for row in ids]
    fields = tf.TrainingArguments.__dataclass_fields__  # the option's name since transformers 5.x; the old one before
    name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    args = trainer_arguments(
        tf,
        out,
        max_steps=3,
        gradient_accumulation_steps=2,
        max_grad_norm=1.0,
        dataloader_num_workers=0,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        learning_rate=1e-3,
        **{name: True, name + "_kwargs": {"use_reentrant": reentrant}},
    )
    trainer = tf.Trainer(model=model, args=args, train_dataset=data)
    with Tracer(path, model=model, tokens=2 * 8 * 2) if path is not None else contextlib.nullcontext():
        trainer.train()
    logged = [(h.get("loss"), h.get("learning_rate")) for h in trainer.state.log_history]
    return logged, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_trainer_with_gradient_checkpointing_and_a_schedule_names_its_recompute(tmp_path, reentrant):
    """gradient_checkpointing=True under the Trainer (accumulation 2, cosine schedule with warm-up): the traced run
    logs the untraced run's losses and learning rates and ends with its parameters; every optimizer step is one step
    with the same FLOPs; the backward's extra FLOPs are rows flagged recompute, and the report says so."""
    pytest.importorskip("accelerate")  # the Trainer needs it
    untraced = _checkpointed_trainer_run(tmp_path / "untraced-out", None, reentrant)
    traced = _checkpointed_trainer_run(tmp_path / "traced-out", tmp_path / "gc", reentrant)
    assert traced[0] == untraced[0] and [lr for _, lr in traced[0][:3]] == [0.0, 1e-3, 5e-4]  # warm-up, cosine
    assert all(torch.equal(traced[1][k], untraced[1][k]) for k in untraced[1])
    df = reports.load(tmp_path / "gc")
    work = df[df["phase"] != "other"]
    per = work.groupby(["step", "phase", "recompute"], observed=True)["flops"].sum().unstack("step")
    assert sorted(df["step"].unique()) == [0, 1, 2] and (per.nunique(axis=1) == 1).all()
    # the work that is not recompute is the unchecked run's (test above): forward 288,034, backward 555,158
    assert per[0].to_dict() == {
        ("forward", False): 288_034,
        ("backward", False): 555_158,
        ("backward", True): 244_864 if reentrant else 243_840,  # the early stop skips 2 adds and 2 muls of 256
        ("optimizer", False): 27_680,
    }
    # the recompute's weight matmuls: the block's forward ones again, 2·3,072·32 = 196,608 (c_attn 16·48 + attn
    # c_proj 16·16 + c_fc 16·64 + mlp c_proj 64·16 = 3,072; the tied head is not checkpointed)
    again = df[df["recompute"] & (df["step"] == 0)]
    assert again[again["op"].astype(str).isin(["aten.mm.default", "aten.addmm.default"])]["flops"].sum() == 196_608
    row = reports.breakdown(df).set_index("phase").loc["backward"]
    assert row["weight_matmul_flops"] == 655_360 == 4 * 3_584 * 32 + 196_608
    text = " ".join(reports.explain(df))
    assert "Activation checkpointing: " + ("244,864" if reentrant else "243,840") + " FLOPs per step" in text
    assert "forward matmuls re-run in the backward by activation checkpointing (196,608 FLOPs)" in text
