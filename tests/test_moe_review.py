"""Review of the mixture-of-experts accounting: an expert that no token was routed to in a step.

tests/reports/flops/test_moe.py's TinyMoE (router + top-2 of 4 experts, D = 8, F = 16, T = 16) with per-expert nn.Linear
modules, run the common way: a loop over experts that skips an expert with no token. The router sends no
token to expert 3 (feature 0 of every token is 3, and expert 3's router row is -100 there), so expert 3's
up and down weights enter no matmul in the step.
"""

import torch

import reports
from tests.reports.flops.test_moe import D, E, K, T, TinyMoE
from tracer import Tracer


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
    assert "Mixture of experts: N = 1,056 parameters, of which each token uses N_active = 544 (top-2 of 4 experts)" in text
