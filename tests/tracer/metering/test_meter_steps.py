"""tracer.metering.meter.Meter's steps: work that changed where the signature did not look, step(tokens=) given as a tensor,
step() after close and after a failure, a step begun again, a boundary before any work, a conv net's MFU."""

import numpy as np
import pytest
import torch
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks
from torch import nn
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

import reports
import tracer
from tracer.errors import TraceError
from tracer.metering.meter import Meter

PEAK = 1e9  # FLOP/s, given
_FLAGS = (
    "_is_in_torch_dispatch_mode",
    "_is_in_non_infra_torch_dispatch_mode",
    "_is_in_any_mode_without_ignore_compile_internals",
)


class Net(nn.Module):
    """x [B, 8] -> fc1 [8 -> 16] -> relu -> fc2 [16 -> 4], no biases (tests/tracer/metering/test_meter.py's Net without its branch)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16, bias=False)
        self.fc2 = nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class SquareSum(nn.Module):
    """A loss module outside the model."""

    def forward(self, x):
        return x.square().sum()


# A training step at B = 2 (x needs no gradient; loss = out.square().sum(); SGD):
#   forward   fc1 2·2·8·16 = 512, relu 2·16 = 32, fc2 2·2·16·4 = 256, square 8, sum 8: 816
#   backward  square's grad 3·8 = 24, fc2 dW and dx 2·(2·2·16·4) = 512, relu grad 32, fc1 dW 512: 1080
#   model 816 + 1080 = 1896; optimizer add_ 8·16 + 16·4 = 192; hardware 2088
TRAIN_MODEL, TRAIN_HARDWARE = 1896, 2088


def _leftovers():
    """Global module and optimizer hooks and dispatch modes in place."""
    return (
        len(module_hooks._global_forward_pre_hooks),
        len(module_hooks._global_forward_hooks),
        len(optimizer_hooks._global_optimizer_pre_hooks),
        len(optimizer_hooks._global_optimizer_post_hooks),
        torch._C._len_torch_dispatch_stack(),
    )


def test_an_evaluation_step_under_no_grad_does_not_reuse_the_training_step_s_flops(tmp_path):
    """Steps 2 and 3 evaluate (no_grad, same batch shape, same modules): they ran a forward only, not the
    training step's forward, backward and optimizer."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    m = Meter(tmp_path / "eval", model=net, tokens=2, peak_flops=PEAK)
    found = []
    for evaluating in (False, False, True, True, False):
        x = torch.randn(2, 8)
        if evaluating:
            with torch.no_grad():
                net(x).square().sum()
        else:
            net(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
        found.append(m.step())
    m.close()
    assert [f["traced"] for f in found] == [True, True, False, True, False]
    # evaluation: model FLOPs are the modules' forward, fc1 512 + relu 32 + fc2 256 = 800; hardware adds the
    # square and sum outside any module under no_grad (phase other): 800 + 8 + 8 = 816
    assert [f["model_flops"] for f in found] == [TRAIN_MODEL, TRAIN_MODEL, None, 800, TRAIN_MODEL]
    assert [f["hardware_flops"] for f in found] == [TRAIN_HARDWARE, TRAIN_HARDWARE, None, 816, TRAIN_HARDWARE]
    assert reports.meter(tmp_path / "eval")["model_flops"].tolist() == [1896, 1896, 800, 800, 1896]


def test_a_loss_module_made_anew_every_step_is_the_same_work(tmp_path):
    """`SquareSum()(out)` builds a new module object each step (the old ones kept alive: each has its own id).
    The step's work is the same, so one trace serves every step, as with F.* or one loss module."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    m = Meter(tmp_path / "loss", model=net, tokens=2, peak_flops=PEAK, max_traces=2)
    made, found = [], []
    for _ in range(5):
        made.append(SquareSum())
        made[-1](net(torch.randn(2, 8))).backward()
        opt.step()
        opt.zero_grad()
        found.append(m.step())
    m.close()
    assert [f["traced"] for f in found] == [True, True, False, False, False]  # the first two steps traced
    assert [f["model_flops"] for f in found] == [TRAIN_MODEL] * 5  # the loss's square and sum: forward, in a module
    assert [f["hardware_flops"] for f in found] == [TRAIN_HARDWARE] * 5
    assert [f["flops_estimated"] for f in found] == [False] * 5


@pytest.mark.parametrize("given", [torch.tensor(6), np.int64(6)], ids=["tensor", "numpy"])
def test_step_tokens_given_as_a_tensor_or_numpy_int_are_an_int(tmp_path, given):
    """step(tokens=mask.sum()): a 0-d integer tensor (or a numpy int) is that many tokens."""
    torch.manual_seed(0)
    net = Net()
    m = Meter(tmp_path / "tok", model=net, tokens=2, peak_flops=PEAK)
    found = []
    for _ in range(4):
        net(torch.randn(2, 8)).sum().backward()
        net.zero_grad()
        found.append(m.step(tokens=given))
    m.close()
    assert [type(f["tokens"]) for f in found] == [int] * 4 and [f["tokens"] for f in found] == [6] * 4
    # steps 0 and 1 traced (no tokens/s: traced time), steps 2 and 3 metered
    assert all(type(f["tokens_per_s"]) is float and f["tokens_per_s"] == 6 / f["step_time_s"] for f in found[2:])
    table = reports.meter(tmp_path / "tok")  # the table in the trace stays readable
    assert table["tokens"].tolist() == [6, 6, 6, 6]
    assert table["tokens_per_s"].tolist()[2:] == [f["tokens_per_s"] for f in found[2:]]


def test_step_tokens_that_are_no_count_are_one_line(tmp_path):
    m = Meter(tmp_path / "bad", model=Net())
    try:
        expected = r"Meter.step: tokens must be an int >= 0 \(this step's tokens\) or None, got 4.5$"
        with pytest.raises(TraceError, match=expected):
            m.step(tokens=4.5)
        with pytest.raises(TraceError, match=r"got -1$"):
            m.step(tokens=-1)
        with pytest.raises(TraceError, match=r"got a tensor of shape \(2,\) and dtype torch.int64$"):
            m.step(tokens=torch.tensor([1, 2]))
        with pytest.raises(TraceError, match=r"got tensor\(\.\.\., device='meta', size=\(\), dtype=torch.int64\)$"):
            m.step(tokens=torch.tensor(3, device="meta"))  # no value to read: one line, not torch's error
        assert m.step(tokens=3)["tokens"] == 3  # a bad call ended no step
    finally:
        m.close()
    assert tracer.read_metadata(tmp_path / "bad")["meter"]["steps"]["step"] == [0]


class _CountOps(TorchDispatchMode):
    """A user's own dispatch mode: counts the ops it sees."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _counted_steps(path, batches):
    """Train Net under a _CountOps entered after the Meter (path None: no Meter): (ops it saw per step, figures, stack)."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    xs = [torch.randn(b, 8) for b in batches]
    m = Meter(path, model=net, tokens=2, peak_flops=PEAK) if path is not None else None
    seen, found = [], []
    with _CountOps() as counter:  # across the meter's step boundaries: pauses and a re-trace inside the block
        for x in xs:
            before = counter.ops
            net(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
            seen.append(counter.ops - before)
            found.append(m.step() if m is not None else None)
    stack = [type(torch._C._get_dispatch_stack_at(i)).__name__ for i in range(torch._C._len_torch_dispatch_stack())]
    if m is not None:
        m.close()
    return seen, found, stack


def test_a_user_s_dispatch_mode_entered_after_the_meter_stays_on(tmp_path):
    """The meter pauses its tracer at step boundaries, which do not nest with the user's `with` blocks: taking the
    top of the mode stack off there took the user's mode off (it stopped counting) and left the tracer's recording."""
    before = _leftovers()
    plain, _, _ = _counted_steps(None, [2, 2, 3, 3, 4])
    seen, found, stack = _counted_steps(tmp_path / "modes", [2, 2, 3, 3, 4])
    assert seen == plain and min(plain) > 0  # the user's mode saw every op of every step, as without a meter
    assert stack == ["_TraceMode"]  # the block left with a trace begun (step 4 is new): the user's mode came off
    assert [f["traced"] for f in found] == [True, True, False, True, False]
    # 948 · 2, 948 · 3 (tests/tracer/metering/test_meter.py); step 4's batch of 4 never traced: estimated at close, not here
    assert [f["model_flops"] for f in found] == [1896, 1896, None, 2844, None]
    assert reports.load(tmp_path / "modes")["step"].nunique() == 3  # the three traced steps' rows, no other
    assert _leftovers() == before
    # torch's "in a dispatch mode" flags are off again, as before (the user's mode had kept its enter-time True)
    assert [getattr(_python_dispatch, name) for name in _FLAGS] == [False] * 3


_UNKNOWN = {
    "step": None,
    "traced": False,
    "step_time_s": None,
    "tokens": None,
    "tokens_per_s": None,
    "model_flops": None,
    "hardware_flops": None,
    "flops_estimated": False,
    "mfu": None,
    "hfu": None,
}


def test_step_gives_figures_after_close_and_when_the_meter_fails(tmp_path, monkeypatch):
    """step() returned None there, so `meter.step()["mfu"]` raised TypeError into the loop."""
    net = Net()
    m = Meter(tmp_path / "after", model=net, peak_flops=PEAK)
    net(torch.ones(2, 8)).sum().backward()

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(Meter, "_end_step", broken)
    with pytest.warns(UserWarning, match="meter: could not meter a step"):
        assert m.step() == _UNKNOWN
    assert m.errors == 1
    monkeypatch.undo()
    m.close()
    m.close()  # twice: nothing more
    assert m.step() == _UNKNOWN and m.begin() is None


def test_a_step_begun_again_is_traced_from_the_last_begin(tmp_path):
    """begin() twice with no step() between (an attempt abandoned: a batch skipped after an error): the step's time
    runs from the last begin(), and so must its traced FLOPs; the abandoned forward was counted in them."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    m = Meter(tmp_path / "again", model=net, tokens=2, peak_flops=PEAK)
    found = []
    for attempts in (2, 1, 1):
        for attempt in range(attempts):
            m.begin()
            out = net(torch.randn(2, 8))
            if attempt + 1 < attempts:
                continue  # abandoned: forward 512 + 32 + 256 = 800 FLOPs that no step() ends
            out.square().sum().backward()
            opt.step()
            opt.zero_grad()
            found.append(m.step())
    m.close()
    assert [f["traced"] for f in found] == [True, True, False]
    assert [f["model_flops"] for f in found] == [TRAIN_MODEL] * 3  # 1896, not 1896 + 800
    assert [f["hardware_flops"] for f in found] == [TRAIN_HARDWARE] * 3


# Model FLOPs per step of an 8 -> 8 bias-free Linear at batch B (x needs no gradient, loss = fc(x).sum()):
#   forward 2·B·8·8 + sum B·8, backward dW 2·B·8·8  ->  B = 2: 528
def test_meter_survives_a_step_boundary_before_any_work(tmp_path):
    torch.manual_seed(0)
    net = nn.Linear(8, 8, bias=False)
    m = Meter(tmp_path / "e", model=net, peak_flops=1e9)
    figures = []
    for _ in range(4):
        figures.append(m.step())  # the loop marks the boundary at the top of each iteration
        net(torch.randn(2, 8)).sum().backward()
        net.zero_grad(set_to_none=True)  # else each step's dW adds into the last: 8·8 more FLOPs
    m.close()
    assert m.errors == 0
    assert [f["traced"] for f in figures] == [True, True, False, False]  # 0: empty; 1: the second step, traced too
    assert [f["model_flops"] for f in figures] == [0, 528, 528, 528]  # 2·2·64·2 + 2·8; got None


def test_meter_mfu_of_a_conv_net_is_reports_mfu(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    m = Meter(tmp_path / "c", model=net)
    for _ in range(3):  # steps 0 and 1 traced, step 2 metered
        net(torch.randn(1, 3, 8, 8)).sum().backward()
        net.zero_grad(set_to_none=True)  # else steps 1 on add into the gradients: 4·3·3·3 + 4 = 112 FLOPs more
        f = m.step()
    m.close()
    ref = reports.mfu(reports.load(tmp_path / "c"), step_time_s=f["step_time_s"]).iloc[0]
    # out [1, 4, 6, 6]: conv 2·144·(3·3·3) = 7,776, relu, sum and relu's backward 144 each, conv dW 7,776
    assert f["model_flops"] == ref["model_flops_per_step"] == 7776 + 3 * 144 + 7776 == 15984
    assert reports.meter(tmp_path / "c")["dtype"].iloc[2] == ref["dtype"] == "float32"  # no matmul: the conv's dtype
    assert ref["mfu"] > 0 and f["mfu"] == ref["mfu"]  # the meter gave None
