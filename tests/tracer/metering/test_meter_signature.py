"""tracer.metering.meter.Meter's step signature (graph nodes, input shapes, nested offsets; two traced steps): steps whose work
changed where a signature might not look, compiled models."""

import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.nn.modules.module as module_hooks
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tracer.metering.flops import input_size, settled, signature
from tracer.metering.meter import Meter

PEAK = 1e9  # FLOP/s, given


class Branchy(nn.Module):
    """x [2, 8] -> a [8 -> 8], then b [8 -> 8] when `deep`; no biases."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8, bias=False)
        self.b = nn.Linear(8, 8, bias=False)

    def forward(self, x, deep=False):
        x = self.a(x)
        return self.b(x) if deep else x


def _flops(figures):
    return [f["model_flops"] for f in figures]


def test_a_branch_taken_in_an_evaluation_step_under_no_grad_is_a_new_signature(tmp_path):
    """Under no_grad a step makes no graph nodes, so the node count cannot see a branch: the root calls made
    without grad count the modules they call (as the meter did for every step before). Before, the evaluation
    steps that also ran `b` reused the 256 FLOPs of the steps that did not, silently."""
    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.randn(2, 8)
    with FlopCounterMode(display=False) as counter:
        with torch.no_grad():
            model(x, deep=True)
    assert counter.get_total_flops() == 512  # two matmuls 2·2·8·8 = 256 each
    figures = []
    with torch.no_grad():
        meter = Meter(tmp_path / "eval", model=model, peak_flops=PEAK)
        for deep in [False, False, False, True, True, True]:
            model(x, deep=deep)
            figures.append(meter.step())
        meter.close()
    assert [f["traced"] for f in figures] == [True, True, False, False, True, False]
    assert _flops(figures) == [256, 256, 256, None, 512, 512]
    assert len(module_hooks._global_forward_pre_hooks) == 0 and len(model._forward_hooks) == 0
    assert len(model._forward_pre_hooks) == 0


def test_a_no_grad_root_call_that_raises_leaves_no_global_hook(tmp_path):
    """The global hook that counts a no-grad root call's modules comes off at the step's end when the call raised
    (the root's forward hook, which takes it off, did not run)."""
    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.randn(2, 8)
    with torch.no_grad():
        meter = Meter(tmp_path / "raise", model=model, peak_flops=PEAK, max_traces=2)  # no re-trace after
        for _ in range(2):  # the two traced steps
            model(x)
            meter.step()
        try:
            model(torch.randn(2, 3))  # a: 8 inputs expected
        except RuntimeError:
            pass
        meter.step()
        assert len(module_hooks._global_forward_pre_hooks) == 0
        model(x)
        meter.close()
    assert len(module_hooks._global_forward_pre_hooks) == 0 and len(model._forward_hooks) == 0


class Compiled(nn.Module):
    """A module of its own for torch.compile (Dynamo keeps its state per code object)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_the_root_hooks_do_not_break_a_compiled_model_s_graph(tmp_path):
    """Dynamo traces the root's hooks with its forward: the thread check in them was a builtin it cannot trace, so
    each hook broke the user's compiled graph (2 graph breaks a call) with a warning that `python -W error` raised
    into the program as InternalTorchDynamoError. The hooks now do nothing while Dynamo compiles (the steps run
    compiled are untraced warm-up steps, whose node count is the compiled graph's anyway)."""
    import warnings

    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = Compiled()
    compiled = torch.compile(model, backend="eager")
    breaks = sum(counters["graph_break"].values())
    meter = Meter(tmp_path / "compiled", model=compiled, warmup=3, peak_flops=PEAK)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(2):
                compiled(torch.randn(2, 8)).sum().backward()
                meter.step()
    finally:
        meter.close()
    assert sum(counters["graph_break"].values()) == breaks
    assert meter.errors == 0 and len(model._forward_hooks) == 0 and len(model._forward_pre_hooks) == 0


@pytest.mark.parametrize("how", ["wrapper", "in place"])
def test_a_model_compiled_with_aot_autograd_is_metered_after_two_traces(tmp_path, how):
    """An AOT-compiled step makes one graph node per compiled graph, the traced step (run eagerly) one per op; and
    model.compile() runs the root's hooks inside the compiled code, which skips them. The signatures never matched:
    every other step was traced again (eagerly) and none got FLOPs."""
    torch.manual_seed(0)
    model = Compiled()
    if how == "wrapper":
        root = torch.compile(model, backend="aot_eager")
    else:
        model.compile(backend="aot_eager")
        root = model
    x, wide = torch.randn(2, 8), torch.randn(3, 8)
    traced, flops = [], []
    with Meter(tmp_path / "aot", model=root, peak_flops=PEAK) as meter:
        for batch in (x, x, x, x, x, wide, wide, wide):
            root(batch).sum().backward()
            figures = meter.step()
            traced.append(figures["traced"])
            flops.append(figures["hardware_flops"])
    assert traced == [True, True, False, False, False, False, True, False]  # the wider batch: traced once
    # forward 2·2·8·4 = 128 + relu 8 + sum 8; backward: threshold 8 + dW 128 (x needs no gradient) = 280; from the
    # second step on the gradient is added into fc.weight's .grad (no zero_grad): + 4·8 = 32
    assert flops[:5] == [280, 312, 312, 312, 312] and flops[5] is None
    assert flops[6:] == [452, 452]  # batch 3: 2·3·8·4 = 192 + 12 + 12 + 12 + 192 + 32 = 452
    assert meter.errors == 0
    assert model.__dict__.get("_compiled_call_impl") is None or model._compiled_call_impl.__name__ != "call"


# Model FLOPs per step of DictNet and LoopNet at batch B (x needs no gradient, loss = fc(x).sum()):
#   forward 2·B·8·8 + sum B·8, backward dW 2·B·8·8  ->  B = 2: 528, B = 16: 4,224
class DictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)

    def forward(self, batch):
        return self.fc(batch["x"]).sum()


class LoopNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)

    def forward(self, x, depth=1):
        for _ in range(depth):
            x = self.fc(x)
        return x.sum()


def _metered(path, net, calls):
    m = Meter(path, model=net, peak_flops=1e9)
    out = []
    for call in calls:
        call().backward()
        net.zero_grad(set_to_none=True)
        out.append(m.step()["model_flops"])
    m.close()
    return out


def test_meter_sees_a_shape_change_inside_a_dict_batch(tmp_path):
    torch.manual_seed(0)
    net = DictNet()
    xs = {2: torch.randn(2, 8), 16: torch.randn(16, 8)}
    got = _metered(tmp_path / "d", net, [lambda b=b: net({"x": xs[b]}) for b in (2, 2, 16, 16)])
    assert got[3] == 4224  # 2·16·64·2 + 16·8; the meter returns 528 (B = 2's)


def test_meter_sees_a_module_called_more_times(tmp_path):
    torch.manual_seed(0)
    net = LoopNet()
    x = torch.randn(2, 8)
    got = _metered(tmp_path / "l", net, [lambda k=k: net(x, depth=k) for k in (1, 1, 4, 4)])
    # depth 4: forward 4·(2·2·8·8) + sum 2·8, backward dW 4·256, dx 3·256 (x needs none) and the 4 dW summed
    # into one gradient, 3·8·8: 1024 + 16 + 1024 + 768 + 192
    assert got == [528, 528, None, 3024]  # the meter reused depth 1's 528


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
