"""A trace of many small parts: merged into one part at close, reported as the same rows in one part.

`Tracer(flush_rows=1)` writes a part per op; at a clean close the tracer writes those rows again
as one part (`part-000000-000NNN.parquet`) and removes the small ones (tracer.store.writer
`merge_parts`). A process killed between the two leaves both: every reader lists parts through
`tracer.schema.part_paths`, which leaves out the parts the merged one holds. Each of the three
directories (the small parts alone, the merged part alone, both) gives the same report, to the
character, as one trace of one part.
"""

import json
import os
import shutil
import types

import pandas as pd
import pytest
import torch
from torch import nn

import reports
import tracer.store.writer as writer
from reports.errors import ReportError
from reports.output.cli import main
from tests import helpers
from tests.helpers import forked
from tracer import Tracer, read_metadata
from tracer.schema import MARKER_NAME, merged_name, part_name, superseded

ROOT = helpers.ROOT


def _train(path, run_name="many"):
    """Two SGD steps of a Linear on tiny inputs, one part per op (flush_rows=1)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(5, 4)
    with Tracer(path, model=model, tokens=5, run_name=run_name, flush_rows=1) as tr:
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            tr.step()
    return tr


def _report(capsys, path, *flags):
    capsys.readouterr()
    assert main(["report", str(path), *flags]) == 0
    return capsys.readouterr().out.replace(str(path), "<trace>")


@pytest.fixture(scope="module")
def _interrupted(tmp_path_factory):
    """The trace of `interrupted`, traced once for the module (each test gets a copy)."""
    path = tmp_path_factory.mktemp("interrupted") / "both"
    remove = os.remove
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(
            writer.os, "remove", lambda file, **at: os.path.basename(file).startswith("part-") or remove(file, **at)
        )  # parts stay
        _train(path)
    return path


@pytest.fixture
def interrupted(_interrupted, tmp_path):
    """A trace whose merges stopped after each merged part was renamed into place: the part merged
    during the run (parts 0-63), the one merged at close and every small part, as a process killed
    there leaves them; a copy of its own in the test's tmp_path. Returns (path, parts)."""
    path = shutil.copytree(_interrupted, tmp_path / "both")
    names = sorted(os.listdir(path))
    parts = len(names) - 3  # the marker and the two merged parts besides
    assert writer.SmallParts.MIN_PARTS <= parts < 2 * writer.SmallParts.FANOUT  # 1 part per op, then the closing part
    assert names == [MARKER_NAME, merged_name(0, 63), merged_name(0, parts - 1)] + [part_name(i) for i in range(parts)]
    return path, parts


def _copy(src, dst, keep):
    dst.mkdir()
    for name in os.listdir(src):
        if name == MARKER_NAME or keep(name):
            shutil.copy(src / name, dst / name)
    return dst


def test_many_small_parts_report_as_their_rows_in_one_part(tmp_path, capsys, interrupted):
    path, parts = interrupted
    merged = merged_name(0, parts - 1)
    small = _copy(path, tmp_path / "small", lambda name: name.count("-") == 1)  # the trace before any merge
    later = {part_name(i) for i in range(64, parts)}  # and killed after the merge of the first 64 during the run:
    rolled = _copy(path, tmp_path / "rolled", lambda name: name in later or name == merged_name(0, 63))
    one = _copy(path, tmp_path / "one", lambda name: name == merged)  # the trace after the merge at close
    assert len(os.listdir(small)) == parts + 1 and sorted(os.listdir(one)) == [MARKER_NAME, merged]
    assert len(os.listdir(rolled)) == 1 + 1 + parts - 64  # the marker, parts 0-63 merged, the parts after them
    text, as_json = _report(capsys, one), _report(capsys, one, "--json")
    found = json.loads(as_json)
    assert (found["run"], found["steps"], set(found["damage"].values())) == ("many", 2, {0})  # whole, not damaged
    assert "forward   215            180" in text  # per step: weight matmuls 2·5·4·3 + 2·5·3·2 = 120 + 60 = 180 of 215
    assert _report(capsys, small) == text and _report(capsys, small, "--json") == as_json
    assert _report(capsys, rolled) == text and _report(capsys, rolled, "--json") == as_json
    assert read_metadata(rolled)["parts"] == parts  # the newest part's count: 64 of them held by one file
    assert _report(capsys, path) == text  # a merge cut short: the small parts left are not read
    meta_small, meta_one = read_metadata(small), read_metadata(one)
    assert (meta_small["parts"], meta_one["parts"], meta_one["merged_parts"], meta_one["rows"]) == (
        parts,
        1,
        parts,
        parts - 1,
    )
    assert meta_one["storage_roles"] == meta_small["storage_roles"]  # each small part's roles, all in the merged one
    assert meta_one["storage_roles"]["gradient"]  # the 4 gradients of 2 Linear layers are among them
    assert read_metadata(path) == meta_one  # the leftover small parts are left out
    both = reports.load(path)
    assert len(both) == parts - 1  # one row per part, and the closing part holds none: no row twice
    pd.testing.assert_frame_equal(both.drop(columns="run"), reports.load(small).drop(columns="run"))


def test_the_tracer_merges_many_small_parts_at_close(tmp_path):
    path = tmp_path / "t"
    _train(path)
    names = sorted(os.listdir(path))
    assert len(names) == 2 and names[0] == MARKER_NAME and names[1].startswith("part-000000-")
    meta = read_metadata(path)
    assert meta["parts"] == 1 and meta["merged_parts"] >= writer.SmallParts.MIN_PARTS and meta["complete"]
    assert len(pd.read_parquet(path)) == meta["rows"] == meta["merged_parts"] - 1  # every engine reads the rows once


def test_few_or_big_parts_are_not_merged(tmp_path):
    path = tmp_path / "t"
    with Tracer(path, flush_rows=1):
        torch.ones(2) + 1  # 2 ops: 2 parts and the closing one, fewer than SmallParts.MIN_PARTS
    assert sorted(os.listdir(path)) == [MARKER_NAME, part_name(0), part_name(1), part_name(2)]
    kept = writer.SmallParts()
    kept.add(0, writer.RowBuffer(), {})
    big = writer.RowBuffer()
    big.ints.extend([0] * writer.ROW_WIDTH * writer.SmallParts.SMALL_ROWS)  # a part of 1,024 rows
    kept.add(1, big, {})
    assert not kept.open and not kept.files  # no merge after a part that is not small


def test_a_copy_of_the_merged_part_is_refused(tmp_path, interrupted):
    path, parts = interrupted
    merged = merged_name(0, parts - 1)
    shutil.copy(path / merged, path / merged.replace(".parquet", " (1).parquet"))  # a sync tool's copy
    with pytest.raises(
        ReportError, match=r"part-000000-\d+ \(1\)\.parquet says it is part 1 like part-000000-\d+\.parquet"
    ):
        reports.load(path)


def test_a_failed_merge_keeps_the_small_parts_with_a_warning(tmp_path, monkeypatch):
    real = writer.write_table

    def full_disk(table, file):  # the merged part cannot be written; the small ones could
        if ".part-000000-" in os.path.basename(file):
            raise OSError(28, "No space left on device")
        real(table, file)

    monkeypatch.setattr(writer, "write_table", full_disk)
    path = tmp_path / "t"
    with pytest.warns(
        UserWarning,
        match=r"merging its small parts failed \(OSError: \[Errno 28\] No space left on device\); "
        "nothing is lost: optrace reads the parts as they are",
    ):
        _train(path)
    names = sorted(os.listdir(path))
    assert names[0] == MARKER_NAME and names[1:] == [
        part_name(i) for i in range(len(names) - 1)
    ]  # no temporary file left
    meta = read_metadata(path)
    assert meta["complete"] and meta["parts"] == len(names) - 1 and len(reports.load(path)) == meta["rows"]


_KILLED = """
import os, sys, torch
import tracer.store.writer as writer
from tracer import Tracer
writer.SmallParts.FANOUT = int(sys.argv[2])
with Tracer(sys.argv[1], flush_rows=1, run_name="killed"):
    a = torch.zeros(1)
    for _ in range(99):
        a = a + 1
    os._exit(0)  # killed: no close, no merge at close
"""


def _killed(path, fanout):
    """A run of 100 one-row parts killed inside its `with` block, merging `fanout` files at a time."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    forked.run(_KILLED, [path, fanout], env=env, timeout=120, check=True)
    return sorted(name for name in os.listdir(path) if name != ".optrace.lock")  # the lock a killed run leaves


def test_a_killed_run_leaves_its_small_parts_merged_level_by_level(tmp_path, capsys):
    # 100 parts, 4 at a time: 64 = 4 * 4 * 4 of them in one file, then 16, 16 and the last 4
    names = _killed(tmp_path / "merged", 4)
    assert names == [MARKER_NAME, merged_name(0, 63), merged_name(64, 79), merged_name(80, 95), merged_name(96, 99)]
    assert _killed(tmp_path / "parts", 10**6) == [MARKER_NAME] + [part_name(i) for i in range(100)]  # never merged
    with pytest.warns(UserWarning, match="incomplete"):
        merged, parts = reports.load(tmp_path / "merged"), reports.load(tmp_path / "parts")
    assert len(merged) == 100  # aten.zeros and 99 aten.add, each once
    timed = ["run", "start_ns", "duration_ns", "busy_ns"]  # two runs: every column but the clock's the same
    pd.testing.assert_frame_equal(merged.drop(columns=timed), parts.drop(columns=timed))
    found = json.loads(_report(capsys, tmp_path / "merged", "--json"))
    assert found["complete"] is False and set(found["damage"].values()) == {0}  # cut short, nothing missing
    os.remove(tmp_path / "merged" / merged_name(64, 79))  # a file of 16 parts deleted
    damage = json.loads(_report(capsys, tmp_path / "merged", "--json"))["damage"]
    assert damage == {
        "record_errors": 0,
        "lost_rows": 0,
        "missing_rows": 16,
        "missing_parts": 16,
        "seq_gaps": 1,
        "damaged_marker": 0,
    }


def test_a_merged_part_supersedes_the_parts_and_narrower_merged_parts_it_holds():
    names = [
        merged_name(0, 63),
        merged_name(0, 15),
        merged_name(16, 31),
        part_name(5),
        part_name(63),
        part_name(64),
        merged_name(64, 79),
        merged_name(80, 95),
        "part-000070.parquet",
        MARKER_NAME,
    ]
    assert superseded(names) == {
        merged_name(0, 15),
        merged_name(16, 31),
        part_name(5),
        part_name(63),
        part_name(64),
        "part-000070.parquet",
    }
    assert superseded(names, within=(64, 79)) == {part_name(64), "part-000070.parquet"}  # what merging 64-79 removes
    assert superseded([part_name(0), part_name(1)]) == set()


def test_a_part_merged_away_while_the_report_reads_it_is_read_in_the_merged_part(tmp_path, interrupted, monkeypatch):
    import reports.loading.integrity as integrity

    path, parts = interrupted
    merged = merged_name(0, parts - 1)
    live = _copy(
        path, tmp_path / "live", lambda name: name.count("-") == 1
    )  # the small parts, as a live reader lists them
    real, calls = integrity.read_footer, []

    def merge_meanwhile(part):  # the tracer merges them after the listing, before the first footer is read
        if not calls:
            shutil.copy(path / merged, live / merged)
            for i in range(parts):
                os.remove(live / part_name(i))
        calls.append(os.path.basename(part))
        return real(part)

    monkeypatch.setattr(integrity, "read_footer", merge_meanwhile)
    frame = reports.load(live)
    assert calls == [part_name(0), merged]  # the first read found its part gone; the second listing, the merged part
    monkeypatch.undo()
    pd.testing.assert_frame_equal(frame.drop(columns="run"), reports.load(path).drop(columns="run"))


def test_parts_are_listed_in_write_order_past_a_million(tmp_path):
    from tracer.schema import part_paths

    names = [part_name(999_999), part_name(1_000_000), merged_name(0, 63), part_name(64), "part-000064 (1).parquet"]
    for name in names:
        (tmp_path / name).touch()
    listed = [os.path.basename(p) for p in part_paths(tmp_path)]  # by name, part-1000000 would come first
    assert listed == [
        merged_name(0, 63),
        part_name(64),
        "part-000064 (1).parquet",
        part_name(999_999),
        part_name(1_000_000),
    ]


def test_a_step_time_set_after_a_merged_close_is_not_damage(tmp_path, capsys):
    path = tmp_path / "t"
    tr = _train(path)
    tr.set_step_time(0.01)  # one more part, after the merged one: it says parts written = merged_parts + 1
    names = sorted(os.listdir(path))
    parts = read_metadata(path)["parts"]
    assert names == [MARKER_NAME, merged_name(0, parts - 2), part_name(parts - 1)]
    found = json.loads(_report(capsys, path, "--json"))
    assert set(found["damage"].values()) == {0}  # the merged part holds parts - 1 of them: none missing


def _merge_in(path, live, parts):
    """What the live trace's tracer does: the merged part renamed in, the small parts it holds removed."""
    shutil.copy(path / merged_name(0, parts - 1), live / merged_name(0, parts - 1))
    for i in range(parts):
        os.remove(live / part_name(i))


def test_the_sql_engine_reads_a_trace_again_when_its_parts_are_merged_away_meanwhile(
    tmp_path, interrupted, monkeypatch
):
    import reports.sql.engine as engine

    path, parts = interrupted
    live = _copy(path, tmp_path / "live", lambda name: name.count("-") == 1)
    real, calls = engine.source, []

    def merge_meanwhile(*args):  # after the listing and the footers, before DuckDB reads the rows
        if not calls:
            _merge_in(path, live, parts)
        calls.append(len(calls))
        return real(*args)

    monkeypatch.setattr(engine, "source", merge_meanwhile)
    with engine.Trace(live) as trace:
        assert len(calls) == 2 and trace.files == [
            [str(live / merged_name(0, parts - 1))]
        ]  # read twice: the second time, merged
        assert trace.sql("SELECT count(*) AS n FROM rows")["n"][0] == parts - 1  # every row once


def test_a_trace_cut_short_is_read_once_into_memory_by_the_sql_engine(tmp_path):
    import reports.sql.engine as engine

    _killed(tmp_path / "killed", 4)  # 100 rows in 4 files: a live trace's tracer could still merge them
    _train(tmp_path / "closed")  # closed: its files stay as they are
    with pytest.warns(UserWarning, match="incomplete"), engine.Trace(tmp_path / "killed") as killed:
        assert killed.narrow and killed.sql("SELECT count(*) AS n FROM rows")["n"][0] == 100
    with engine.Trace(tmp_path / "closed") as closed:
        assert not closed.narrow  # read from its files at each scan


def test_a_part_gone_during_a_query_is_one_line(tmp_path, capsys, monkeypatch):
    import reports.sql.engine as engine

    path = tmp_path / "t"
    _train(path)
    gone = tmp_path / "t" / "part-000007.parquet"

    def query_fails(self, query):
        raise OSError(f'IO Error: No files found that match the pattern "{gone}"')

    monkeypatch.setattr(engine.Trace, "sql", query_fails)
    monkeypatch.setattr(engine.Trace, "arrow", query_fails)  # the report's tables are read as Arrow
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f'optrace report: error: IO Error: No files found that match the pattern "{gone}" (the tracer of a live '
        "trace merged that part away while it was read: read the trace again)"
    )


def test_export_of_a_trace_whose_parts_are_merged_away_meanwhile_starts_again(
    tmp_path, interrupted, monkeypatch, capsys
):
    import reports.output.export as export

    path, parts = interrupted
    live = _copy(path, tmp_path / "live", lambda name: name.count("-") == 1)
    real_pq = export.pq
    real, opened = real_pq.ParquetFile, []

    def merge_meanwhile(part, *args, **kwargs):  # the streaming has begun with part 0 when the tracer merges
        if not opened:
            _merge_in(path, live, parts)
        opened.append(os.path.basename(part))
        return real(part, *args, **kwargs)

    # export's own pyarrow.parquet only: the trace's checks (reports.loading.validate) open parts through theirs
    monkeypatch.setattr(export, "pq", types.SimpleNamespace(**{**vars(real_pq), "ParquetFile": merge_meanwhile}))
    assert main(["export", str(live), "-o", str(tmp_path / "live.json")]) == 0
    # the first attempt's start time read part 0, then it was gone; the second attempt reads the merged part (its
    # start time, then its rows)
    assert opened == [part_name(0), merged_name(0, parts - 1), merged_name(0, parts - 1)]
    monkeypatch.undo()
    assert main(["export", str(path), "-o", str(tmp_path / "whole.json")]) == 0
    assert (tmp_path / "live.json").read_bytes() == (tmp_path / "whole.json").read_bytes()  # the same events
    live = _copy(path, tmp_path / "live_again", lambda name: name.count("-") == 1)  # again, to stdout: its first
    opened.clear()  # events are out when the part is found gone, so it is not exported twice
    monkeypatch.setattr(export, "pq", types.SimpleNamespace(**{**vars(real_pq), "ParquetFile": merge_meanwhile}))
    capsys.readouterr()
    assert main(["export", str(live), "-o", "-"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("optrace export: error: [Errno 2] Failed to open local file") and err.endswith(
        "(the tracer of a live trace merged that part away while it was read: export the trace again)"
    )
