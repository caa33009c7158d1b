"""A Tracer's life after its block, a failed start, ops without tensors, and what a long run keeps."""

import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks

import reports
from tracer import Tracer, read_metadata


def _hook_counts():
    return len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks)


def test_a_late_set_step_time_never_writes_into_a_newer_trace_at_the_same_path(tmp_path):
    path = tmp_path / "t"
    with Tracer(path) as first:
        torch.ones(2) + 1
    with Tracer(path, flush_rows=4):  # another run replaces the trace
        for _ in range(3):
            torch.ones(4) * 2  # 3 x (ones, mul) = 6 rows: parts of 4 and 2
    before = sorted(p.name for p in path.iterdir())
    with pytest.warns(UserWarning, match="no longer this Tracer's"):
        first.set_step_time(0.01)
    with pytest.warns(UserWarning, match="no longer this Tracer's"):
        first.set_bandwidth({"bytes_per_s": 1e10})
    assert sorted(p.name for p in path.iterdir()) == before
    df = reports.load(path)
    assert len(df) == 6 and "step_time" not in read_metadata(path)


def test_a_late_update_of_its_own_trace_still_works_and_a_vanished_one_only_warns(tmp_path):
    path = tmp_path / "t"
    with Tracer(path) as tr:
        torch.ones(2) + 1
    tr.set_step_time(0.25)
    assert read_metadata(path)["step_time"]["median_s"] == 0.25
    for child in path.iterdir():
        child.unlink()
    path.rmdir()
    with pytest.warns(UserWarning, match="no longer this Tracer's"):
        tr.set_bandwidth({"bytes_per_s": 1e10})  # did raise FileNotFoundError into the program
    assert not path.exists()


def test_an_op_without_tensors_is_a_row_not_a_record_error(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not record" warning
        with Tracer(tmp_path / "t"):
            torch.ops.aten._assert_scalar(True, "never raised")
    df = reports.load(tmp_path / "t")
    assert list(df["op"]) == ["aten._assert_scalar.default"] and list(df["device"]) == [""]
    assert read_metadata(tmp_path / "t")["record_errors"] == 0


def test_a_failed_start_leaves_no_hooks_and_no_active_tracer(tmp_path, monkeypatch):
    from tracer import distributed

    before = _hook_counts()

    def broken(self):
        raise RuntimeError("install failed")

    monkeypatch.setattr(distributed.UnshardedParameters, "install", broken)
    with pytest.raises(RuntimeError, match="install failed"):
        with Tracer(tmp_path / "t", model=nn.Linear(2, 2)):
            pass
    monkeypatch.undo()
    assert _hook_counts() == before and Tracer._active is None
    with Tracer(tmp_path / "t"):  # the path and the process are usable again
        torch.ones(1) + 1
    assert _hook_counts() == before


def test_a_long_run_keeps_only_live_roles_and_recent_engine_runs(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))  # 4 parameter tensors
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 4)
    with Tracer(tmp_path / "t", model=model, flush_rows=64) as tr:
        for _ in range(60):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)  # new gradient storages every step
        seen = len(tr._roles._seen)
        for _ in range(100):  # backward without any optimizer step: 100 engine runs, no step boundary
            model(x).sum().backward()
        tasks = len(tr._attr._task_grads)
    assert seen <= 8  # the live gradients and a part's worth of freed ones; was 4 per step (240 here)
    assert tasks <= 64
    assert reports.load(tmp_path / "t")["step"].nunique() == 61
