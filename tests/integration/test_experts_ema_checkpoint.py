"""Three things training loops add to the plain step, traced end to end: a mixture-of-experts layer whose routing
changes from step to step, an exponential moving average of the weights after the optimizer step, and activation
checkpointing with use_reentrant=True and False. Each runs bit for bit as untraced; the FLOPs are the closed forms
and torch.utils.flop_counter.FlopCounterMode's."""

import contextlib
import copy

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

import reports
from tracer import Tracer

MATMULS = ("aten.mm.default", "aten.addmm.default")


def _matmuls(df):
    """{(step, phase): FLOPs of the trace's matmul rows}."""
    rows = df[df["op"].astype(str).isin(MATMULS)]
    return {k: int(v) for k, v in rows.groupby(["step", "phase"], observed=True)["flops"].sum().items()}


def _counted(counter):
    """FlopCounterMode's matmul FLOPs, all its ops together."""
    return sum(v for op, v in counter.get_flop_counts()["Global"].items() if str(op).split(".")[1] in ("mm", "addmm"))


# ------------------------------------------------------------------ mixture of experts: top-2 of 4, index_select
D, F, E, K, T = 16, 32, 4, 2, 8


class _MoE(torch.nn.Module):
    """A router Linear(16, 4) and 4 experts Linear(16, 32) -> ReLU -> Linear(32, 16), no biases: N = 64 + 4·1,024 =
    4,160, N_active = 64 + 2·1,024 = 2,112 (top-2). Each expert multiplies the tokens routed to it (index_select)
    and adds them back weighted (index_add); `routed` gets each call's tokens per expert (shapes only: no op)."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(D, E, bias=False)
        self.up = torch.nn.ModuleList(torch.nn.Linear(D, F, bias=False) for _ in range(E))
        self.down = torch.nn.ModuleList(torch.nn.Linear(F, D, bias=False) for _ in range(E))
        self.routed = []

    def forward(self, x):
        weight, expert = torch.topk(self.router(x).softmax(-1), K, dim=-1)
        out, counts = torch.zeros_like(x), []
        for e in range(E):
            token, slot = (expert == e).nonzero(as_tuple=True)
            counts.append(token.shape[0])
            h = self.down[e](torch.relu(self.up[e](x.index_select(0, token))))
            out = out.index_add(0, token, h * weight[token, slot].unsqueeze(-1))
        self.routed.append(counts)
        return out


def _moe_run(path=None, context=None):
    """3 SGD steps of _MoE on 3 batches of T = 8 tokens, traced into `path` or under `context`. (parameters,
    tokens per expert per step)."""
    torch.manual_seed(0)
    model = _MoE()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(T, D) for _ in range(3)]
    with Tracer(path, model=model, tokens=T) if path is not None else context or contextlib.nullcontext():
        for x in batches:
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()], model.routed


def test_moe_routing_changes_each_step_and_each_experts_flops_follow_its_tokens(tmp_path):
    untraced = _moe_run()
    counter = FlopCounterMode(display=False)
    _moe_run(context=counter)
    params, routed = _moe_run(tmp_path / "moe")
    assert all(torch.equal(a, b) for a, b in zip(params, untraced[0])) and routed == untraced[1]
    assert routed == [[5, 3, 3, 5], [6, 1, 4, 5], [6, 5, 2, 3]]  # 2 of 4 experts for each of 8 tokens: 16 a step
    df = reports.load(tmp_path / "moe")
    forward = df[(df["phase"] == "forward") & df["op"].astype(str).isin(MATMULS)]
    by_expert = forward.groupby(["step", "module"], observed=True)["flops"].sum()
    for step, counts in enumerate(routed):
        for e, c in enumerate(counts):  # c tokens through Linear(16, 32) then Linear(32, 16): 2·c·512 each
            assert by_expert[(step, f"up.{e}")] == by_expert[(step, f"down.{e}")] == 1024 * c
    # a step: router 2·8·64 = 1,024 + experts 2·16·1,024 = 32,768 = 2·N_active·T = 2·2,112·8 = 33,792 forward;
    # backward dL/dW 33,792 + dL/dh of the down projections 2·16·512 = 16,384 (x needs no gradient) = 50,176
    assert _matmuls(df) == {(s, p): v for s in range(3) for p, v in (("forward", 33_792), ("backward", 50_176))}
    assert _counted(counter) == 3 * (33_792 + 50_176)
    row = reports.breakdown(df).set_index("phase").loc["total"]
    assert (row["n_params"], row["n_active"], row["expected_active_flops"]) == (4160, 2112, 101_376)  # 6·2,112·8
    text = " ".join(reports.explain(df))
    assert "N = 4,160 parameters, of which each token uses N_active = 2,112 (top-2 of 4 experts)" in text
    # the input gradients the backward skips, per expert at its mean tokens per step: up.0 2·(17/3)·512 = 5,803
    assert "up.0.weight (512 parameters: 5,803 FLOPs); up.1.weight (512 parameters: 3,072 FLOPs)" in text


# ------------------------------------------------------------------ EMA of the weights after the optimizer step
def _ema_run(path, kind, steps=3):
    """`steps` AdamW steps of Linear(16, 32) -> ReLU -> Linear(32, 8) (N = 512 + 256 = 768, 808 parameters with the
    biases), then an EMA of the weights: AveragedModel's update_parameters (`kind` "averaged") or lerp_ under
    no_grad on a deep copy ("lerp"); traced into `path` unless None. The EMA's state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if kind == "averaged":
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    else:
        ema = copy.deepcopy(model).requires_grad_(False)
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    with Tracer(path, model=model, tokens=4) if path is not None else contextlib.nullcontext():
        for _ in range(steps):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if kind == "averaged":
                ema.update_parameters(model)
            else:
                with torch.no_grad():
                    for average, p in zip(ema.parameters(), model.parameters()):
                        average.lerp_(p, 0.1)
    return [t.clone() for t in ema.state_dict().values()]


@pytest.mark.parametrize("kind", ["lerp", "averaged"])
def test_an_ema_after_the_step_is_phase_other_and_outside_n(tmp_path, kind):
    traced = _ema_run(tmp_path / "ema3", kind)
    assert all(torch.equal(a, b) for a, b in zip(traced, _ema_run(None, kind)))
    df = reports.load(tmp_path / "ema3")
    other = df[df["phase"] == "other"].groupby("step", observed=True)["flops"].sum().tolist()
    # lerp_ of the 808 averaged values, 1 FLOP each; AveragedModel's first update copies them (0 FLOPs) and counts
    # its n_averaged (+1: 3 FLOPs with its two other scalar ops), later ones lerp (808) and count (3)
    assert other == ([808, 808, 808] if kind == "lerp" else [3, 811, 811])
    b = reports.breakdown(df).set_index("phase")
    assert b.loc["total", "n_params"] == 768 and b.loc["forward", "expected_flops"] == 6_144  # 2·768·4: no EMA copy
    assert b.loc["optimizer", "flops"] == 6_468  # AdamW on the 808 model parameters only, 8 per element + 4 steps
    if kind == "lerp":  # k identical steps give k x one
        _ema_run(tmp_path / "ema1", kind, steps=1)
        one = reports.by_step(reports.load(tmp_path / "ema1"))["flops"].tolist()
        assert reports.by_step(df)["flops"].tolist() == one * 3


# ------------------------------------------------------------------ activation checkpointing, reentrant or not
class _Blocks(torch.nn.Module):
    """Linear(8, 16), then 2 blocks Linear(16, 32) -> GELU -> Linear(32, 16), no biases, each checkpointed unless
    `reentrant` is None: N = 128 + 2·1,024 = 2,176; the first layer makes the blocks' input require grad, which
    use_reentrant=True needs to give the blocks' weights a gradient."""

    def __init__(self, reentrant):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16, bias=False)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.Linear(16, 32, bias=False), torch.nn.GELU(), torch.nn.Linear(32, 16, bias=False)
            )
            for _ in range(2)
        )
        self.reentrant = reentrant

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h) if self.reentrant is None else checkpoint(block, h, use_reentrant=self.reentrant)
        return h


def _checkpoint_run(path, reentrant, context=None):
    torch.manual_seed(0)
    model = _Blocks(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with Tracer(path, model=model, tokens=4) if path is not None else context or contextlib.nullcontext():
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointing_reentrant_or_not_counts_the_same_work_and_flags_its_recompute(tmp_path, reentrant):
    plain = _checkpoint_run(tmp_path / "plain", None)
    counter = FlopCounterMode(display=False)
    _checkpoint_run(None, reentrant, counter)
    traced = _checkpoint_run(tmp_path / "ck", reentrant)
    assert all(torch.equal(a, b) for a, b in zip(traced, plain))
    assert all(torch.equal(a, b) for a, b in zip(_checkpoint_run(None, reentrant), plain))
    df, base = reports.load(tmp_path / "ck"), reports.load(tmp_path / "plain")
    kept = df[~df["recompute"]].groupby(["step", "phase"], observed=True)["flops"].sum()
    assert kept.to_dict() == base.groupby(["step", "phase"], observed=True)["flops"].sum().to_dict()
    again = df[df["recompute"]]
    assert set(again["phase"]) == {"backward"} and set(again["module"].astype(str)) == {
        f"blocks.{b}.{i}" for b in range(2) for i in range(3)
    }
    # each step re-runs the blocks' first Linear and GELU: 2 blocks x (2·4·16·32 = 4,096 + 4·32 = 128); reentrant,
    # the second Linear too (2 x 4,096); non-reentrant, its early stop ends once GELU's output (all the backward
    # still needs: the second Linear saves its input) is made
    recompute = 2 * (4_096 + 128) + (2 * 4_096 if reentrant else 0)
    assert again.groupby("step", observed=True)["flops"].sum().tolist() == [recompute] * 2  # 16,640 or 8,448
    mm = 16_384 if reentrant else 8_192
    assert (
        again[again["op"].astype(str).isin(MATMULS)].groupby("step", observed=True)["flops"].sum().tolist() == [mm] * 2
    )
    # forward 2·2,176·4 = 17,408; backward dL/dW 17,408 + dL/dh of the blocks 4 x 4,096 = 16,384 (x needs none)
    # = 33,792, + the recompute's matmuls; FlopCounterMode counts the recompute too
    assert _matmuls(df) == {(s, p): v for s in range(2) for p, v in (("forward", 17_408), ("backward", 33_792 + mm))}
    assert _counted(counter) == 2 * (17_408 + 33_792 + mm)
    text = " ".join(reports.explain(df))
    assert f"Activation checkpointing: {recompute:,} FLOPs per step re-run forward work in the backward" in text
