"""Mixture of experts in the FLOP reports: expert weights are weight matmuls on every path, and N_active.

A tiny MoE layer written here (router + top-2 of 4 experts, D = 8, F = 16, T = 16 tokens)
runs its experts four ways: a loop over experts with w[e] (views of a stacked weight),
per-expert nn.Linear modules on index_select'd tokens, a bmm on gathered weights
w[expert_ids] (transformers' "batched_mm"), and torch._grouped_mm (its "grouped_mm").
Whatever the routing, top-2 sends k·T = 32 token-expert pairs through the experts, so
the closed forms below hold for any router weights.

    N        = router 4·8 = 32 + w1 4·8·16 = 512 + w2 4·16·8 = 512          = 1,056
    N_active = 32 + (512 + 512)·2/4 (each token uses 2 of the 4 experts)    =   544
    forward weight matmuls: router 2·16·8·4 = 1,024 + experts 2·32·(8·16 + 16·8) = 16,384
                            = 17,408 = 2·N_active·T = 2·544·16
    backward (x needs a gradient, so every dL/dx is computed): 2 x 17,408 = 34,816 = 4·N_active·T
"""

import pytest
import torch
from torch import nn

import reports
from tracer import Tracer

D, F, E, K, T = 8, 16, 4, 2, 16
N, N_ACTIVE = 32 + 512 + 512, 32 + (512 + 512) * K // E
FWD, BWD = 2 * N_ACTIVE * T, 4 * N_ACTIVE * T  # 17,408 and 34,816


class TinyMoE(nn.Module):
    def __init__(self, path):
        super().__init__()
        self.path = path
        self.router = nn.Linear(D, E, bias=False)
        if path == "modules":
            self.up = nn.ModuleList(nn.Linear(D, F, bias=False) for _ in range(E))
            self.down = nn.ModuleList(nn.Linear(F, D, bias=False) for _ in range(E))
        else:
            self.w1 = nn.Parameter(torch.randn(E, D, F) / 4)
            self.w2 = nn.Parameter(torch.randn(E, F, D) / 4)

    def forward(self, x):
        scores, experts = self.router(x).softmax(-1).topk(K, dim=-1)  # [T, k] each
        flat_e, flat_w = experts.reshape(-1), scores.reshape(-1, 1)  # the k·T token-expert pairs
        token = torch.arange(T).repeat_interleave(K)
        if self.path in ("eager", "modules"):
            out = torch.zeros_like(x)
            for e in range(E):
                pairs = (flat_e == e).nonzero().squeeze(-1)
                xs = x.index_select(0, token[pairs])
                if self.path == "eager":
                    h = torch.relu(xs @ self.w1[e]) @ self.w2[e]
                else:
                    h = self.down[e](torch.relu(self.up[e](xs)))
                out = out.index_add(0, token[pairs], h * flat_w[pairs])
            return out
        if self.path == "bmm":  # [S, 1, D] @ [S, D, F] with S = k·T gathered expert weights
            h = torch.relu(torch.bmm(x[token].unsqueeze(1), self.w1[flat_e]))
            h = torch.bmm(h, self.w2[flat_e]).squeeze(1)
            return torch.zeros_like(x).index_add(0, token, h * flat_w)
        order = flat_e.argsort(stable=True)  # grouped: pairs sorted by expert, offsets = cumulative counts
        offs = torch.bincount(flat_e, minlength=E).cumsum(0).to(torch.int32)
        h = torch.relu(torch._grouped_mm(x[token[order]], self.w1, offs=offs))
        h = torch._grouped_mm(h, self.w2, offs=offs)
        return torch.zeros_like(x).index_add(0, token[order], h * flat_w[order])


def grouped_mm_flops(shapes):
    """2·S·K·N of a _grouped_mm whose S rows are all routed (offs[-1] = S): [S, K] @ [E, K, N] (forward,
    dL/dx) or [K, S] @ [S, N] -> [E, K, N] (dL/dW)."""
    a, b = [int(d) for d in shapes[0]], [int(d) for d in shapes[1]]
    return 2 * a[0] * a[1] * int(b[-1])


def assert_grouped_mm_counted(df, layers=1):
    """Every _grouped_mm row is a matmul counted at the closed form 2·S·K·N (tracer.flops.formulas, from the offsets)."""
    rows = df["op"].astype(str) == "aten._grouped_mm.default"
    assert rows.sum() == 6 * layers  # per layer 2 expert matmuls forward; dL/dx and dL/dW of each backward
    assert (df.loc[rows, "flop_kind"].astype(str) == "matmul").all()
    assert (df.loc[rows, "flops"] == df.loc[rows, "input_shapes"].map(grouped_mm_flops)).all()
    return df


def trace_moe(path, kind):
    torch.manual_seed(0)
    model = TinyMoE(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    x = torch.randn(T, D, requires_grad=True)  # so that every dL/dx is computed: 4·N_active·T exactly
    with Tracer(path, model=model, tokens=T, run_name=kind):
        model(x).square().mean().backward()
        opt.step()
    df = reports.load(path)
    return assert_grouped_mm_counted(df) if kind == "grouped" else df


@pytest.mark.parametrize("kind", ["eager", "modules", "bmm", "grouped"])
def test_expert_matmuls_are_weight_matmuls_and_N_active_is_exact(tmp_path, kind):
    df = trace_moe(tmp_path / kind, kind)
    t = reports.breakdown(df).set_index("phase")
    assert t.loc["total", "n_params"] == N == 1056
    assert t.loc["total", "n_active"] == N_ACTIVE == 544
    # forward: router 1,024 + experts 2·32·(128 + 128) = 16,384: 17,408 = 2·N_active·T, none of it attention
    assert t.loc["forward", "weight_matmul_flops"] == FWD == 17408
    assert t.loc["forward", "expected_active_flops"] == FWD and t.loc["forward", "expected_flops"] == 2 * N * T
    # backward: dL/dW and dL/dx of every use: 2 x 17,408 = 34,816 = 4·N_active·T
    assert t.loc["backward", "weight_matmul_flops"] == BWD == 34816
    assert t.loc["forward", "attention_flops"] == t.loc["backward", "attention_flops"] == 0
    assert t.loc["total", "expected_active_flops"] == 6 * N_ACTIVE * T == 52224
    text = "\n".join(reports.explain(df))
    assert "of which each token uses N_active = 544 (top-2 of 4 experts)" in text
    # weight matmuls 17,408 + 34,816 = 52,224 = 6·N_active·T exactly; the experts a token skips: 6·(1,056 - 544)·16
    assert (
        "weight matmuls - 6·N_active·T (0) - 6·(N - N_active)·T for the parameters a token does not use (49,152)"
        in text
    )
    assert "Forward weight matmuls: 17,408 FLOPs = 2.00·N_active·T" in text
    assert "Backward weight matmuls: 34,816 FLOPs = 4·N_active·T" in text
    # SGD (foreach) adds lr·grad to every parameter: 1 FLOP per element of all 1,056, experts the tokens skipped too
    assert "Optimizer: 1,056 FLOPs per step (1.0 per parameter over the 1,056 parameters its steps updated" in text
    assert "_foreach ops (foreach=True)" in text
    assert "Attention:" not in text and "Activation x activation" not in text  # no activation x activation matmul


def test_a_dense_model_has_N_active_equal_to_N(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D, bias=False), nn.ReLU(), nn.Linear(D, D, bias=False))
    with Tracer(tmp_path / "dense", model=model, tokens=T):
        model[0](model(torch.randn(T, D))).sum().backward()  # model[0] multiplies each token twice
    df = reports.load(tmp_path / "dense")
    t = reports.breakdown(df).set_index("phase")
    # share of 0.weight = 2 (capped at 1: one weight), of 2.weight = 1: N_active = N = 8·8 + 8·8 = 128
    assert t.loc["total", "n_params"] == t.loc["total", "n_active"] == 128
    # forward: 3 matmuls of 2·16·8·8 = 2,048 = 6,144 = 3·N·T (each 2·64·16 = 2,048)
    assert t.loc["forward", "weight_matmul_flops"] == 6144
    text = "\n".join(reports.explain(df))
    assert "N_active" not in text and "Mixture of experts" not in text
    assert (
        "Above 2·N·T: some weights multiply more than T = 16 tokens per step" in text
        and "0.weight 2.00x (32 tokens)" in text
    )
    assert "is tokens=" not in text  # 64 of the 128 parameters: no majority, the question is not asked


@pytest.mark.parametrize("impl", ["eager", "batched_mm", "grouped_mm"])
def test_transformers_mixtral_experts(tmp_path, impl):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.MixtralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        experts_implementation=impl,
    )
    model = tf.MixtralForCausalLM(cfg)
    idx = torch.randint(0, 128, (2, 8))  # T = 16 tokens
    with Tracer(tmp_path / impl, model=model, tokens=16):
        model(idx, labels=idx).loss.backward()
    df = reports.load(tmp_path / impl)
    df = assert_grouped_mm_counted(df, layers=2) if impl == "grouped_mm" else df
    t = reports.breakdown(df).set_index("phase")
    # per layer: q 32·32 + k 32·16 + v 32·16 + o 32·32 + router 32·4 = 3,200; x 2 layers + lm_head 32·128 = 10,496 dense
    # experts per layer: gate_up 4·128·32 = 16,384 + down 4·32·64 = 8,192 = 24,576; x 2 layers = 49,152
    assert t.loc["total", "n_params"] == 10496 + 49152 == 59648
    assert t.loc["total", "n_active"] == 10496 + 49152 * 2 // 4 == 35072  # top-2 of 4
    # 2·N_active·T = 2·35,072·16 = 1,122,304; the embedding is trained, so the backward is 4·N_active·T
    assert t.loc["forward", "weight_matmul_flops"] == 2 * 35072 * 16 == 1122304
    assert t.loc["backward", "weight_matmul_flops"] == 4 * 35072 * 16 == 2244608
    # attention is the fused kernel only: 2 layers x 2·2·4·8·8·(8 + 8) = 32,768 forward, 2.5x backward
    assert t.loc["forward", "attention_flops"] == 32768 and t.loc["backward", "attention_flops"] == 81920
    assert "N_active = 35,072 (top-2 of 4 experts)" in "\n".join(reports.explain(df))


def test_report_and_json_give_N_active(tmp_path, capsys):
    import json

    from reports.output.cli import main

    trace_moe(tmp_path / "moe", "eager")
    assert main(["report", str(tmp_path / "moe")]) == 0
    assert (
        "N = 1,056 parameters (matmul), N_active = 544 used per token, T = 16 tokens per step"
        in capsys.readouterr().out
    )
    assert main(["report", str(tmp_path / "moe"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["params"], summary["n_active"]) == (1056, 544)


# An expert that no token was routed to in a step: TinyMoE with per-expert nn.Linear modules, run the common way, a
# loop over experts that skips an expert with no token. The router sends no token to expert 3 (feature 0 of every
# token is 3, and expert 3's router row is -100 there), so expert 3's up and down weights enter no matmul in the step.
class SkippingMoE(TinyMoE):
    def forward(self, x):
        scores, experts = self.router(x).softmax(-1).topk(K, dim=-1)
        flat_e, flat_w = experts.reshape(-1), scores.reshape(-1, 1)
        token = torch.arange(T).repeat_interleave(K)
        out = torch.zeros_like(x)
        for e in range(E):
            pairs = (flat_e == e).nonzero().squeeze(-1)
            if pairs.numel() == 0:  # no token for this expert: its weights do no work this step
                continue
            h = self.down[e](torch.relu(self.up[e](x.index_select(0, token[pairs]))))
            out = out.index_add(0, token[pairs], h * flat_w[pairs])
        return out


def test_an_expert_with_no_token_still_counts_in_N_and_E(tmp_path):
    torch.manual_seed(0)
    model = SkippingMoE("modules")
    with torch.no_grad():
        model.router.weight[3] = 0.0
        model.router.weight[3, 0] = -100.0
    x = torch.randn(T, D)
    x[:, 0] = 3.0
    x.requires_grad_()
    with Tracer(tmp_path / "skip", model=model, tokens=T):
        model(x).square().mean().backward()
    assert torch.bincount(model.router(x).topk(K, -1).indices.reshape(-1), minlength=E)[3] == 0
    df = reports.load(tmp_path / "skip")
    t = reports.breakdown(df).set_index("phase")
    # N is the model's, whatever the routing: router 4·8 = 32 + up 4·8·16 = 512 + down 4·16·8 = 512 = 1,056
    # (expert 3's 256 weights were left out: N was 800, and explain said "top-2 of 3 experts")
    assert t.loc["total", "n_params"] == 1056
    # N_active = 32 + (512 + 512)·2/4 = 544 (expert 3's share 0): forward 2·544·16 = 17,408, unchanged
    assert t.loc["total", "n_active"] == 544
    assert t.loc["forward", "weight_matmul_flops"] == 17408
    text = "\n".join(reports.explain(df))
    assert (
        "Mixture of experts: N = 1,056 parameters, of which each token uses N_active = 544 (top-2 of 4 experts)" in text
    )
