"""tracer.Meter on the training loops users run: gradient accumulation, activation checkpointing, autocast with a
loss scale, LoRA adapters over frozen layers, a GAN, layer drop, a gradient penalty, evaluation between steps and a
loop in another thread.

Each loop runs three times from the same seed: metered; plain (no Meter: its losses and parameters must be bitwise
the metered run's); and with a Tracer around each step on its own, which gives what every step really costs (model
FLOPs: forward and backward rows not flagged recompute; hardware FLOPs: every row), so that a figure the meter
reuses is checked against the step it is given to, not only against the step it was traced on.
"""

import threading
import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.utils import _python_dispatch
from torch.utils.checkpoint import checkpoint

import reports
import tracer
from reports.flops.meter import meter_summary
from tests.tracer.metering.test_meter_steps import Net  # x [B, 8] -> fc1 [8 -> 16] -> relu -> fc2 [16 -> 4], no biases
from tracer import Tracer
from tracer.metering.meter import Meter

PEAK = 1e9  # FLOP/s, given


def _train(loss, opt):
    """A plain training step after the forward: backward, SGD step, zero_grad; the logged loss."""
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


# Net at batch B, loss = out.square().sum(), x needs no gradient (tests/tracer/metering/test_meter.py):
#   forward 408·B, backward 540·B: model 948·B; SGD's add_ per weight element 8·16 + 16·4 = 192


def _params(modules):
    return [p.detach().clone() for m in modules for p in m.parameters()]


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def metered(path, make, n, root="model", **kwargs):
    """Run `make()`'s loop for n steps under a Meter (model= its `root` module, or None): (logs, figures, params)."""
    torch.manual_seed(0)
    loop = make()
    m = Meter(path, model=loop[root] if root else None, peak_flops=PEAK, **kwargs)
    logs, figures = [], []
    for i in range(n):
        logs.append(loop["step"](i, m))
        figures.append(m.step())
    m.close()
    return logs, figures, _params(loop["modules"])


def plain(make, n):
    """The same loop without a Meter: (logs, params)."""
    torch.manual_seed(0)
    loop = make()
    logs = [loop["step"](i, None) for i in range(n)]
    return logs, _params(loop["modules"])


def truth(path, make, n):
    """(model FLOPs, hardware FLOPs) of each step of the loop, traced on its own by a Tracer around it."""
    torch.manual_seed(0)
    loop = make()
    found = []
    for i in range(n):
        with Tracer(path / str(i)):
            loop["step"](i, None)
        df = reports.load(path / str(i))
        model = df["flops"][df["phase"].isin(["forward", "backward"]) & ~df["recompute"]].sum()
        found.append((int(model), int(df["flops"].sum())))
    return found


def check(tmp_path, make, n, root="model", **kwargs):
    """Run the loop three ways; the program's results are bitwise the same metered. Returns (figures, the stored
    table's (model, hardware) per step, truth)."""
    logs, figures, params = metered(tmp_path / "metered", make, n, root, **kwargs)
    plain_logs, plain_params = plain(make, n)
    assert logs == plain_logs and _same(params, plain_params)
    table = reports.meter(tmp_path / "metered")
    stored = [tuple(None if v != v else int(v) for v in row) for row in table[["model_flops", "hardware_flops"]].values]
    return figures, stored, truth(tmp_path / "truth", make, n)


def _flops(figures):
    return [(f["model_flops"], f["hardware_flops"]) for f in figures]


# 1. gradient accumulation ------------------------------------------------------------------------------------------
def accumulation(batches, k=2):
    def make():
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        xs = [[torch.randn(b, 8) for _ in range(k)] for b in batches]

        def step(i, meter):
            logged = []
            for x in xs[i]:
                loss = net(x).square().sum() / k
                loss.backward()
                logged.append(loss.item())  # logging syncs: no graph, no FLOPs
            logged.append(torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0).item())
            opt.step()
            opt.zero_grad()
            return logged

        return {"model": net, "step": step, "modules": [net]}

    return make


def test_gradient_accumulation_with_clipping_and_item_logging(tmp_path):
    """k = 2 micro-batches per meter.step(): a step is both; the batch going from 2 to 3 is re-traced once."""
    figures, stored, real = check(tmp_path, accumulation([2, 2, 2, 2, 3, 3]), 6)
    # per micro-batch 948·B + loss / k (1 forward, 1 backward); the second backward adds into the gradients (192):
    #   model 2·(948·B + 2) + 192: B = 2 -> 3988, B = 3 -> 5884
    # clip_grad_norm_ (phase other): _foreach_norm 192, the norm of the 2 norms 2, + eps 1, reciprocal 1, · max 1,
    #   clamp 1, _foreach_mul_ 192 = 390; SGD 192: hardware model + 582 -> 4570, 6466
    assert [f["traced"] for f in figures] == [True, True, False, False, False, True]
    assert _flops(figures) == [(3988, 4570)] * 4 + [(None, None), (5884, 6466)]
    assert stored == real == [(3988, 4570)] * 4 + [(5884, 6466)] * 2


# 2. activation checkpointing ----------------------------------------------------------------------------------------
class CheckpointedNet(nn.Module):
    """x [B, 8] -> fc1 [8 -> 16] -> checkpoint(mid [16 -> 16] -> relu (-> extra [16 -> 16] -> relu when deep))
    -> fc2 [16 -> 4], no biases: the checkpointed segment's input requires grad (fc1's output), as in a model."""

    def __init__(self, reentrant):
        super().__init__()
        self.fc1 = nn.Linear(8, 16, bias=False)
        self.mid = nn.Linear(16, 16, bias=False)
        self.extra = nn.Linear(16, 16, bias=False)
        self.fc2 = nn.Linear(16, 4, bias=False)
        self.reentrant = reentrant

    def segment(self, h, deep):
        h = torch.relu(self.mid(h))
        return torch.relu(self.extra(h)) if deep else h

    def forward(self, x, deep=False):
        h = checkpoint(self.segment, self.fc1(x), deep, use_reentrant=self.reentrant)
        return self.fc2(h)


def checkpointed(reentrant, deeps):
    def make():
        net = CheckpointedNet(reentrant)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        xs = [torch.randn(2, 8) for _ in deeps]

        def step(i, meter):
            return _train(net(xs[i], deep=deeps[i]).square().sum(), opt)

        return {"model": net, "step": step, "modules": [net]}

    return make


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing_reuses_and_sees_a_layer_added_in_the_segment(tmp_path, reentrant):
    """Both checkpoint variants: fixed steps reuse the trace, recompute is hardware FLOPs only, and a layer added
    inside the checkpointed segment is re-traced. With use_reentrant=True the segment's forward runs under no_grad
    and makes no graph node: the extra layer is seen by the nodes its recompute makes in the backward (on the
    CPU the backward runs on the step's thread, so they count)."""
    deeps = [False, False, False, True, True]
    figures, stored, real = check(tmp_path, checkpointed(reentrant, deeps), 5)
    # B = 2. forward: fc1 2·2·8·16 = 512, mid 2·2·16·16 = 1024, relu 32, fc2 2·2·16·4 = 256, square, sum 8 each: 1840
    # backward: square 3·8 = 24, fc2 dW and dx 2·256 = 512, relu 32, mid dW and dx 2·1024 = 2048, fc1 dW 512 = 3128
    # model 4968; recompute mid + relu 1056; SGD 8·16 + 16·16 + 16·4 = 448: hardware 4968 + 1056 + 448 = 6472
    # deep: extra forward 1024 + 32, backward 2048 + 32, recompute 1056, SGD 256:
    #   model 4968 + 3136 = 8104, hardware 8104 + 2112 + 704 = 10920
    assert [f["traced"] for f in figures] == [True, True, False, False, True]
    assert _flops(figures) == [(4968, 6472)] * 3 + [(None, None), (8104, 10920)]
    assert stored == real == [(4968, 6472)] * 3 + [(8104, 10920)] * 2
    assert reports.meter(tmp_path / "metered")["recompute_flops"].tolist() == [1056] * 3 + [2112] * 2


# 3. autocast and a loss scale ---------------------------------------------------------------------------------------
def autocast_scaled(batches):
    def make():
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        xs = [torch.randn(b, 8) for b in batches]

        def step(i, meter):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = net(xs[i]).float().square().sum()
            (loss * 1024.0).backward()  # a GradScaler's scale, by hand
            with torch.no_grad():
                for p in net.parameters():
                    p.grad.div_(1024.0)  # unscaled before the step
            opt.step()
            opt.zero_grad()
            return loss.item()

        return {"model": net, "step": step, "modules": [net]}

    return make


def test_autocast_bf16_with_a_loss_scale(tmp_path):
    """Autocast's casts make graph nodes (the same number every step: a fresh cache per autocast block); the
    matmuls run in bfloat16, the dtype whose peak the meter uses; unscaling under no_grad is hardware FLOPs."""
    figures, stored, real = check(tmp_path, autocast_scaled([2, 2, 2, 3, 3]), 5)
    # model 948·B + the scale (1 forward, 1 backward): B = 2 -> 1898, B = 3 -> 2846
    # hardware + unscaling div_ 192 (phase other) + SGD 192: 2282, 3230
    assert [f["traced"] for f in figures] == [True, True, False, False, True]
    assert _flops(figures) == [(1898, 2282)] * 3 + [(None, None), (2846, 3230)]
    assert stored == real == [(1898, 2282)] * 3 + [(2846, 3230)] * 2
    assert reports.meter(tmp_path / "metered")["dtype"].tolist() == ["bfloat16"] * 5


# 4. LoRA ----------------------------------------------------------------------------------------------------------
class LoRA(nn.Module):
    """A frozen base Linear plus trainable adapters b(a(x)) of rank 2."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.base = nn.Linear(d_in, d_out, bias=False).requires_grad_(False)
        self.a = nn.Linear(d_in, 2, bias=False)
        self.b = nn.Linear(2, d_out, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


class LoRANet(nn.Module):
    """x [B, 8] -> (frozen prefix: two frozen Linear [8 -> 8] + relu; the second skipped when asked)
    -> LoRA [8 -> 16] -> relu -> LoRA [16 -> 4]."""

    def __init__(self):
        super().__init__()
        self.prefix = nn.ModuleList(nn.Linear(8, 8, bias=False) for _ in range(2)).requires_grad_(False)
        self.l1 = LoRA(8, 16)
        self.l2 = LoRA(16, 4)

    def forward(self, x, prefix=False, skip=False):
        if prefix:
            for i, layer in enumerate(self.prefix):
                if not (skip and i == 1):
                    x = torch.relu(layer(x))
        return self.l2(torch.relu(self.l1(x)))


def lora(batches, prefix=False, skips=None):
    skips = skips or [False] * len(batches)

    def make():
        net = LoRANet()
        opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
        xs = [torch.randn(b, 8) for b in batches]

        def step(i, meter):
            return _train(net(xs[i], prefix=prefix, skip=skips[i]).square().sum(), opt)

        return {"model": net, "step": step, "modules": [net]}

    return make


# LoRANet without the prefix at B = 2:
#   forward: l1 base 2·2·8·16 = 512, a 2·2·8·2 = 64, b 2·2·2·16 = 128, + 32; relu 32;
#            l2 base 2·2·16·4 = 256, a 2·2·16·2 = 128, b 2·2·2·4 = 32, + 8; square 8, sum 8: 1208
#   backward: square 24; l2 b dW and dx 2·32, a dW and dx 2·128, base dx 256 (its weight is frozen), the two dx
#             summed 32; relu 32; l1 b dW and dx 2·128, a dW 64 (x needs no gradient), base nothing: 984
#   model 2192 (B = 3: 3288); SGD over the adapters 8·2 + 2·16 + 16·2 + 2·4 = 88: hardware 2280 (3376)
def test_lora_adapters_over_frozen_layers(tmp_path):
    figures, stored, real = check(tmp_path, lora([2, 2, 2, 3, 3]), 5)
    assert [f["traced"] for f in figures] == [True, True, False, False, True]
    assert _flops(figures) == [(2192, 2280)] * 3 + [(None, None), (3288, 3376)]
    assert stored == real == [(2192, 2280)] * 3 + [(3288, 3376)] * 2


def test_a_change_confined_to_frozen_first_layers_is_not_seen(tmp_path):
    """The documented limit (docs/meter.md, Limits: "frozen modules before the first tensor that
    requires grad"): the frozen prefix runs on tensors that need no gradient, so its ops make no graph node, and
    skipping its second layer keeps the root's inputs and the step's node count. Steps 2 and 3 skip it, cost
    272 FLOPs less, and are metered with the traced steps' FLOPs."""
    skips = [False, False, True, True, False]
    figures, stored, real = check(tmp_path, lora([2] * 5, prefix=True, skips=skips), 5)
    # the prefix at B = 2: 2 · (2·2·8·8 + relu 16) = 544 forward, no backward: 2192 + 544 = 2736, hardware 2824
    assert [f["traced"] for f in figures] == [True, True, False, False, False]
    assert stored == _flops(figures) == [(2736, 2824)] * 5
    assert real == [(2736, 2824)] * 2 + [(2464, 2552)] * 2 + [(2736, 2824)]  # one prefix layer less: 544 / 2 = 272


# 5. a GAN ---------------------------------------------------------------------------------------------------------
def gan(batches, per_optimizer=False):
    def make():
        gen = nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU(), nn.Linear(8, 8, bias=False))
        disc = nn.Sequential(nn.Linear(8, 8, bias=False), nn.ReLU(), nn.Linear(8, 1, bias=False))
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
        zs, reals = [torch.randn(b, 4) for b in batches], [torch.randn(b, 8) for b in batches]

        def step(i, meter):
            fake = gen(zs[i])
            loss_d = disc(reals[i]).square().sum() + disc(fake.detach()).square().sum()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            if per_optimizer and meter is not None:
                meter.step()
            loss_g = (disc(fake) - 1).square().sum()
            opt_g.zero_grad()
            loss_g.backward()  # adds into the discriminator's gradients too, zeroed at the next step
            opt_g.step()
            return [loss_d.item(), loss_g.item()]

        return {"gen": gen, "step": step, "modules": [gen, disc]}

    return make


# At batch B: G forward 2·B·4·8 + relu 8·B + 2·B·8·8 = 200·B; three D calls 3·(2·B·8·8 + 8·B + 2·B·8) = 456·B;
# losses: square and sum 2·B twice, + 1, then - 1, square and sum 3·B: 7·B + 1.
# loss_d backward: squares 2 · 3·B; D through the real batch dW2 16·B, dx 16·B, relu 8·B, dW1 128·B (168·B) and
#   the fake one the same plus its weight gradients summed with the real one's, 8 + 64: 342·B + 72
# loss_g backward: square 3·B; D 168·B + dx1 128·B, adding into its gradients 8 + 64; G dW2 128·B, dx2 128·B,
#   relu 8·B, dW1 64·B: 627·B + 72
# model 1632·B + 145: B = 2 -> 3409, B = 3 -> 5041; SGD D 64 + 8, G 32 + 64: hardware + 168 -> 3577, 5209
@pytest.mark.parametrize("root", ["gen", None], ids=["model=generator", "first-module-called"])
def test_a_gan_step_with_two_models_and_two_optimizers(tmp_path, root):
    """Two optimizer steps in one meter step; with model=None the generator, called first, is the root."""
    figures, stored, real = check(tmp_path, gan([2, 2, 2, 3, 3]), 5, root=root)
    assert [f["traced"] for f in figures] == [True, True, False, False, True]
    assert _flops(figures) == [(3409, 3577)] * 3 + [(None, None), (5041, 5209)]
    assert stored == real == [(3409, 3577)] * 3 + [(5041, 5209)] * 2
    assert len(module_hooks._global_forward_pre_hooks) == len(module_hooks._global_forward_hooks) == 0


def test_a_gan_metered_per_optimizer_step_alternates_two_signatures(tmp_path):
    """A limit (docs/meter.md, Limits: a signature that never comes twice in a row): with
    meter.step() after each optimizer's step, the discriminator's steps and the generator's alternate. By default
    the first two steps are traced, one of each, and every step has its FLOPs. After warmup=1 the first trace is
    alone: each discriminator step is then new, so the generator step after it is traced, until max_traces; the
    discriminator's steps get no FLOPs (no estimate either: no traced step has their node count)."""
    # B = 2. discriminator step: G forward 200·B, two D calls 304·B, their losses 4·B + 1, loss_d's backward
    #   342·B + 72: model 850·B + 73 = 1773; its SGD 72: hardware 1845. The generator's: 3409 - 1773 = 1636, 3577 -
    #   1845 = 1732 (its SGD 96)
    _, figures, _ = metered(tmp_path / "gan", gan([2] * 5, per_optimizer=True), 5, root="gen", max_traces=3)
    table = reports.meter(tmp_path / "gan")
    assert table["traced"].tolist() == [True, True] + [False] * 8
    assert table["model_flops"].tolist()[::2] == [1773] * 5 and table["hardware_flops"].tolist()[::2] == [1845] * 5
    assert table["model_flops"].tolist()[1::2] == [1636] * 5 and table["hardware_flops"].tolist()[1::2] == [1732] * 5
    assert [f["model_flops"] for f in figures] == [1636] * 5  # the generator's steps, as step() gave them
    assert meter_summary(tmp_path / "gan")["unknown_flops_steps"] == 0
    _, figures, _ = metered(tmp_path / "warm", gan([2] * 5, per_optimizer=True), 5, root="gen", max_traces=3, warmup=1)
    table = reports.meter(tmp_path / "warm")
    assert table["traced"].tolist() == [False, True] * 3 + [False] * 4
    assert table["model_flops"].tolist()[1::2] == [1636] * 5 and table["hardware_flops"].tolist()[1::2] == [1732] * 5
    assert table["model_flops"].isna().tolist()[::2] == [True] * 5
    assert [f["model_flops"] for f in figures] == [1636] * 5  # the generator's steps, as step() gave them
    assert meter_summary(tmp_path / "warm")["unknown_flops_steps"] == 5


# 6. layer drop ----------------------------------------------------------------------------------------------------
class LayerDrop(nn.Module):
    """x [B, 8] -> inp [8 -> 8] -> two residual blocks x + relu(block(x)) [8 -> 8], each kept with probability 1/2
    by the model's own seeded generator -> out [8 -> 4], no biases."""

    def __init__(self, seed):
        super().__init__()
        self.inp = nn.Linear(8, 8, bias=False)
        self.blocks = nn.ModuleList(nn.Linear(8, 8, bias=False) for _ in range(2))
        self.out = nn.Linear(8, 4, bias=False)
        self.rng = torch.Generator().manual_seed(seed)

    def forward(self, x):
        x = self.inp(x)
        for block, keep in zip(self.blocks, (torch.rand(2, generator=self.rng) >= 0.5).tolist()):
            if keep:
                x = x + torch.relu(block(x))
        return self.out(x)


SEED = 373  # blocks kept per step: the test's first assertion


def layer_drop(n):
    def make():
        net = LayerDrop(SEED)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        xs = [torch.randn(2, 8) for _ in range(n)]

        def step(i, meter):
            return _train(net(xs[i]).square().sum(), opt)

        return {"model": net, "step": step, "modules": [net]}

    return make


def test_layer_drop_retraces_a_depth_that_repeats_and_leaves_a_lone_one_unknown(tmp_path):
    """Which blocks run is decided inside the model: the root's inputs do not change, the step's node count does.
    Blocks are alike, so which one ran does not matter (the same count, the same FLOPs). A depth seen twice in a
    row is traced at its second step and gives the first its FLOPs; a depth seen once (no block, step 5) costs a
    traced step of the next step's depth and stays without FLOPs, named in the report's unknown_flops_steps (no
    estimate: an estimate is made only from a trace with the same node count)."""
    rng = torch.Generator().manual_seed(SEED)
    kept = [(torch.rand(2, generator=rng) >= 0.5).int().tolist() for _ in range(8)]
    assert kept == [[1, 0], [0, 1], [1, 0], [1, 1], [1, 1], [0, 0], [1, 0], [0, 1]]
    figures, stored, real = check(tmp_path, layer_drop(8), 8)
    # B = 2, per block kept: forward 2·2·8·8 = 256, relu 16, residual add 16; backward dW and dx 2·256, relu 16,
    #   the residual's two gradients summed 16; SGD 64: model 832, hardware 896
    # no block: inp 256, the draw's >= 0.5 2, out 2·2·8·4 = 128, square 8, sum 8; backward 24, out dW and dx
    #   2·128, inp dW 256: model 938; SGD 64 + 32 = 96 (a dropped block's weight has no gradient): hardware 1034
    one, two, none = (938 + 832, 1034 + 896), (938 + 2 * 832, 1034 + 2 * 896), (938, 1034)
    assert [f["traced"] for f in figures] == [True, True, False, False, True, False, True, False]
    assert _flops(figures) == [one] * 3 + [(None, None), two, (None, None), one, one]
    assert real == [one] * 3 + [two] * 2 + [none] + [one] * 2
    assert stored == [one] * 3 + [two] * 2 + [(None, None)] + [one] * 2
    summary = meter_summary(tmp_path / "metered")
    assert (summary["unknown_flops_steps"], summary["estimated_flops_steps"]) == (1, 0)


# 7. a gradient penalty --------------------------------------------------------------------------------------------
def gradient_penalty(batches, penalties):
    def make():
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        xs = [torch.randn(b, 8) for b in batches]

        def step(i, meter):
            x = xs[i].clone().requires_grad_()
            y = net(x)
            loss = y.square().sum()
            if penalties[i]:
                (grad,) = torch.autograd.grad(y.sum(), x, create_graph=True)  # nodes made in this backward
                loss = loss + grad.square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item()

        return {"model": net, "step": step, "modules": [net]}

    return make


def test_a_gradient_penalty_with_create_graph(tmp_path):
    """backward(create_graph=True) makes graph nodes in the backward, on the step's thread on a CPU: the same count
    every step. The batch going from 2 to 3 and the penalty dropped are each re-traced."""
    batches, penalties = [2, 2, 2, 3, 3, 3, 3], [True] * 5 + [False] * 2
    figures, stored, real = check(tmp_path, gradient_penalty(batches, penalties), 7)
    # forward 408·B + y.sum() 4·B; the penalty's gradient: fc2 dx 128·B, relu 16·B, fc1 dx 256·B; its square and
    # sum 16·B and the add 1; backward: the penalty's square 24·B, through the gradient's graph 2·256·B + 16·B +
    # 128·B, the loss's square 12·B, fc2 dW and dx 256·B, the relu output's two gradients summed 16·B, relu 16·B,
    # fc1 dW and dx 512·B, and each weight's two gradients summed 64 + 128:
    #   model 2320·B + 193: B = 2 -> 4833, B = 3 -> 7153; SGD 192: 5025, 7345
    # no penalty (x requires grad: fc1's dx 2·B·16·8 more than Net's 948·B): model 1204·B = 3612 at B = 3, 3804
    assert [f["traced"] for f in figures] == [True, True, False, False, True, False, True]
    assert _flops(figures) == [(4833, 5025)] * 3 + [(None, None), (7153, 7345), (None, None), (3612, 3804)]
    assert stored == real == [(4833, 5025)] * 3 + [(7153, 7345)] * 2 + [(3612, 3804)] * 2


# 8. evaluation between steps ----------------------------------------------------------------------------------------
def with_evaluation(batches, eval_batches):
    def make():
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        xs, evals = [torch.randn(b, 8) for b in batches], [torch.randn(b, 8) for b in eval_batches]

        def step(i, meter):
            if meter is not None:
                meter.begin()
            return _train(net(xs[i]).square().sum(), opt)

        def evaluate(i):
            with torch.no_grad():
                return net(evals[i]).sum().item()

        return {"model": net, "step": step, "evaluate": evaluate, "modules": [net]}

    return make


def test_an_evaluation_between_steps_with_begin(tmp_path):
    """begin() before each training step: the evaluation after step() (its batch changing from 5 to 6) is in no
    step's signature, FLOPs or time; the training batch going from 2 to 3 is re-traced."""
    make = with_evaluation([2, 2, 2, 3, 3], [5, 5, 6, 6, 6])
    torch.manual_seed(0)
    loop = make()
    m = Meter(tmp_path / "eval", model=loop["model"], peak_flops=PEAK)
    logs, figures = [], []
    for i in range(5):
        logs.append(loop["step"](i, m))
        figures.append(m.step())
        logs.append(loop["evaluate"](i))
    m.close()
    torch.manual_seed(0)
    again = make()
    assert logs == [v for i in range(5) for v in (again["step"](i, None), again["evaluate"](i))]
    assert _same(_params([loop["model"]]), _params([again["model"]]))
    assert [f["traced"] for f in figures] == [True, True, False, False, True]
    assert _flops(figures) == [(1896, 2088)] * 3 + [(None, None), (2844, 3036)]  # 948 · 2 + 192, 948 · 3 + 192
    df = reports.load(tmp_path / "eval")
    batches = {int(shape[0]) for shapes in df["input_shapes"] for shape in shapes if len(shape) == 2 and shape[1] == 8}
    assert batches == {2, 3, 16}  # the training batches (and fc1's weight [16, 8]): no evaluation row traced


# the first step ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["momentum", "zero_grad-in-place"])
def test_a_first_step_unlike_the_next_keeps_its_own_flops_and_the_second_s_trace_serves_the_rest(tmp_path, case):
    """The first step makes what later steps update (SGD's momentum buffer is a copy of the first gradient, later
    a multiply-add; gradients zeroed in place rather than set to None are added into from the second backward on),
    with the same signature. Without warmup= the first two steps are traced: step 0 keeps its own FLOPs and step
    1's trace serves the later steps, each exactly what a Tracer around it alone counts. With warmup=1 the trace is
    of step 1, like all that follow (step 0 then gets step 1's); with max_traces=1 only step 0 is traced and the
    later steps get its FLOPs."""
    momentum, to_none = (0.9, True) if case == "momentum" else (0.0, False)

    def make():
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
        xs = [torch.randn(2, 8) for _ in range(4)]

        def step(i, meter):
            loss = net(xs[i]).square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=to_none)
            return loss.item()

        return {"model": net, "step": step, "modules": [net]}

    # step 0: model 1896, SGD 192. Later: momentum: buf.mul_ and add_ 2 · 192 more; in place: backward adds into
    # the zeroed gradients, 192 more (model FLOPs)
    later = (1896, 2472) if momentum else (2088, 2280)
    first = (1896, 2088)
    figures, stored, real = check(tmp_path, make, 4)
    assert real == [first] + [later] * 3
    assert [f["traced"] for f in figures] == [True, True, False, False]
    assert stored == _flops(figures) == real  # steps 2 and 3 reuse step 1's trace
    assert reports.meter(tmp_path / "metered")["flops_from_step"].tolist() == [0, 1, 1, 1]
    figures, stored, _ = check(tmp_path / "warm", make, 4, warmup=1)
    assert [f["traced"] for f in figures] == [False, True, False, False]
    assert stored == [later] * 4
    figures, stored, _ = check(tmp_path / "cap", make, 4, max_traces=1)
    assert [f["traced"] for f in figures] == [True, False, False, False]
    assert stored == _flops(figures) == [first] * 4  # the cap: step 0's FLOPs for all


# a loop in another thread ------------------------------------------------------------------------------------------
def _in_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (the test reports it)
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert errors == []


def test_steps_ended_in_another_thread_than_the_meter_s_are_not_metered(tmp_path):
    """The Tracer records only the thread that entered it (its dispatch mode is thread-local). A loop run in a
    thread of its own, with the Meter made outside it: step() and begin() there warn once, count an error and
    return unknown figures; nothing is traced, the tracer's mode is left where it is and close() on the Meter's
    thread closes the trace. Before, step() there took the mode off a stack it was not on: every step failed and
    close() raised IndexError into the program."""
    stack = torch._C._len_torch_dispatch_stack()
    torch.manual_seed(0)
    loop = with_evaluation([2, 2, 2, 3], [5] * 4)()
    m = Meter(tmp_path / "thread", model=loop["model"], peak_flops=PEAK)
    logs, figures = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _in_thread(lambda: [(logs.append(loop["step"](i, m)), figures.append(m.step())) for i in range(4)])
        m.close()
    assert [str(w.message) for w in caught] == [
        "optrace: meter: could not meter a step (TraceError: begin() on another thread than the one that made the "
        "Meter, which alone is traced: make the Meter in the thread that runs the loop); the program runs on"
    ]
    assert figures == [{**dict.fromkeys(figures[0]), "traced": False, "flops_estimated": False}] * 4
    assert m.errors == 8  # four begin() and four step()
    meta = tracer.read_metadata(tmp_path / "thread")
    assert meta["complete"] and meta["meter"]["errors"] == 8 and meta["meter"]["steps"]["step"] == []
    assert torch._C._len_torch_dispatch_stack() == stack and not _python_dispatch._is_in_torch_dispatch_mode
    assert len(module_hooks._global_forward_pre_hooks) == 0 and len(loop["model"]._forward_hooks) == 0
    torch.manual_seed(0)
    again = with_evaluation([2, 2, 2, 3], [5] * 4)()
    assert logs == [again["step"](i, None) for i in range(4)]


def test_a_meter_made_in_the_loop_s_thread_closes_from_another(tmp_path):
    """The Meter made in the thread that runs the loop meters it; closed from another thread (the interpreter's
    exit handler runs on the main one) while a re-trace is on (the last step was a new batch), the trace closes
    complete: the tracer's mode, left on the loop thread's stack, runs anything more untraced. Before, close()
    popped this thread's dispatch stack and raised RuntimeError."""
    stack = torch._C._len_torch_dispatch_stack()
    torch.manual_seed(0)
    loop = with_evaluation([2, 2, 2, 3], [5] * 4)()
    made, figures = [], []

    def run():
        made.append(Meter(tmp_path / "thread", model=loop["model"], peak_flops=PEAK))
        for i in range(4):
            loop["step"](i, None)
            figures.append(made[0].step())

    _in_thread(run)
    made[0].close()
    assert [f["traced"] for f in figures] == [True, True, False, False]
    assert _flops(figures) == [(1896, 2088)] * 3 + [(None, None)]
    meta = tracer.read_metadata(tmp_path / "thread")
    assert meta["complete"] and meta["meter"]["errors"] == 0
    table = reports.meter(tmp_path / "thread")
    # step 3 (B = 3) never traced: estimated at close from B = 2, scaled by 3/2: 2844 and (2088 - 192) · 3/2 + 192
    assert table["model_flops"].tolist() == [1896] * 3 + [2844] and table["hardware_flops"].iloc[3] == 3036
    assert table["flops_estimated"].tolist() == [False] * 3 + [True]
    assert torch._C._len_torch_dispatch_stack() == stack and not _python_dispatch._is_in_torch_dispatch_mode
    assert len(loop["model"]._forward_hooks) == 0


# a GradScaler that skips its first steps ---------------------------------------------------------------------------
def skipping(skipped):
    """fp16 under a fresh GradScaler: the first steps' gradients overflow and it skips their opt.step() (as here,
    with the scaler's decision written out: the steps in `skipped` run no update)."""

    def make():
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        x = torch.randn(2, 8)

        def step(i, meter):
            loss = net(x).square().sum()
            loss.backward()
            if i not in skipped:
                opt.step()
            opt.zero_grad()
            return loss.item()

        return {"model": net, "step": step, "modules": [net]}

    return make


def test_steps_a_grad_scaler_skipped_do_not_serve_the_steps_that_update(tmp_path):
    """The two traced steps ran no optimizer step: the later steps, which do, got their hardware FLOPs without the
    update. The signature counts the optimizer steps of a step, so the first updating step is traced again."""
    figures, stored, true = check(tmp_path, skipping({0, 1}), 6)
    assert [f["traced"] for f in figures] == [True, True, False, True, False, False]
    # batch 2: model 948·2 = 1,896; SGD 192 more in the hardware FLOPs of the steps that update
    assert stored == true == [(1896, 1896)] * 2 + [(1896, 2088)] * 4
    assert _flops(figures)[4:] == [(1896, 2088)] * 2  # were (1896, 1896)
