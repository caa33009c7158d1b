"""The program's own dispatch modes beside the Tracer's: leaving the Tracer takes off its mode alone, wherever it
stands in the stack, and leaves every other mode on, in order, with torch's flags as they would be untraced."""

import pytest
import torch
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils.flop_counter import FlopCounterMode

import reports
from tracer import Tracer

MM_FLOPS = 2 * 64 * 32 * 96  # [64, 32] @ [32, 96]: 393,216


def _operands():
    return torch.randn(64, 32), torch.randn(32, 96)


class _Names(TorchDispatchMode):
    """Notes the name of every op it sees."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(params=["compiled", "python"])
def collector(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setenv("OPTRACE_COLLECTOR", "python")
    else:
        monkeypatch.delenv("OPTRACE_COLLECTOR", raising=False)
    return request.param


def _flags():
    return (
        _python_dispatch._is_in_torch_dispatch_mode,
        _python_dispatch._is_in_non_infra_torch_dispatch_mode,
        _python_dispatch._is_in_any_mode_without_ignore_compile_internals,
    )


def test_a_mode_entered_inside_the_block_and_left_after_it_keeps_counting(tmp_path, collector):
    a, b = _operands()
    before = _flags()
    tracer = Tracer(tmp_path / "t")
    tracer.__enter__()
    counter = FlopCounterMode(display=False)
    counter.__enter__()
    a @ b
    tracer.__exit__(None, None, None)
    assert [type(m).__name__ for m in _get_current_dispatch_mode_stack()] == ["_FlopCounterMode"]
    assert _flags() == (True, True, True)  # the counter's mode is on
    a @ b  # after the block: the program's counter sees it, as untraced
    counter.__exit__(None, None, None)
    assert counter.get_total_flops() == 2 * MM_FLOPS  # 2 x 393,216 = 786,432 (it counted 393,216 before)
    assert _get_current_dispatch_mode_stack() == [] and _flags() == before
    df = reports.load(tmp_path / "t")
    assert df["op"].tolist() == ["aten.mm.default"] and df["flops"].tolist() == [MM_FLOPS]


def test_modes_above_and_below_keep_their_order(tmp_path, collector):
    a, b = _operands()
    outer, inner, later = _Names(), _Names(), _Names()
    with outer:
        tracer = Tracer(tmp_path / "t")
        tracer.__enter__()
        inner.__enter__()
        later.__enter__()
        a @ b
        tracer.__exit__(None, None, None)
        assert _get_current_dispatch_mode_stack() == [outer, inner, later]
        a + 1
        later.__exit__(None, None, None)
        inner.__exit__(None, None, None)
        assert _get_current_dispatch_mode_stack() == [outer]
    assert _get_current_dispatch_mode_stack() == [] and _flags() == (False, False, False)
    assert later.seen == ["aten.mm.default", "aten.add.Tensor"]
    assert inner.seen == later.seen and outer.seen == later.seen
    assert len(reports.load(tmp_path / "t")) == 1  # the mm alone


def test_a_mode_entered_before_the_block_and_left_inside_it_is_off_after_it(tmp_path, collector):
    a, b = _operands()
    counter = FlopCounterMode(display=False)
    counter.__enter__()
    tracer = Tracer(tmp_path / "t")
    tracer.__enter__()
    a @ b
    counter.__exit__(None, None, None)  # pops the top of the stack: the tracer's mode, not its own
    with pytest.warns(UserWarning, match="the dispatch mode _FlopCounterMode was left inside the Tracer's block"):
        tracer.__exit__(None, None, None)
    assert _get_current_dispatch_mode_stack() == [] and _flags() == (False, False, False)
    a @ b  # after both: counted by neither
    assert counter.get_total_flops() == MM_FLOPS  # 393,216: the mm inside both
    assert reports.load(tmp_path / "t")["flops"].tolist() == [MM_FLOPS]


def test_fake_tensor_mode_entered_inside_the_block_stays_on_after_it(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    tracer = Tracer(tmp_path / "t")
    tracer.__enter__()
    fake = FakeTensorMode()
    fake.__enter__()
    torch.ones(3) * 2
    tracer.__exit__(None, None, None)
    assert _get_current_dispatch_mode_stack() == [fake]
    assert isinstance(torch.ones(3), FakeTensor)  # still fake after the block
    fake.__exit__(None, None, None)
    assert _get_current_dispatch_mode_stack() == [] and _flags() == (False, False, False)
    assert not isinstance(torch.ones(3), FakeTensor)


def test_fake_tensor_mode_entered_before_the_block_and_left_inside_it_leaves_no_flag_on(tmp_path, collector):
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = _flags()
    fake = FakeTensorMode()
    fake.__enter__()
    tracer = Tracer(tmp_path / "t")
    tracer.__enter__()
    torch.ones(3) * 2
    fake.__exit__(None, None, None)  # an infra mode: its exit pops its own slot, below the tracer's mode
    tracer.__exit__(None, None, None)
    assert _get_current_dispatch_mode_stack() == []
    # untraced (fake entered and left alone) the flags end as before: (False, False, False); the tracer's exit put
    # back those at its enter, inside FakeTensorMode: (True, False, False)
    assert before == (False, False, False) and _flags() == before
