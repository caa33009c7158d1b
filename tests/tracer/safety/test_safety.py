"""The bad-input matrix, part 1: the user's files and the traced program.

Each case checks three things: the program's result is what it is untraced, what is on
disk afterwards, and the exact one-line error or warning. Part 2 (reports, damaged
traces, the CLI) is tests/reports/loading/test_safety_reports.py.
"""

import errno
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import reports
import tracer
from tests import helpers
from tests.helpers import DEFAULT_SIGINT, forked
from tracer import TraceError, Tracer, read_metadata
from tracer.schema import LEGACY_MARKER_NAME, MARKER_NAME, marker_facts

ROOT = str(helpers.ROOT)


def listing(path):
    return sorted(os.listdir(path))


def refused(path, message):
    """Tracer(path) raises `message` before its block runs; returns whether the block ran."""
    ran = []
    with pytest.raises(TraceError) as raised:
        with Tracer(path):
            ran.append(1)
    assert re.fullmatch(message, str(raised.value)), str(raised.value)
    assert "\n" not in str(raised.value) and not ran
    return raised.value


# ------------------------------------------------------------------ 1. the user's data is never deleted
def test_a_pyarrow_dataset_directory_is_refused_and_kept(tmp_path):
    path = tmp_path / "data"
    ds.write_dataset(pa.table({"a": [1, 2, 3]}), path, format="parquet")  # writes part-0.parquet
    before = listing(path)
    assert before == ["part-0.parquet"]
    refused(
        path,
        rf"cannot write trace '{re.escape(str(path))}': it is a directory holding 'part-0.parquet', "
        r"which optrace did not write; choose a new path",
    )
    assert listing(path) == before and pq.read_table(path / "part-0.parquet")["a"].to_pylist() == [1, 2, 3]


def test_a_spark_directory_is_refused_and_kept(tmp_path):
    path = tmp_path / "spark"
    path.mkdir()
    name = "part-00000-1b2c3d4e-c000.snappy.parquet"
    pq.write_table(pa.table({"a": [1]}), path / name)
    (path / "_SUCCESS").write_text("")
    refused(
        path,
        r"cannot write trace '.*spark': it is a directory holding '_SUCCESS', which optrace did not write; choose a new path",
    )
    assert listing(path) == ["_SUCCESS", name]


def test_optrace_parts_copied_without_marker_but_foreign_file_is_refused(tmp_path):
    path = tmp_path / "t"
    with Tracer(path):
        torch.ones(2) + 1
    pq.write_table(pa.table({"a": [1]}), path / "part-000009.parquet")  # not optrace's, named like a part
    refused(
        path,
        r"cannot write trace '.*t': it is a directory holding 'part-000009.parquet', which optrace did not write; choose a new path",
    )
    assert "part-000009.parquet" in listing(path)


def test_an_earlier_optrace_trace_is_replaced(tmp_path):
    path = tmp_path / "t"
    with Tracer(path, flush_rows=1):
        torch.ones(2) + 1  # 2 ops: 2 parts
    first = marker_facts(path)["trace_id"]
    with Tracer(path):
        torch.zeros(3)
    assert listing(path) == [MARKER_NAME, "part-000000.parquet"]
    meta = read_metadata(path)
    assert meta["trace_id"] != first and meta["rows"] == 1


def test_a_trace_without_marker_from_an_older_optrace_is_replaced(tmp_path):
    path = tmp_path / "old"
    with Tracer(path):
        torch.ones(2)
    (path / MARKER_NAME).unlink()  # as optrace wrote traces before markers
    with Tracer(path):
        torch.zeros(2) + 1
    assert len(pd.read_parquet(path)) == 2


def test_a_trace_with_the_json_marker_of_an_older_optrace_is_read_and_replaced(tmp_path):
    path = tmp_path / "old"
    with Tracer(path, flush_rows=1):
        torch.ones(2) + 1  # 2 ops: 2 parts
    facts = dict(marker_facts(path), rows=3, lost_rows=1)  # as if a third part had been lost to a full disk
    (path / MARKER_NAME).unlink()
    (path / LEGACY_MARKER_NAME).write_text(json.dumps(facts) + " " * 4000)  # the marker optrace wrote before
    meta = read_metadata(path)
    assert (meta["rows"], meta["lost_rows"], meta["complete"]) == (2, 1, True)  # 3 recorded - 1 lost = 2 written
    with pytest.warns(UserWarning, match="1 rows lost to write errors; reporting the 2 rows it has"):
        reports.load(path)  # the legacy marker's facts reach the report
    with Tracer(path):
        torch.zeros(3)
    assert listing(path) == [MARKER_NAME, "part-000000.parquet"]  # the legacy marker replaced with the trace


def test_a_directory_of_rank_traces_is_an_optrace_trace(tmp_path):
    path = tmp_path / "dist"
    path.mkdir()
    for rank in (0, 1):
        with Tracer(path / f"rank={rank}"):
            torch.ones(2)
    assert tracer.store.directory.foreign_entry(path) is None
    with Tracer(path):
        torch.ones(1)
    assert listing(path) == [MARKER_NAME, "part-000000.parquet"]
    with Tracer(path / "rank=0"):  # a rank directory beside a trace's own parts is optrace's too
        torch.ones(1)
    assert tracer.store.directory.foreign_entry(path) is None
    with Tracer(path):
        torch.ones(1)
    assert listing(path) == [MARKER_NAME, "part-000000.parquet"]
    (path / "rank=0").mkdir()
    (path / "rank=0" / "notes.txt").write_text("mine")
    (path / "part-000000.parquet").unlink()
    (path / MARKER_NAME).unlink()
    assert tracer.store.directory.foreign_entry(path) == os.path.join("rank=0", "notes.txt")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"path": 123}, "Tracer: path must be a str, bytes or os.PathLike, got int"),
        (
            {"path": ""},
            "Tracer: path is '', expected the directory to write the trace in, e.g. 'runs/step'",
        ),  # into cwd
        ({"model": "gpt"}, "Tracer: model must be a torch.nn.Module or None, got str"),
        ({"tokens": -4}, r"Tracer: tokens must be an int from 1 to 2\*\*53 \(tokens per step\) or None, got -4"),
        ({"run_name": ["a"]}, "Tracer: run_name must be a str or None, got list"),
        ({"flush_rows": 2.5}, "Tracer: flush_rows must be a positive int, got 2.5"),
    ],
)
def test_bad_argument_types_touch_nothing(tmp_path, kwargs, message):
    kwargs = {"path": tmp_path / "t", **kwargs}
    with pytest.raises(TraceError) as raised:
        Tracer(kwargs.pop("path"), **kwargs)
    assert re.fullmatch(message, str(raised.value)), str(raised.value)
    assert listing(tmp_path) == []


def test_an_unwritable_parent_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root may write anywhere: pretend it may not
    refused(tmp_path / "t", rf"cannot write trace '.*t': directory '{re.escape(str(tmp_path))}' is not writable")
    assert listing(tmp_path) == []


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, None),  # a new path: fine
        (lambda p: p.mkdir(), None),  # an empty directory: fine, nothing to delete
        (
            lambda p: p.write_text("x"),
            r"cannot write trace '.*': a file of that name exists; a trace is a directory of parts",
        ),
        (
            lambda p: p.symlink_to(p.parent / "nowhere"),
            r"cannot write trace '.*': a file of that name exists; a trace is a directory of parts",
        ),
    ],
    ids=["new", "empty_dir", "regular_file", "dangling_symlink"],
)
def test_paths(tmp_path, make, message):
    path = tmp_path / "t"
    make(path)
    if message is None:
        with Tracer(path):
            out = torch.ones(2) + 1
        assert out.tolist() == [2.0, 2.0] and len(pd.read_parquet(path)) == 2
    else:
        refused(path, message)
        assert os.path.lexists(path) and not os.path.isdir(path)


def test_a_symlink_to_a_trace_directory_writes_through_it(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with Tracer(tmp_path / "link"):
        torch.ones(2)
    assert os.path.islink(tmp_path / "link") and listing(real) == [MARKER_NAME, "part-000000.parquet"]


def test_missing_parents_are_made_and_an_unwritable_parent_refused(tmp_path):
    with Tracer(tmp_path / "a" / "b" / "t"):  # a user asked for this path: its parents are made
        torch.ones(2)
    assert listing(tmp_path / "a" / "b" / "t") == [MARKER_NAME, "part-000000.parquet"]
    refused(
        "/proc/t", r"cannot write trace '/proc/t': No such file or directory"
    )  # /proc takes no new entries, even from root
    refused(
        "/proc/x/y/t",
        r"cannot write trace '/proc/x/y/t': cannot create directory '/proc/x' \(No such file or directory\)",
    )


def test_parents_made_for_a_trace_that_cannot_start_are_removed(tmp_path):
    (tmp_path / "file").write_text("a file, not a directory")
    refused(tmp_path / "new" / "deeper" / ("t" * 300), r"cannot write trace '.*': File name too long")
    assert sorted(os.listdir(tmp_path)) == ["file"]  # new/ and new/deeper/ made on the way were removed


# ------------------------------------------------------------------ 5. one writer per path
def test_a_second_writer_is_refused_before_its_model_runs(tmp_path):
    path = tmp_path / "t"
    code = textwrap.dedent(f"""
        import sys, time, torch
        from tracer import Tracer
        with Tracer({str(path)!r}):
            torch.ones(1)
            print("in", flush=True)
            sys.stdin.readline()
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert child.stdout.readline().strip() == "in"
        refused(
            path,
            r"cannot write trace '.*t': another process is writing it \(it holds the lock \.optrace\.lock\); "
            r"choose another path or wait for it to finish",
        )
    finally:
        child.communicate("\n", timeout=60)
    assert child.returncode == 0 and read_metadata(path)["complete"] is True  # the first writer's trace is whole
    assert ".optrace.lock" not in listing(path)


def test_two_threads_entering_tracers_at_once_one_is_refused(tmp_path):
    import threading

    for attempt in range(5):  # the same outcome every time: one traces, the other is refused
        start, attempted = threading.Barrier(2), threading.Barrier(2, timeout=60)
        outcome = {}

        def enter(i):
            tr = Tracer(tmp_path / f"{attempt}-{i}")
            start.wait()  # both threads enter at once
            try:
                tr.__enter__()
            except TraceError as exc:
                outcome[i] = str(exc)
                attempted.wait()
                return
            attempted.wait()  # the other thread tried while this one was active
            out = torch.ones(2) + 1
            tr.__exit__(None, None, None)
            outcome[i] = out.tolist()

        threads = [threading.Thread(target=enter, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [i for i in (0, 1) if outcome[i] == [2.0, 2.0]]
        assert len(won) == 1, outcome
        winner, loser = won[0], 1 - won[0]
        assert outcome[loser] == (
            f"another Tracer is already active (writing '{tmp_path}/{attempt}-{winner}'); "
            f"close it before starting one for '{tmp_path}/{attempt}-{loser}'"
        )
        assert not (tmp_path / f"{attempt}-{loser}").exists()  # refused before anything was written
        assert len(pd.read_parquet(tmp_path / f"{attempt}-{winner}")) == 2
    with Tracer(tmp_path / "after"):  # nothing left claimed
        torch.ones(1)


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    path = tmp_path / "t"
    with Tracer(path):
        torch.ones(1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (path / ".optrace.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    with Tracer(path):
        torch.zeros(1)
    assert listing(path) == [MARKER_NAME, "part-000000.parquet"]


def test_temporary_names_are_unique_per_trace_and_process(tmp_path):
    trace_id = "0123456789abcdef" * 2
    names = {
        os.path.basename(tracer.store.directory.temporary_name(str(tmp_path), "part-000000.parquet", trace_id))
        for _ in range(3)
    }
    assert len(names) == 3 and all(n.startswith(f".part-000000.parquet.{trace_id}.{os.getpid()}.") for n in names)


def test_re_tracing_removes_only_its_own_temporary_parts(tmp_path):
    path = tmp_path / "t"
    with Tracer(path):
        torch.ones(2)
    trace_id = marker_facts(path)["trace_id"]
    left = os.path.basename(tracer.store.directory.temporary_name(str(path), "part-000001.parquet", trace_id))
    (path / left).write_bytes(b"half a part")  # what a run killed mid-write leaves
    with Tracer(path):  # optrace's own temporary file: removed with the old trace
        torch.ones(2)
    assert listing(path) == [MARKER_NAME, "part-000000.parquet"]
    for name in (".part-notes.tmp", f".part-000001.parquet.{'f' * 32}.{os.getpid()}.{'0' * 8}.tmp"):
        (path / name).write_text("the user's")  # named like a temporary part; not this trace's
        refused(
            path,
            rf"cannot write trace '.*t': it is a directory holding '{re.escape(name)}', which optrace did not "
            r"write; choose a new path",
        )
        assert (path / name).read_text() == "the user's" and len(pd.read_parquet(path)) == 1
        (path / name).unlink()


# ------------------------------------------------------------------ 4. a full disk
def test_a_full_disk_never_stops_the_program(tmp_path, monkeypatch):
    from tracer.store import writer

    real = writer.write_table
    calls = []

    def full(table, file):
        calls.append(file)
        if len(calls) > 1:  # the first part fits, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        real(table, file)

    monkeypatch.setattr(writer, "write_table", full)
    path = tmp_path / "t"
    after = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Tracer(path, flush_rows=4):
            a = torch.zeros(1)
            for _ in range(14):
                a = a + 1  # 15 ops: parts of 4 rows; the first is written, 11 rows are lost
        after.append("checkpoint saved")
    assert a.item() == 14.0 and after == ["checkpoint saved"]
    messages = [str(w.message) for w in caught]
    assert messages == [
        f"optrace: could not write {path}/part-000001.parquet (OSError: [Errno 28] No space left on device; "
        "the disk is full); its 4 rows are lost, the program goes on and the trace will say so",
        f"optrace: trace '{path}' is incomplete: 11 rows lost to write errors "
        "(first: part-000001.parquet: OSError: [Errno 28] No space left on device)",
    ]
    assert listing(path) == [MARKER_NAME, "part-000000.parquet"]  # no temporary file left behind
    facts = marker_facts(path)
    assert facts["lost_rows"] == 11 and facts["rows"] == 15 and facts["complete"] is False  # 15 - 4 = 11

    import reports

    with pytest.warns(UserWarning, match=r"trace is incomplete \(cut short\): 11 rows lost to write errors"):
        df = reports.load(path)
    assert len(df) == 4 and df.attrs["runs"]["t"]["damage"]["lost_rows"] == 11


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 64 KiB tmpfs (needs root and mount rights; skipped where the mount fails)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_really_full_disk(tiny_disk):
    path = tiny_disk / "t"
    after = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Tracer(path, flush_rows=100):
            a = torch.zeros(1)
            for _ in range(1499):
                a = a + 1  # 1,500 ops in parts of 100 rows: a few fit in 64 KiB, then the disk is full
        after.append("checkpoint saved")
    assert a.item() == 1499.0 and after == ["checkpoint saved"]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and "[Errno 28] No space left on device; the disk is full)" in messages[0]
    kept = len(pd.read_parquet(path))
    lost = 1500 - kept
    assert kept % 100 == 0 and 0 < kept < 1500
    assert messages[1].startswith(
        f"optrace: trace '{path}' is incomplete: {lost} rows lost to write errors (first: part-"
    )
    facts = marker_facts(path)  # rewritten in place: no new space needed
    assert facts["rows"] == 1500 and facts["lost_rows"] == lost and facts["complete"] is False
    assert not [n for n in listing(path) if n.endswith(".tmp")]

    import reports

    with pytest.warns(
        UserWarning,
        match=rf"trace is incomplete \(cut short\): {lost} rows lost to write errors; reporting the {kept} rows",
    ):
        df = reports.load(path)
    assert len(df) == kept


def test_keyboard_interrupt_during_a_flush_keeps_the_rows(tmp_path, monkeypatch):
    from tracer.store import writer

    real = writer.write_table
    calls = []

    def interrupted(table, file):
        calls.append(file)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(table, file)

    monkeypatch.setattr(writer, "write_table", interrupted)
    path = tmp_path / "t"
    with pytest.raises(KeyboardInterrupt):
        with Tracer(path, flush_rows=3):
            a = torch.zeros(1)
            for _ in range(5):
                a = a + 1  # the third op's flush is interrupted
    df = pd.read_parquet(path)
    assert df["seq"].tolist() == [0, 1, 2]  # the interrupted part's 3 rows, written at close
    meta = read_metadata(path)
    assert meta["complete"] is False and meta["lost_rows"] == 0 and meta["error"] == "KeyboardInterrupt: "


def test_exit_never_raises_when_closing_fails(tmp_path, monkeypatch):
    from tracer.store import writer

    monkeypatch.setattr(writer, "write_facts", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.warns(UserWarning, match=r"optrace: could not finish trace '.*' \(OSError: \[Errno 5\] I/O error\)"):
        with Tracer(tmp_path / "t"):
            out = torch.ones(2) * 3
    assert out.tolist() == [3.0, 3.0] and len(pd.read_parquet(tmp_path / "t")) == 2


# ------------------------------------------------------------------ the program's own failures
def test_an_exception_in_forward_reaches_the_user(tmp_path):
    model = nn.Linear(4, 2)
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(1x3 and 4x2\)"):
        with Tracer(tmp_path / "t", model=model):
            model(torch.ones(1, 3))
    meta = read_metadata(tmp_path / "t")
    assert meta["complete"] is False and meta["error"].startswith("RuntimeError: mat1 and mat2")


class _Unprintable(Exception):
    """An exception whose message cannot be formatted."""

    def __str__(self):
        raise AttributeError("no message here")


@pytest.mark.parametrize("collector", ["compiled", "python"])
def test_an_exception_whose_str_raises_reaches_the_user_unchanged(tmp_path, monkeypatch, collector):
    if collector == "python":
        monkeypatch.setenv("OPTRACE_COLLECTOR", "python")
    thrown = _Unprintable()
    with pytest.raises(_Unprintable) as caught:
        with Tracer(tmp_path / "t"):
            torch.ones(2) * 3
            raise thrown
    assert caught.value is thrown  # the program's own object (before: AttributeError from optrace)
    meta = read_metadata(tmp_path / "t")
    assert meta["complete"] is False
    assert meta["error"] == "_Unprintable (message not printable: its __str__ raised AttributeError)"
    assert len(pd.read_parquet(tmp_path / "t")) == 2  # ones, mul (before: 0 parts, the lock left)
    with Tracer(tmp_path / "t"):  # no lock left behind
        torch.ones(1)


_LIBRARY = []


@pytest.mark.parametrize("collector", ["compiled", "python"])
def test_a_formula_raising_an_unprintable_exception_never_reaches_the_op(tmp_path, monkeypatch, collector):
    if collector == "python":
        monkeypatch.setenv("OPTRACE_COLLECTOR", "python")
    if not _LIBRARY:  # one op for both collectors, its formula raising the unprintable exception
        _LIBRARY.append(torch.library.Library("optrace_unprintable_test", "DEF"))
        _LIBRARY[0].define("twice(Tensor x) -> Tensor")
        _LIBRARY[0].impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")

        @tracer.register_flop_formula(torch.ops.optrace_unprintable_test.twice, kind="elementwise")
        def hostile(x_shape, out_shape=None, **kwargs):
            raise _Unprintable()

    with pytest.warns(
        UserWarning,
        match=r"could not record optrace_unprintable_test.twice.default \(_Unprintable "
        r"\(message not printable: its __str__ raised AttributeError\)\); the op ran",
    ):
        with Tracer(tmp_path / "t"):
            out = torch.ops.optrace_unprintable_test.twice(torch.ones(2)) + 1
    assert out.tolist() == [3.0, 3.0]  # (1 * 2) + 1; before: AttributeError from the op
    meta = read_metadata(tmp_path / "t")
    assert meta["complete"] is True and meta["record_errors"] == 1
    assert pd.read_parquet(tmp_path / "t")["op"].tolist() == ["aten.ones.default", "aten.add.Tensor"]


def test_describe_never_raises():
    from tracer.safety import describe_exception

    class NoName(type):
        @property
        def __name__(cls):
            raise RuntimeError("no name either")

    class Hostile(_Unprintable, metaclass=NoName):
        pass

    assert describe_exception(ValueError("bad")) == "ValueError: bad"
    assert (
        describe_exception(_Unprintable()) == "_Unprintable (message not printable: its __str__ raised AttributeError)"
    )
    assert describe_exception(Hostile()) == "exception (message not printable: its __str__ raised AttributeError)"


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_a_signal_in_a_subprocess_keeps_flushed_rows(tmp_path, sig):
    path = tmp_path / "t"
    code = DEFAULT_SIGINT + textwrap.dedent(f"""
        import os, signal, torch
        from tracer import Tracer
        with Tracer({str(path)!r}, flush_rows=2):
            a = torch.zeros(1)
            for _ in range(4):
                a = a + 1  # 5 ops: parts of 2 rows written as they fill
            os.kill(os.getpid(), signal.{sig})
    """)
    proc = forked.run(code, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode != 0
    df = pd.read_parquet(path)
    if sig == "SIGINT":  # KeyboardInterrupt: __exit__ writes the last row too
        assert df["seq"].tolist() == [0, 1, 2, 3, 4] and read_metadata(path)["error"] == "KeyboardInterrupt: "
    else:  # killed: the two flushed parts survive, the lock is stale
        assert df["seq"].tolist() == [0, 1, 2, 3] and read_metadata(path)["complete"] is False
        with Tracer(path):  # the next run takes the stale lock over
            torch.ones(1)


# ------------------------------------------------------------------ 11. smaller defects
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e-300, 0, -1.0, True, "1"])
def test_step_time_must_be_finite_and_at_least_a_nanosecond(tmp_path, value):
    with Tracer(tmp_path / "t") as tr:
        pass
    with pytest.raises(TraceError) as raised:
        tr.set_step_time(value)
    assert str(raised.value) == (
        f"set_step_time: expected finite seconds >= 1e-09 (one ns) or the dict time_step returns, got {value!r}"
    )
    assert "step_time" not in read_metadata(tmp_path / "t")


def test_re_entering_the_same_tracer(tmp_path):
    tr = Tracer(tmp_path / "t")
    with tr:
        with pytest.raises(TraceError) as raised:
            with tr:
                pass
        out = torch.ones(1) + 1
    assert str(raised.value) == (
        f"this Tracer (writing '{tmp_path / 't'}') is already active; it cannot be entered again inside its own with block"
    )
    assert out.item() == 2.0 and read_metadata(tmp_path / "t")["complete"] is True


def test_a_wrapper_subclass_counts_its_inner_storage_once(tmp_path):
    from torch.utils._pytree import tree_map

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

        def __init__(self, inner):
            self.inner = inner

        def __tensor_flatten__(self):
            return ["inner"], None

        @staticmethod
        def __tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride):
            return Wrapper(inner_tensors["inner"])

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrapped = tree_map(lambda x: x.inner if isinstance(x, Wrapper) else x, args)
            out = func(*unwrapped, **(kwargs or {}))
            return tree_map(lambda x: Wrapper(x) if isinstance(x, torch.Tensor) else x, out)

    with Tracer(tmp_path / "t"):
        w = Wrapper(torch.ones(4, 4))  # 4 * 4 * 4 = 64 bytes, in the inner tensor only
        out = w.sum()
    assert out.inner.item() == 16.0
    df = pd.read_parquet(tmp_path / "t")
    assert df["op"].tolist() == ["aten.ones.default", "aten.sum.default"]
    # the inner 64 bytes, then the sum's inner 4-byte scalar; each wrapper's own storage counts 0
    # (counting them gave 64 + 64 + 4 + 4 = 136)
    assert df["live_bytes"].tolist() == [64, 68] and df["bytes_allocated"].tolist() == [64, 4]
