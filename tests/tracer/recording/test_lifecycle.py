"""A Tracer's life after its block, a failed start, ops without tensors, and what a long run keeps."""

import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks

import reports
import tracer.recording.attribution
from tests import helpers
from tests.helpers import forked
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
    from tracer.recording import distributed

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


# ------------------------------------------------------------------ one reader, one answer
def test_read_metadata_of_a_full_disk_says_what_the_report_says(tmp_path, monkeypatch):
    from tracer.store import writer

    real, calls = writer.write_table, []

    def full(table, file):  # the first part fits, then the disk is full
        calls.append(file)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        real(table, file)

    monkeypatch.setattr(writer, "write_table", full)
    path = tmp_path / "t"
    with pytest.warns(UserWarning):
        with Tracer(path, flush_rows=4):
            a = torch.zeros(1)
            for _ in range(14):
                a = a + 1  # 15 ops: the first part's 4 rows written, 11 lost
    meta = read_metadata(path)  # the last part holding metadata is the first: it said lost_rows 0
    with pytest.warns(UserWarning, match="11 rows lost to write errors"):
        damage = reports.load(path).attrs["runs"]["t"]["damage"]
    assert meta["lost_rows"] == damage["lost_rows"] == 11 and meta["rows"] == 4 and meta["complete"] is False
    assert meta["write_error"] == "part-000001.parquet: OSError: [Errno 28] No space left on device"


def test_read_metadata_of_a_distributed_trace_holds_every_rank(tmp_path):
    path = tmp_path / "dist"
    path.mkdir()
    ids = []
    for rank in (0, 1):
        with Tracer(path / f"rank={rank}"):
            torch.ones(2) + rank  # 2 rows per rank
        ids.append(read_metadata(path / f"rank={rank}")["trace_id"])
    meta = read_metadata(path)  # was {}: the parts are one level down
    assert sorted(meta) == ["complete", "ranks", "world_size"]
    assert meta["world_size"] == 2 and meta["complete"] is True and list(meta["ranks"]) == [0, 1]
    assert [m["trace_id"] for m in meta["ranks"].values()] == ids and [m["rows"] for m in meta["ranks"].values()] == [
        2,
        2,
    ]


def test_a_run_killed_before_its_first_part_is_a_damaged_trace(tmp_path, capsys):
    import os
    import signal

    from reports.output.cli import main

    root = str(helpers.ROOT)
    path = tmp_path / "t"
    code = (
        f"import os, signal, torch\nfrom tracer import Tracer\nwith Tracer({str(path)!r}):\n"
        "    torch.ones(2) + 1\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = forked.run(code, cwd=root, env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert proc.returncode == -signal.SIGKILL and sorted(os.listdir(path)) == [".optrace.lock", "_optrace.parquet"]
    assert main(["report", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"optrace report: error: {path}: damaged optrace trace with 0 parts written (killed before the first part?)\n"
    )  # was: "not an optrace trace"
    meta = read_metadata(path)
    assert meta["format"] == "optrace" and meta["parts"] == meta["rows"] == 0 and meta["complete"] is False
    with Tracer(path):  # the stale lock is taken over, the trace replaced
        torch.ones(1)
    assert len(reports.load(path)) == 1


def test_a_trace_whose_every_write_failed_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from reports.output.cli import main
    from tracer.store import writer

    def full(table, file):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "write_table", full)
    path = tmp_path / "t"
    with pytest.warns(UserWarning):
        with Tracer(path):
            torch.ones(2) + 1  # 2 rows, never written
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"optrace report: error: {path}: damaged optrace trace with 0 parts written: 2 rows lost to write errors "
        "(first: part-000000.parquet: OSError: [Errno 28] No space left on device)\n"
    )
    meta = read_metadata(path)
    assert meta["lost_rows"] == 2 and meta["rows"] == 0 and meta["parts"] == 0 and meta["complete"] is False


# ------------------------------------------------------------------ a Tracer whose hooks could not all go on
def test_a_tracer_whose_install_is_interrupted_leaves_no_global_hook(tmp_path, monkeypatch):
    """Before: a Ctrl-C (or any error) between the hooks' registrations left the global module hooks already
    on for good (every later module call ran them) and PyTorch's `_has_any_global_hook` replaced for good."""
    module = torch.nn.modules.module
    original = module._has_any_global_hook
    before = [len(getattr(module, d)) for d in ("_global_forward_pre_hooks", "_global_forward_hooks")]

    def interrupted(hook):
        raise KeyboardInterrupt

    monkeypatch.setattr(tracer.recording.attribution.optim_hooks, "register_optimizer_step_pre_hook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with Tracer(tmp_path / "t", model=nn.Linear(2, 2)):
            pass
    assert [len(getattr(module, d)) for d in ("_global_forward_pre_hooks", "_global_forward_hooks")] == before
    assert module._has_any_global_hook is original
