"""The trace directory and the user's files: a directory replaced while the run writes, files that are not regular
files where optrace reads, and paths the writer or the readers cannot use (tracer.store.directory.Held, probe)."""

import hashlib
import os
import pathlib
import shutil

import pytest
import torch

import reports
from reports.errors import ReportError
from tests import helpers
from tests.helpers import forked
from tracer import TraceError, Tracer, read_metadata
from tracer.schema import MARKER_NAME


def _hashes(root):
    """{relative path: sha256} of every file under `root` (links followed, as a reader would)."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            full = os.path.join(directory, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, root)] = hashlib.sha256(f.read()).hexdigest()
    return found


def _adds(n):
    x = torch.ones(3)  # 1 row
    for _ in range(n):
        x = x + 1  # 1 row each


def _other_trace(tmp_path):
    other = tmp_path / "other"
    with Tracer(other, flush_rows=2):
        _adds(4)  # 1 + 4 = 5 rows
    return other, _hashes(other)


# ------------------------------------------------------------------ a directory replaced while the run writes
def _run_and_swap(path, swap):
    """A run of flush_rows=2 whose directory `swap()` replaces after its first 4 rows (parts 0 and 1 written); 3 rows
    follow: parts 2 and 3 of 2 rows each, both lost. Returns the warnings' messages."""
    with pytest.warns(UserWarning) as caught:
        with Tracer(path, flush_rows=2):
            _adds(3)  # 1 + 3 = 4 rows: parts 0 and 1
            swap()
            _adds(3)  # 4 rows: parts 2 and 3, lost
    return [str(w.message) for w in caught]


def _lost(path, messages):
    assert messages[0].startswith(
        f"optrace: could not write {path / 'part-000002.parquet'} (DirectoryReplaced: the path "
        "no longer names the trace directory entered: it names another directory now"
    )
    assert messages[0].endswith("its 2 rows are lost, the program goes on and the trace will say so")
    assert messages[-1].startswith(f"optrace: trace {str(path)!r} is incomplete: 4 rows lost to write errors")  # 2 + 2


def test_a_directory_replaced_by_a_link_to_another_trace_leaves_that_trace_byte_identical(tmp_path):
    other, before = _other_trace(tmp_path)
    path, moved = tmp_path / "t", tmp_path / "moved"

    def swap():
        os.rename(path, moved)
        os.symlink(other, path)

    messages = _run_and_swap(path, swap)
    assert _hashes(other) == before  # no part added, none replaced, its marker as it was
    assert read_metadata(other)["complete"] is True and read_metadata(other)["rows"] == 5
    _lost(path, messages)
    meta = read_metadata(moved)  # the directory entered, moved away: its marker counts what was lost
    assert (meta["rows"], meta["lost_rows"], meta["complete"]) == (4, 4, False)  # 8 rows recorded, 4 lost
    with pytest.warns(
        UserWarning, match="trace is incomplete .cut short.: 4 rows lost to write errors; reporting the 4 rows"
    ):
        assert len(reports.load(moved)) == 4


def test_a_directory_replaced_by_a_link_to_the_users_directory_leaves_it_byte_identical(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine\n")
    (users / "part-000002.parquet").write_bytes(b"not a part\n")  # named like the part the run writes next
    before = _hashes(users)
    path, moved = tmp_path / "t", tmp_path / "moved"

    def swap():
        os.rename(path, moved)
        os.symlink(users, path)

    _lost(path, _run_and_swap(path, swap))
    assert _hashes(users) == before and sorted(os.listdir(users)) == ["notes.txt", "part-000002.parquet"]


def test_a_directory_deleted_and_made_again_by_another_run_leaves_that_run_byte_identical(tmp_path):
    other, before = _other_trace(tmp_path)
    path = tmp_path / "t"

    def swap():  # the directory deleted, and another run's trace written at its path
        shutil.rmtree(path)
        shutil.copytree(other, path)

    _lost(path, _run_and_swap(path, swap))
    assert _hashes(path) == before  # the other run's trace, as it was written
    assert read_metadata(path)["complete"] is True and read_metadata(path)["rows"] == 5


def test_a_late_update_after_the_directory_was_replaced_writes_nothing(tmp_path):
    other, before = _other_trace(tmp_path)
    path = tmp_path / "t"
    with Tracer(path) as tr:
        _adds(1)
    os.rename(path, tmp_path / "moved")
    os.symlink(other, path)
    with pytest.warns(
        UserWarning,
        match=r"set_bandwidth: the trace at .* is no longer this Tracer's \(another run "
        r"replaced it\); nothing written",
    ):
        tr.set_bandwidth({"bytes_per_s": 1e9})
    assert _hashes(other) == before


# ------------------------------------------------------------------ files that are not regular files
_FIFO = """
import os, sys, time
sys.path.insert(0, {root!r})
sys.stderr = sys.stdout  # one stream, in order
import duckdb, pyarrow.parquet, reports.output.cli, reports.output.export, reports.sql.engine  # imported before the clock
from tracer import Tracer
import tracer.recording.mode
for path, what in zip(sys.argv[1::2], sys.argv[2::2]):
    print("case", path, flush=True)
    start = time.perf_counter()
    try:
        if what == "tracer":
            Tracer(path).__enter__()
        else:
            out = ["-o", os.path.join(os.path.dirname(path), "out.json")] if what == "export" else []
            reports.output.cli.main([what, path] + out)
    except Exception as exc:
        print(f"{{type(exc).__name__}}: {{exc}}")
    print(f"seconds {{time.perf_counter() - start:.3f}}", flush=True)
"""

FIFO_CASES = [  # (the FIFO's name, what reads the trace, a good trace around it or an empty directory)
    (MARKER_NAME, "tracer", False),
    ("part-000001.parquet", "tracer", True),
    ("part-000001.parquet", "report", True),
    ("part-000001.parquet", "export", True),
    (MARKER_NAME, "report", True),
    (MARKER_NAME, "export", True),
]


@pytest.fixture(scope="module")
def fifo(tmp_path_factory):
    """{case of FIFO_CASES: (the trace, the output)}: `what` on a trace (a good one when `good`) with a FIFO named
    `name` in it, each case refused in under a second. One child process runs every case (a Python importing torch
    and DuckDB takes seconds; each case's clock starts after the imports); a regression that blocks for ever fails
    by the child's timeout instead of hanging the suite."""
    argv, paths = [], {}
    for name, what, good in FIFO_CASES:
        path = tmp_path_factory.mktemp("fifo") / "t"
        if good:
            with Tracer(path):
                _adds(1)
        else:
            path.mkdir()
        if (path / name).exists():
            os.remove(path / name)
        os.mkfifo(path / name)
        argv += [str(path), what]
        paths[str(path)] = (name, what, good)
    done = forked.run(
        _FIFO.format(root=str(helpers.ROOT)), argv, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    found = {}
    for case in done.stdout.split("case ")[1:]:
        path, *lines, seconds = case.strip().splitlines()
        assert seconds.startswith("seconds ") and float(seconds.split()[1]) < 1.0, seconds  # refused, never waited on
        found[paths[path]] = (pathlib.Path(path), "\n".join(lines))
    assert len(found) == len(FIFO_CASES), done.stdout + done.stderr
    return found


def test_a_fifo_named_like_the_marker_is_refused_by_the_tracer(fifo):
    path, out = fifo[MARKER_NAME, "tracer", False]
    assert out == (
        f"TraceError: cannot write trace {str(path)!r}: it is a directory holding {MARKER_NAME!r}, which "
        "optrace did not write; choose a new path"
    )
    assert sorted(os.listdir(path)) == [MARKER_NAME]  # the FIFO stays


@pytest.mark.parametrize("what", ["report", "export"])
def test_a_fifo_named_like_a_part_is_refused_by_report_and_export(fifo, what):
    path, out = fifo["part-000001.parquet", what, True]
    assert out.splitlines()[-1] == (
        f"optrace {what}: error: {path}: part-000001.parquet is not a regular file, not an "
        "optrace part; move it out of the trace"
    )


@pytest.mark.parametrize("what", ["report", "export"])
def test_a_fifo_named_like_the_marker_is_never_read_by_report_and_export(fifo, what):
    path, out = fifo[MARKER_NAME, what, True]
    assert out.splitlines()[-1] == (
        f"optrace {what}: error: {path}: {MARKER_NAME} is not a regular file, not an optrace "
        "marker; move it out of the trace"
    )


# ------------------------------------------------------------------ paths the writer or the readers cannot use
def test_a_path_that_is_not_utf8_is_refused_at_entry(tmp_path):
    path = os.path.join(tmp_path, os.fsdecode(b"run\xff"))  # 'run\udcff'
    with pytest.raises(TraceError) as raised:
        Tracer(path).__enter__()
    assert str(raised.value) == (
        f"cannot write trace {path!r}: the path is not valid UTF-8, and the Parquet readers "
        "(pyarrow, DuckDB) open files by UTF-8 paths; choose a UTF-8 name"
    )
    assert os.listdir(tmp_path) == []  # the directory it made is removed again


def test_a_path_too_long_for_its_part_files_is_refused_at_entry(tmp_path):
    parent = str(tmp_path)
    while len(parent) < 3800:  # components of 200 characters (NAME_MAX is 255), the whole under PATH_MAX (4,096)
        parent = os.path.join(parent, "d" * 200)
    os.makedirs(parent)
    path = os.path.join(parent, "t" * (4000 - len(parent) - 1))  # 4,000 characters: the directory can be made,
    assert len(path) == 4000  # but not a part file's path inside it (4,000 + 1 + about 100 > 4,095)
    with pytest.raises(TraceError) as raised:
        Tracer(path).__enter__()
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"cannot write trace {path[:60]!r} ... (4,000 characters) ... ")
    probe = (
        48 + 32 + 1 + len(str(os.getpid())) + 1 + 8 + 4
    )  # .optrace-probe-part-999999999-999999999.parquet.<id>.<pid>.<8 hex>.tmp
    assert message.endswith(
        f": a part file there cannot be written and read back (its name is too long: {4000 + 1 + probe} "
        "characters); choose a shorter path"
    ), message
    assert os.listdir(parent) == []


def test_bytes_paths_are_traced_and_read(tmp_path):
    path = os.fsencode(tmp_path / "t")
    with Tracer(path, flush_rows=2):
        _adds(2)  # 1 + 2 = 3 rows
    assert len(reports.load(path)) == 3 and len(reports.load([path])) == 3
    assert read_metadata(tmp_path / "t")["run_name"] == "t"


def test_a_run_name_that_is_not_unicode_is_refused(tmp_path):
    name = os.fsdecode(b"caf\xe9")  # 'caf\udce9': a Latin-1 name read as a file name
    with pytest.raises(TraceError) as raised:
        Tracer(tmp_path / "t", run_name=name)
    assert str(raised.value) == r"Tracer: run_name must be valid Unicode text (encodable as UTF-8), got 'caf\udce9'"
    assert os.listdir(tmp_path) == []


def test_a_trace_carrying_a_run_name_that_is_not_unicode_reports_it_escaped(tmp_path, capsys):
    import json

    import pyarrow.parquet as pq

    from reports.output.cli import main
    from tracer.schema import METADATA_KEY, part_paths, read_part

    path = tmp_path / "t"
    with Tracer(path, run_name="cafe"):
        _adds(2)
    for part in part_paths(path):  # as an older optrace (or a hand) wrote it
        table = read_part(part)
        meta = dict(json.loads(table.schema.metadata[METADATA_KEY]), run_name=os.fsdecode(b"caf\xe9"))
        pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), part)
    for command in (["report", str(path)], ["compare", str(path), str(path)], ["plan", str(path), "--gpu", "h100"]):
        assert main(command) == 0
        out = capsys.readouterr().out
        assert out.split("\n")[0].startswith(f"optrace {command[0]}: caf\\udce9"), out  # the escape, printable


def test_a_fifo_named_like_a_part_is_refused_by_read_metadata(fifo):
    path, out = fifo["part-000001.parquet", "tracer", True]  # the Tracer refuses the path, as foreign
    assert out.endswith(
        "it is a directory holding 'part-000001.parquet', which optrace did not write; choose a new path"
    )
    root = str(helpers.ROOT)
    script = f"import sys; sys.path.insert(0, {root!r}); from tracer import read_metadata; read_metadata({str(path)!r})"
    done = forked.run(script, timeout=20)
    assert done.stderr.strip().splitlines()[-1] == (
        f"tracer.schema.NotRegular: {path / 'part-000001.parquet'} is not a "
        "regular file, not an optrace part; move it out of the trace"
    )


def test_a_distributed_run_at_a_users_directory_of_part_files_removes_none(tmp_path, monkeypatch):
    users = tmp_path / "spark"
    users.mkdir()
    (users / "part-00000-abc.parquet").write_bytes(b"Spark's rows\n")  # named like a part, not optrace's
    (users / ".part-mine.tmp").write_bytes(b"mine\n")
    before = _hashes(users)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")  # as torchrun sets them
    with pytest.raises(TraceError) as raised:
        with Tracer(users):
            _adds(1)
    assert str(raised.value) == (
        f"cannot write trace {str(users)!r}: it is a directory holding '.part-mine.tmp', which "
        "optrace did not write; choose a new path"
    )
    assert _hashes(users) == before and sorted(os.listdir(users)) == [".part-mine.tmp", "part-00000-abc.parquet"]


def test_a_trace_path_that_is_not_utf8_is_one_line_for_the_readers(tmp_path):
    path = os.path.join(tmp_path, os.fsdecode(b"run\xff"))
    shutil.copytree(_other_trace(tmp_path)[0], path)  # a good trace, moved to a name that is not UTF-8
    with pytest.raises(ReportError) as raised:
        reports.load(path)
    assert str(raised.value) == (
        f"{tmp_path}/run\\udcff: the path is not valid UTF-8, and the Parquet readers "
        "(pyarrow, DuckDB) open files by UTF-8 paths; rename it"
    )


def test_an_interrupted_marker_write_leaves_no_empty_marker(tmp_path, monkeypatch):
    """The first marker is written to a temporary renamed into place: an interrupt leaves no 0-byte
    _optrace.parquet (DuckDB refuses one) and no temporary."""
    import tracer.store.directory as directory

    def interrupted(text):
        raise KeyboardInterrupt

    monkeypatch.setattr(directory, "marker_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with Tracer(tmp_path / "t"):
            pass
    marker = tmp_path / "t" / "_optrace.parquet"
    assert not marker.exists() or os.path.getsize(marker) > 0
    assert not (tmp_path / "t" / "._optrace.parquet.tmp").exists()


def test_a_marker_temporary_left_by_a_kill_is_optraces(tmp_path):
    # a kill between writing the temporary and renaming it leaves `._optrace.parquet.tmp`: the path is
    # still optrace's to replace, and the new trace leaves no temporary behind
    path = tmp_path / "t"
    path.mkdir()
    (path / "._optrace.parquet.tmp").write_bytes(b"PAR1 cut")
    with Tracer(path):
        torch.ones(2) + 1
    assert sorted(os.listdir(path)) == ["_optrace.parquet", "part-000000.parquet"]  # the lock goes at close
    assert reports.load(path)["op"].tolist() == ["aten.ones.default", "aten.add.Tensor"]


def test_a_part_this_process_wrote_is_known_unread_and_a_users_file_in_its_place_is_refused(tmp_path, monkeypatch):
    # replacing a trace this process wrote reads no part footer (tracer.store.directory.written_here); a file put in
    # a part's place since is read and, not being optrace's, refused
    import pyarrow as pa
    import pyarrow.parquet as pq

    import tracer.store.directory as directory

    path = tmp_path / "t"
    with Tracer(path, flush_rows=2):
        _adds(2)  # 3 rows: parts 0 (2 rows) and 1 (1 row)
    read, real = [], directory._has_optrace_metadata
    monkeypatch.setattr(directory, "_has_optrace_metadata", lambda file: read.append(file) or real(file))
    with Tracer(path, flush_rows=2):
        _adds(2)
    assert read == []  # both parts were this process's, unchanged
    assert len(reports.load(path)) == 3
    pq.write_table(pa.table({"x": [1]}), path / "part-000001.parquet")  # the user's file in a part's place
    with pytest.raises(
        TraceError, match="it is a directory holding 'part-000001.parquet', which optrace did not write"
    ):
        with Tracer(path):
            pass
    assert read == [str(path / "part-000001.parquet")]  # part 0 is still the one written: only the new file read
    assert pq.read_table(path / "part-000001.parquet").to_pydict() == {"x": [1]}  # left as it was


def test_the_entry_probe_runs_once_per_directory(tmp_path, monkeypatch):
    from tracer.store import directory

    probed = []
    real = directory.probe
    monkeypatch.setattr(directory, "probe", lambda held: probed.append(held.path) or real(held))
    path, other = tmp_path / "run", tmp_path / "other"
    for _ in range(3):  # the first trace makes the directory and probes it; the next two replace the trace in it
        with Tracer(path):
            torch.ones(2).add(1)
    assert probed == [str(path)]
    with Tracer(other):  # another directory: probed
        torch.ones(2).add(1)
    assert probed == [str(path), str(other)]
    assert read_metadata(path)["rows"] == 2  # the last trace is whole: torch.ones and add = 2 rows
