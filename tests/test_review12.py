"""A review of the changes since 73d9634: the graphless ops after the optimizer (tracer/dispatch.py `_GRAPHLESS`),
optrace's global module hooks (tracer/safety.py `GlobalModuleHook`), a nested tensor in the meter's signature
(tracer/meter_flops.py) and explain's tokens= question (reports/flops/explain.py). Each test failed before its fix."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import reports
import tracer.attribution
from tracer import Tracer
from tracer.meter import Meter
from tracer.meter_flops import input_size, settled, signature


# ------------------------------------------------------------------ a functional forward that begins with zeros_like(w)
def functional_loop(iters):
    """A model written as a function of a leaf tensor (no module): its forward begins with `torch.zeros_like(w)`,
    an op whose output never requires grad, after the step before's optimizer."""
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)
    opt = torch.optim.SGD([w], lr=0.1)

    def run():
        for _ in range(iters):
            noise = torch.zeros_like(w)  # a perturbation of the weights, the forward's first op
            (x @ (w + noise)).square().sum().backward()
            opt.step()
            opt.zero_grad()
        return w

    return run


def test_a_functional_forward_that_begins_with_zeros_like_of_a_parameter_opens_its_step(tmp_path):
    """Before: each iteration's zeros_like(w) was phase other in the step before (step 0 had two, the last none):
    k identical iterations gave unequal steps. zeros_like(loss) after the optimizer stays other
    (tests/tracer/recording/test_step_boundaries.py): the loss is no leaf, w is."""
    run_one, run_three = functional_loop(1), functional_loop(3)
    with Tracer(tmp_path / "one"):
        run_one()
    with Tracer(tmp_path / "three"):
        out = run_three()
    assert torch.equal(out, functional_loop(3)())  # bitwise, untraced
    one, three = reports.load(tmp_path / "one"), reports.load(tmp_path / "three")
    made = three[three["op"] == "aten.zeros_like.default"]
    assert made.groupby(["step", "phase"], observed=True).size().to_dict() == {(s, "forward"): 1 for s in range(3)}
    columns = ["op", "phase", "module", "flops", "bytes_read", "bytes_written", "bytes_allocated"]
    ref = one[columns].astype(str).values.tolist()
    for step, rows in three.groupby("step"):
        assert rows[columns].astype(str).values.tolist() == ref, step
    with FlopCounterMode(display=False) as counter:
        functional_loop(1)()
    # x [2, 4] @ w [4, 4]: 2·2·4·4 = 64; backward dW = xᵀ [4, 2] @ dy [2, 4]: 2·4·2·4 = 64 (x needs no gradient)
    mm = three[three["op"] == "aten.mm.default"].groupby("step")["flops"].sum().tolist()
    assert mm == [counter.get_total_flops()] * 3 == [128] * 3


# ------------------------------------------------------------------ a Tracer whose hooks could not all go on
def test_a_tracer_whose_install_is_interrupted_leaves_no_global_hook(tmp_path, monkeypatch):
    """Before: a Ctrl-C (or any error) between the hooks' registrations left the global module hooks already
    on for good (every later module call ran them) and PyTorch's `_has_any_global_hook` replaced for good."""
    module = torch.nn.modules.module
    original = module._has_any_global_hook
    before = [len(getattr(module, d)) for d in ("_global_forward_pre_hooks", "_global_forward_hooks")]

    def interrupted(hook):
        raise KeyboardInterrupt

    monkeypatch.setattr(tracer.attribution.optim_hooks, "register_optimizer_step_pre_hook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with Tracer(tmp_path / "t", model=nn.Linear(2, 2)):
            pass
    assert [len(getattr(module, d)) for d in ("_global_forward_pre_hooks", "_global_forward_hooks")] == before
    assert module._has_any_global_hook is original


# ------------------------------------------------------------------ jagged inputs of equal total length
D = 8  # width; 2 heads of 4


class JaggedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x):
        q = self.proj(x).unflatten(-1, (2, 4)).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q).transpose(1, 2).flatten(-2).values().sum()


def test_jagged_batches_of_one_total_length_but_other_lengths_are_two_signatures(tmp_path):
    """Sequences of lengths (2, 6) and (4, 4) pack into the same [8, 8] values. Before: one signature, so the third
    step (2, 6) got the second's (4, 4) FLOPs, silently; now the offsets are in the signature."""
    torch.manual_seed(0)
    net = JaggedAttention()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    figures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype API
        with Meter(tmp_path / "m", model=net, tokens=8, peak_flops=1e12) as meter:
            for lengths in [(2, 6), (4, 4), (2, 6), (4, 4)]:
                x = torch.nested.nested_tensor([torch.randn(n, D) for n in lengths], layout=torch.jagged)
                net(x).backward()
                opt.step()
                opt.zero_grad()
                figures.append(meter.step())
    assert meter.errors == 0 and [f["flops_estimated"] for f in figures] == [False] * 4
    # the two lengths differ only where a sequence's length is squared (2² + 6² = 40 against 4² + 4² = 32, 2 heads of
    # width 4): q @ kᵀ and att @ v 2·2·4·2·(40 - 32) = 256, softmax 5·2·8 = 80, its backward 4·2·8 = 64, the two
    # products' backward (matmul_backward, two gradients each) 4·2·2·4·(40 - 32) = 512: 912
    # (the projection's backward on the jagged input is linear_backward: dL/dW 2·8·8·8 = 1,024 of each step's 7,062;
    # the products' backward 4·2·2·4·40 = 2,560 of it)
    assert [f["model_flops"] for f in figures] == [7062, 6150, 7062, 6150] and 7062 - 6150 == 256 + 80 + 64 + 512


def test_a_jagged_signature_without_readable_offsets_keeps_the_packed_shape():
    """Offsets without data (the meta device) cannot be read at step(): the signature keeps the packed shape, and
    the step is metered, not failed."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(5, 3)], layout=torch.jagged)
        on_meta = x.to("meta")
    calls = settled([signature((x,), {}), signature((on_meta,), {})])
    assert calls == (((torch.Size([7, 3]), torch.float32, (0, 2, 7)),), ((torch.Size([7, 3]), torch.float32, ()),))
    assert input_size(calls) == (2 * 7 * 3, ((2, torch.float32), (2, torch.float32)))  # 2 x 21 packed elements


# ------------------------------------------------------------------ explain: a layer shared across depth
class SharedDepth(nn.Module):
    """One layer applied 3 times (ALBERT's sharing across depth), then a head: N = 16·16 + 16·2 = 288."""

    def __init__(self):
        super().__init__()
        self.layer, self.head = nn.Linear(16, 16, bias=False), nn.Linear(16, 2, bias=False)

    def forward(self, x):
        for _ in range(3):
            x = torch.relu(self.layer(x))
        return self.head(x)


def test_explain_on_a_layer_called_three_times_does_not_only_doubt_tokens(tmp_path):
    """The shared layer multiplies 3·T tokens: before, explain asked only whether tokens= was the tokens per step
    (it is); a whole multiple of T names the layer called k times as the other answer."""
    torch.manual_seed(0)
    net, x = SharedDepth(), torch.randn(4, 16)
    with Tracer(tmp_path / "t", model=net, tokens=4):
        net(x).sum().backward()
    with FlopCounterMode(display=False) as counter:
        net(x)
    text = "\n".join(reports.explain(reports.load(tmp_path / "t")))
    # forward: 3 x 2·4·16·16 = 6,144 + head 2·4·16·2 = 256 = 6,400
    assert counter.get_total_flops() == 6400 and "Forward weight matmuls: 6,400 FLOPs" in text
    assert "layer.weight 3.00x (12 tokens)" in text  # 3 calls x 4 rows
    assert ("256 of the N = 288 parameters multiplied 12 tokens per step each: is tokens= (4) the tokens per step, "
            "or is each of them called 3 times a step (a layer shared across depth)?") in text


def test_explain_on_forward_passes_in_one_step_names_tracer_step(tmp_path):
    """A forward-only loop with no Tracer.step() is one step (no backward or optimizer step ends one): explain's
    question on the tokens adds the passes as an answer, and with step() after each pass each pass is a step of
    exactly 2·N·T. Linear(16, 32) and Linear(32, 16) on 8 rows: N = 16·32 + 32·16 = 1,024."""
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)), torch.randn(8, 16)
    for stepped in (False, True):
        with torch.no_grad(), Tracer(tmp_path / f"t{stepped}", model=net, tokens=8) as tr:
            for _ in range(5):
                net(x)
                if stepped:
                    tr.step()
        df = reports.load(tmp_path / f"t{stepped}")
        text = "\n".join(reports.explain(df))
        forward = reports.breakdown(df).set_index("phase").loc["forward"]
        if not stepped:
            # 5 passes x 2·8·1,024 = 81,920 weight-matmul FLOPs in the one step: 10.00·N·T
            assert "Forward weight matmuls: 81,920 FLOPs = 10.00·N·T" in text
            assert ("is tokens= (8) the tokens per step, or is each of them called 5 times a step (a layer shared "
                    "across depth, or 5 forward passes in one step: call Tracer.step() after each pass)?") in text
        else:
            # per step: 2·8·1,024 = 16,384, ratio 1 to 2·N·T
            assert "Forward weight matmuls: 16,384 FLOPs = 2.00·N·T" in text and "forward passes" not in text
            assert forward["expected_flops"] == 16384 and forward["weight_matmul_flops"] == 16384
