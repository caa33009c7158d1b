"""The merges of small parts during the run (tracer.store.writer SmallParts, PartWriter.roll): a kill or a Ctrl-C at
any point of a merge, copies of parts, a reader racing the tracer, the storage roles of merged parts.

SmallParts.FANOUT is made 2 or 4 here so that a few one-row parts (`flush_rows=1`) make levels of merged
files: with FANOUT 2, parts 0-7 become part-000000-000001, then part-000000-000003 (a cascade: level 1
then level 2 in one roll), ..., part-000000-000007.
"""

import json
import os
import random
import re
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

import reports
import tracer.store.writer as writer
from reports.errors import ReportError
from reports.output.cli import main
from tests import helpers
from tests.helpers import forked
from tests.tracer.store.test_many_parts import _train as train
from tracer import Tracer, read_metadata
from tracer.schema import (
    MARKER_NAME,
    footer_metadata,
    merge_metadata,
    merged_name,
    merged_span,
    part_name,
    part_paths,
    superseded,
)


def _adds(path, ops, fanout, *, min_parts=None, monkeypatch, during=None):
    """`ops` one-row parts (aten.zeros, then aten.add ops-1 times), merged `fanout` files at a time.
    `during(i)`: called after op i inside the `with` block. Returns the Tracer."""
    monkeypatch.setattr(writer.SmallParts, "FANOUT", fanout)
    if min_parts is not None:
        monkeypatch.setattr(writer.SmallParts, "MIN_PARTS", min_parts)
    with Tracer(path, flush_rows=1, run_name="adds") as tr:
        a = torch.zeros(1)
        for i in range(1, ops):
            try:
                a = a + 1
            except KeyboardInterrupt:  # a Ctrl-C the program catches (to save a checkpoint, say) and goes on
                pass
            if during is not None:
                during(i)
    return tr


def _files(path):
    return sorted(name for name in os.listdir(path) if name.startswith("part-"))


def _spans(names):
    """The (first, last) part of each file a reader reads (superseded ones left out)."""
    gone = superseded(names)
    spans = []
    for name in names:
        if name in gone:
            continue
        stem = name[len("part-") : -len(".parquet")].split("-")
        spans.append((int(stem[0]), int(stem[-1])))
    return sorted(spans)


def _report_json(capsys, path, *flags):
    capsys.readouterr()
    assert main(["report", str(path), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


# a Ctrl-C inside a merge ------------------------------------------------------------------------------


def test_a_ctrl_c_between_a_merged_part_and_its_removals_leaves_no_overlapping_parts(tmp_path, monkeypatch):
    path, snapshot = tmp_path / "t", tmp_path / "snapshot"
    remove, calls = os.remove, []

    def ctrl_c_once(file, **at):  # the first removal of the first merge (parts 0, 1 into part-000000-000001)
        if os.path.basename(file).startswith("part-"):  # (the writer removes a name in its held directory: dir_fd)
            calls.append(os.path.basename(file))
            if len(calls) == 1:
                raise KeyboardInterrupt
        remove(file, **at)

    def keep(i):  # the trace as a kill after op 5 leaves it (no merge at close)
        if i == 5:
            shutil.copytree(path, snapshot)

    monkeypatch.setattr(writer.os, "remove", ctrl_c_once)
    _adds(path, 8, 2, monkeypatch=monkeypatch, during=keep)
    monkeypatch.setattr(writer.os, "remove", remove)
    # parts 0-5 after the Ctrl-C at the merge of 0-1: 0-1 merged (one small part left, superseded), 2-3, then 0-3,
    # and 4-5; a merge of 1-2 (the newest two files SmallParts still held) would overlap part-000000-000001
    spans = _spans(_files(snapshot))
    assert spans == [(0, 3), (4, 5)]
    with pytest.warns(UserWarning, match="incomplete"):
        frame = reports.load(snapshot)
    assert frame["seq"].tolist() == list(range(6))  # each of the 6 rows once
    assert len(pd.read_parquet(part_paths(snapshot))) == 6
    # the run went on and closed: its 8 ops and the closing part, in one file at close? fewer than MIN_PARTS: levels
    assert _spans(_files(path)) == [(0, 7), (8, 8)]
    assert reports.load(path)["seq"].tolist() == list(range(8))


# a kill at each point of the merges: every reader counts every row once --------------------------------


def test_a_kill_at_any_removal_of_a_merge_cascade_leaves_every_row_once(tmp_path, monkeypatch, capsys):
    path = tmp_path / "t"
    remove, snapshots = os.remove, []

    def snapshot_then_remove(file, **at):  # what a kill just before this removal leaves (the lock and temporaries too)
        if os.path.basename(file).startswith("part-"):  # (os.remove is the os module's: the lock's removal too)
            snap = tmp_path / f"kill{len(snapshots):02d}"
            shutil.copytree(path, snap)
            snapshots.append(snap)
        remove(file, **at)

    monkeypatch.setattr(writer.os, "remove", snapshot_then_remove)
    _adds(path, 8, 2, min_parts=10**6, monkeypatch=monkeypatch)  # no merge at close: the levels stay
    monkeypatch.setattr(writer.os, "remove", remove)
    # merges 0-1, 2-3, 0-3 (a cascade), 4-5, 6-7, 4-7, 0-7 (a cascade of three): 2 removals each
    assert len(snapshots) == 14
    assert _spans(_files(path)) == [(0, 7), (8, 8)]
    whole = reports.load(path)
    for snap in snapshots:
        spans = _spans(_files(snap))
        rows = spans[-1][1] + 1  # one row per part; the newest file holds the newest part
        assert [s for s in spans if s[0] != s[1]] and spans[0][0] == 0, snap
        assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:])), (snap, spans)  # disjoint, nothing lost
        with pytest.warns(UserWarning, match=r"incomplete \(cut short\); reporting"):
            frame = reports.load(snap)
        assert frame["seq"].tolist() == list(range(rows)), snap
        assert set(frame.attrs["runs"]["adds"]["damage"].values()) == {0}, snap
        assert len(pd.read_parquet(part_paths(snap))) == rows
        meta = read_metadata(snap)
        assert (meta["rows"], meta["parts"]) == (rows, rows), snap
        assert meta["storage_roles"] == whole.attrs["runs"]["adds"]["storage_roles"] or rows < 8
        pd.testing.assert_frame_equal(frame.drop(columns="run"), whole.drop(columns="run").iloc[:rows])
    cascade = snapshots[-2]  # part-000000-000007 renamed into place, its two halves not yet removed
    assert _files(cascade) == [merged_name(0, 3), merged_name(0, 7), merged_name(4, 7)]
    for engine in ("sql", "pandas"):
        found = _report_json(capsys, cascade, "--engine", engine)
        assert (found["complete"], set(found["damage"].values())) == (False, {0}), engine
    assert main(["export", str(cascade), "-o", str(tmp_path / "out.json")]) == 0
    events = json.loads((tmp_path / "out.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sorted(e["args"]["seq"] for e in events if e.get("cat") == "op") == list(range(8))  # the 8 ops once


def test_a_deleted_merged_file_counts_its_parts_and_rows_missing(tmp_path, monkeypatch, capsys):
    path = tmp_path / "t"
    _adds(path, 14, 2, min_parts=10**6, monkeypatch=monkeypatch)  # 0-7, 8-11, 12-13 and the closing part 14
    assert _spans(_files(path)) == [(0, 7), (8, 11), (12, 13), (14, 14)]
    os.remove(path / merged_name(8, 11))  # 4 one-row parts in one file, deleted
    for engine in ("sql", "pandas"):
        damage = _report_json(capsys, path, "--engine", engine)["damage"]
        assert damage == {
            "record_errors": 0,
            "lost_rows": 0,
            "missing_rows": 4,
            "missing_parts": 4,
            "seq_gaps": 1,
            "damaged_marker": 0,
        }


# copies of parts ----------------------------------------------------------------------------------------


def test_a_copy_of_the_first_part_a_merged_part_holds_is_named_not_the_merged_part(tmp_path, monkeypatch):
    path, copies = tmp_path / "t", tmp_path / "copies"
    copies.mkdir()
    remove = os.remove

    def sync_copy(file, **at):  # a sync tool copied part 0 and part-000000-000003 before the tracer merged them away
        if os.path.basename(file) in (part_name(0), merged_name(0, 3)):  # (a name in the writer's held directory)
            shutil.copy(path / file, copies / os.path.basename(file).replace(".parquet", " (1).parquet"))
        remove(file, **at)

    monkeypatch.setattr(writer.os, "remove", sync_copy)
    _adds(path, 17, 4, monkeypatch=monkeypatch)  # 0-15 (two levels), 16 and the closing part 17
    monkeypatch.setattr(writer.os, "remove", remove)
    assert _files(path) == [merged_name(0, 15), part_name(16), part_name(17)]
    for copy in ("part-000000 (1).parquet", "part-000000-000003 (1).parquet"):  # sorted before part-000000-000015
        shutil.copy(copies / copy, path / copy)
        with pytest.raises(
            ReportError, match=rf"t: {re.escape(copy)} repeats seq 0 to \d of part-000000-000015\.parquet"
        ):
            reports.load(path)
        os.remove(path / copy)
    shutil.copy(path / merged_name(0, 15), path / "part-000000-000015 (1).parquet")  # a copy of the merged part
    with pytest.raises(
        ReportError, match=r"part-000000-000015 \(1\)\.parquet says it is part 16 like part-000000-000015\.parquet"
    ):
        reports.load(path)


# a reader racing the tracer's merges ---------------------------------------------------------------------


def test_a_merge_between_the_two_listings_of_check_parts_is_read_again(tmp_path, monkeypatch):
    path, live = tmp_path / "t", tmp_path / "live"
    remove = os.remove
    monkeypatch.setattr(
        writer.os, "remove", lambda file, **at: os.path.basename(file).startswith("part-") or remove(file, **at)
    )
    _adds(path, 6, 4, monkeypatch=monkeypatch)  # parts 0-6 (6: the closing part) and part-000000-000003, all kept
    monkeypatch.setattr(writer.os, "remove", remove)
    shutil.copytree(path, live, ignore=lambda _, names: [merged_name(0, 3)])  # as a reader listed it before the merge
    real, calls = os.listdir, []

    def merge_after_listing(where):  # the tracer merges parts 0-3 right after check_parts lists the trace
        found = real(where)
        if os.fspath(where) == os.fspath(live):
            calls.append(len(found))
            if len(calls) == 3:  # load and read_run look for parts first, then check_parts lists them
                shutil.copy(path / merged_name(0, 3), live / merged_name(0, 3))
                for i in range(4):
                    os.remove(live / part_name(i))
        return found

    monkeypatch.setattr(os, "listdir", merge_after_listing)
    frame = reports.load(live)
    monkeypatch.undo()
    assert calls[:3] == [8, 8, 8] and _files(live) == [merged_name(0, 3)] + [part_name(i) for i in range(4, 7)]
    assert frame["seq"].tolist() == list(range(6))


# storage roles, metadata and mixed traces -----------------------------------------------------------------


def _train(path, fanout, monkeypatch, min_parts=10**6):
    """test_many_parts' two SGD steps with momentum, one part per op, merged `fanout` files at a time (93 parts)."""
    monkeypatch.setattr(writer.SmallParts, "FANOUT", fanout)
    monkeypatch.setattr(writer.SmallParts, "MIN_PARTS", min_parts)
    train(path, run_name="train")


def test_the_memory_report_of_a_merged_trace_is_the_unmerged_ones(tmp_path, monkeypatch):
    _train(tmp_path / "parts", 10**6, monkeypatch)  # never merged
    remove, killed = os.remove, []

    def snapshot_cascades(file, **at):  # what a kill leaves after a merged part of 16 or 64 parts is renamed into place
        span = merged_span(os.path.basename(file))
        if span and span[1] - span[0] == 3 and (span[1] + 1) % 16 == 0:  # the first removal of such a merge
            killed.append(tmp_path / f"kill{len(killed)}")
            shutil.copytree(tmp_path / "levels", killed[-1])
        remove(file, **at)

    monkeypatch.setattr(writer.os, "remove", snapshot_cascades)
    _train(tmp_path / "levels", 4, monkeypatch)  # merged 4 at a time during the run, not at close
    monkeypatch.setattr(writer.os, "remove", remove)
    _train(tmp_path / "one", 4, monkeypatch, min_parts=64)  # and all in one part at close
    parts = _files(tmp_path / "parts")
    levels = _spans(_files(tmp_path / "levels"))
    assert len(parts) == 93 and levels == [
        (0, 63),
        (64, 79),
        (80, 83),
        (84, 87),
        (88, 91),
        (92, 92),
    ]  # 64 + 16 + 3*4 + 1
    assert _files(tmp_path / "one") == [merged_name(0, 92)]
    roles = read_metadata(tmp_path / "parts")["storage_roles"]
    assert roles["gradient"] and roles["optimizer_state"]  # learned in the backward and the optimizer step
    metas = [json.loads(footer_metadata(pq.read_metadata(tmp_path / "parts" / name))) for name in parts]
    assert len(killed) == 5  # parts 0-15, 16-31, 32-47, 48-63 (then 0-63) and 64-79 merged
    for snap in killed:
        last = _spans(_files(snap))[-1][1]  # the newest part merged
        assert read_metadata(snap)["storage_roles"] == merge_metadata(metas[: last + 1])["storage_roles"], snap
    timed = ["run", "start_ns", "duration_ns", "busy_ns"]
    frames = {name: reports.load(tmp_path / name) for name in ("parts", "levels", "one")}
    for name in ("levels", "one"):
        assert read_metadata(tmp_path / name)["storage_roles"] == roles, name
        assert (
            frames[name].attrs["runs"]["train"]["storage_roles"]
            == frames["parts"].attrs["runs"]["train"]["storage_roles"]
        )
        pd.testing.assert_frame_equal(frames[name].drop(columns=timed), frames["parts"].drop(columns=timed))
        for table in (reports.by_category, reports.storages, reports.peak):
            pd.testing.assert_frame_equal(
                table(frames[name]).drop(columns="run"), table(frames["parts"]).drop(columns="run")
            )


def test_a_merged_part_says_how_many_parts_it_holds_and_the_rows_so_far(tmp_path, monkeypatch):
    path = tmp_path / "t"
    _adds(path, 21, 4, monkeypatch=monkeypatch)  # 0-15 (two levels), 16-19, 20 and the closing part 21
    assert _files(path) == [merged_name(0, 15), merged_name(16, 19), part_name(20), part_name(21)]

    def meta(name):
        return json.loads(footer_metadata(pq.read_metadata(path / name)))

    assert [(meta(n)["parts"], meta(n).get("merged_parts"), meta(n)["rows"]) for n in _files(path)] == [
        (16, 16, 16),
        (20, 4, 20),
        (21, None, 21),
        (22, None, 21),
    ]  # one row per op; the closing part holds none
    assert read_metadata(path)["parts"] == 22 and set(reports.load(path).attrs["runs"]["adds"]["damage"].values()) == {
        0
    }


def test_a_failed_part_write_stops_the_merges_and_counts_its_rows_lost(tmp_path, monkeypatch):
    path = tmp_path / "t"
    real = writer.write_table

    def full_disk_once(table, file):  # part 5 (seq 5) cannot be written; the part after it is part 5 again
        if os.path.basename(file).startswith(f".{part_name(5)}.") and not full_disk_once.failed:
            full_disk_once.failed = True
            raise OSError(28, "No space left on device")
        real(table, file)

    full_disk_once.failed = False
    monkeypatch.setattr(writer, "write_table", full_disk_once)
    with pytest.warns(UserWarning) as caught:
        _adds(path, 12, 2, monkeypatch=monkeypatch)
    assert [str(w.message).split(" (")[0] for w in caught] == [
        f"optrace: could not write {path / part_name(5)}",
        f"optrace: trace {str(path)!r} is incomplete: 1 rows lost to write errors",
    ]
    assert _spans(_files(path)) == [(0, 3), (4, 4)] + [(i, i) for i in range(5, 12)]  # nothing merged after the loss
    with pytest.warns(UserWarning, match="incomplete"):
        frame = reports.load(path)
    assert frame["seq"].tolist() == [0, 1, 2, 3, 4] + list(range(6, 12))  # seq 5 lost
    assert frame.attrs["runs"]["adds"]["damage"] == {
        "record_errors": 0,
        "lost_rows": 1,
        "missing_rows": 0,
        "missing_parts": 0,
        "seq_gaps": 1,
        "damaged_marker": 0,
    }


def test_big_parts_between_small_ones_are_never_merged_across(tmp_path, monkeypatch):
    monkeypatch.setattr(writer.SmallParts, "SMALL_ROWS", 3)  # a part of 3 rows or more is big
    monkeypatch.setattr(writer.SmallParts, "FANOUT", 2)
    path = tmp_path / "t"
    with Tracer(path, flush_rows=1, run_name="mixed") as tr:
        a = torch.zeros(1)
        for i in range(1, 12):
            if i == 5:
                tr.flush_rows = 3  # parts 5 and 6: 3 rows each (seq 5-7, 8-10)
                tr._flush_at = 3 * writer.ROW_WIDTH
            a = a + 1
    # parts 0-3 merged, 4 alone, two big parts (5, 6) never merged, then the closing part of 1 row (seq 11)
    names = _files(path)
    assert names == [merged_name(0, 3), part_name(4), part_name(5), part_name(6), part_name(7)]
    frame = reports.load(path)
    assert frame["seq"].tolist() == list(range(12)) and set(frame.attrs["runs"]["mixed"]["damage"].values()) == {0}


def test_set_step_time_after_a_merge_at_close_adds_a_part_counted_whole(tmp_path, monkeypatch, capsys):
    path = tmp_path / "t"
    monkeypatch.setattr(writer.SmallParts, "MIN_PARTS", 8)
    tr = _adds(path, 9, 4, monkeypatch=monkeypatch)  # 9 one-row parts and the closing part: one part at close
    assert _files(path) == [merged_name(0, 9)]
    tr.set_step_time(0.5)
    assert _files(path) == [merged_name(0, 9), part_name(10)]  # the late part, numbered after those merged
    meta = read_metadata(path)
    assert (meta["parts"], meta["step_time"], meta["rows"]) == (11, {"median_s": 0.5}, 9)
    for engine in ("sql", "pandas"):
        found = _report_json(capsys, path, "--engine", engine)
        assert (found["complete"], set(found["damage"].values())) == (True, {0}), engine


def test_a_forked_child_neither_writes_nor_merges(tmp_path, monkeypatch):
    path = tmp_path / "t"
    seen = {}

    def fork_at(i):
        if i != 3:
            return

        def state():  # every file and the marker's bytes
            return sorted(os.listdir(path)), (path / MARKER_NAME).read_bytes()

        before = state()  # parts 0-2 (FANOUT 4: nothing merged yet)
        pid = os.fork()
        if pid == 0:  # the child: ops, a flush, a roll and leaving the block, all inert
            try:
                b = torch.ones(1)
                for _ in range(8):
                    b = b + 1
                tr = Tracer._active
                tr._flush()
                tr._merge(tr._writer.roll)
                tr.__exit__(None, None, None)
            finally:
                os._exit(0 if state() == before else 1)
        seen["child"] = os.waitpid(pid, 0)[1]

    _adds(path, 10, 4, monkeypatch=monkeypatch, during=fork_at)
    assert seen["child"] == 0
    assert _spans(_files(path)) == [(0, 3), (4, 7), (8, 8), (9, 9), (10, 10)]
    assert reports.load(path)["seq"].tolist() == list(range(10))


def test_superseded_matches_a_plain_reading_and_reads_each_of_10000_names_at_most_twice(monkeypatch):
    import tracer.schema as schema

    rng = random.Random(0)
    for _ in range(200):  # random traces: levels of FANOUT 2-4 files, some merges cut short (narrower files left)
        fanout, names, files = rng.randint(2, 4), [], []
        for i in range(rng.randint(1, 60)):
            names.append(part_name(i))
            files.append((i, i, 0))
            while len(files) >= fanout and len({f[2] for f in files[-fanout:]}) == 1:
                group = files[-fanout:]
                del files[-fanout:]
                files.append((group[0][0], group[-1][1], group[0][2] + 1))
                names.append(merged_name(group[0][0], group[-1][1]))
                if rng.random() < 0.7:  # the held ones removed, else left as a kill leaves them
                    held = {part_name(j) for j in range(group[0][0], group[-1][1] + 1)}
                    held |= {merged_name(a, b) for a, b, _ in group if a != b}
                    names = [n for n in names if n not in held]
        names.append("part-000001 (1).parquet")  # a copy: never superseded
        spans = {
            n: (int(n[5:11]), int(n[-14:-8]) if n.count("-") == 2 else int(n[5:11])) for n in names if "(" not in n
        }
        plain = {
            n for n, (a, b) in spans.items() if any(c <= a and b <= d and (c, d) != (a, b) for c, d in spans.values())
        }
        assert superseded(names) == plain
        low, high = files[-1][0], files[-1][1]
        assert superseded(names, within=(low, high)) == {n for n in plain if low <= spans[n][0] and spans[n][1] <= high}
    many = [part_name(i) for i in range(10_000)] + [merged_name(i, i + 63) for i in range(0, 9984, 64)]
    real, read = schema.merged_span, []
    monkeypatch.setattr(schema, "merged_span", lambda name: read.append(name) or real(name))
    gone = superseded(many)
    assert len(gone) == 9984 and part_name(9984) not in gone  # the parts of 156 merged files of 64; the last 16 not
    assert (
        len(read) == 10_156 + 156
    )  # every name once for the spans, the 156 merged ones once more: no reading per span


@pytest.mark.parametrize("lists", ["objects", "arrow"])
def test_a_merge_between_the_checks_and_the_read_of_the_rows_is_read_again(tmp_path, monkeypatch, lists):
    import reports.loading.columns as columns_module  # reports.loading.load reads the rows through its read_table
    import tracer.schema as schema

    path, live = tmp_path / "t", tmp_path / "live"
    remove = os.remove
    monkeypatch.setattr(
        writer.os, "remove", lambda file, **at: os.path.basename(file).startswith("part-") or remove(file, **at)
    )
    _adds(path, 6, 4, monkeypatch=monkeypatch)  # parts 0-6 (6: the closing part) and part-000000-000003, all kept
    monkeypatch.setattr(writer.os, "remove", remove)
    shutil.copytree(path, live, ignore=lambda _, names: [merged_name(0, 3)])  # the trace before the merge
    real_paths, real_read, armed, reads = schema.part_paths, columns_module.read_table, [], []

    def merge_after_listing(where, names=None):  # the tracer merges parts 0-3 right after the rows' read lists them
        found = real_paths(where, names)
        if armed and armed.pop():
            shutil.copy(path / merged_name(0, 3), live / merged_name(0, 3))
            for i in range(4):
                os.remove(live / part_name(i))
        return found

    def read_rows(*args, **kwargs):  # the trace's checks are done: its rows are read next (merged once)
        reads.append(True)
        armed.append(len(reads) == 1)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(schema, "part_paths", merge_after_listing)
    monkeypatch.setattr(columns_module, "read_table", read_rows)
    frame = reports.load(live, lists=lists)
    monkeypatch.undo()
    assert _files(live) == [merged_name(0, 3)] + [part_name(i) for i in range(4, 7)]
    assert frame["seq"].tolist() == list(range(6)) and len(reads) == 2  # the run read again: its checks and its rows


_KILLED = """
import os, sys, torch
import tracer.store.writer as writer
from tracer import Tracer
writer.SmallParts.FANOUT = 2
remove, removals = os.remove, []

def killed_inside_the_cascade(file, **at):  # parts 0-7 merged into part-000000-000007: killed before its first removal
    if os.path.basename(file).startswith("part-"):
        removals.append(file)
        if len(removals) == 13:
            os._exit(0)
    remove(file, **at)

os.remove = killed_inside_the_cascade
with Tracer(sys.argv[1], flush_rows=1, run_name="killed"):
    a = torch.zeros(1)
    for _ in range(9):
        a = a + 1
"""


def test_a_process_killed_inside_a_cascade_of_merges_is_read_whole(tmp_path):

    path = tmp_path / "t"
    env = dict(os.environ, PYTHONPATH=str(helpers.ROOT))
    forked.run(_KILLED, [path], env=env, timeout=120, check=True)
    assert _files(path) == [merged_name(0, 3), merged_name(0, 7), merged_name(4, 7)]  # seq 0-7; op 9 never flushed
    with pytest.warns(UserWarning, match=r"incomplete \(cut short\); reporting the 8 rows"):
        assert reports.load(path)["seq"].tolist() == list(range(8))
    assert len(pd.read_parquet(part_paths(path))) == 8
    meta = read_metadata(path)  # (the CLI's engines and export: on the same files, the snapshots above)
    assert (meta["rows"], meta["parts"], meta["merged_parts"], meta["complete"]) == (8, 8, 8, False)


def test_a_ctrl_c_while_a_merged_part_is_written_leaves_the_files_it_would_hold(tmp_path, monkeypatch):
    path, snapshot = tmp_path / "t", tmp_path / "snapshot"
    real, calls = writer.write_table, []

    def ctrl_c_once(table, file):  # the first merged part (parts 0, 1): written, then Ctrl-C before its rename
        real(table, file)
        if os.path.basename(file).startswith(f".{merged_name(0, 1)}."):
            calls.append(file)
            raise KeyboardInterrupt

    monkeypatch.setattr(writer, "write_table", ctrl_c_once)
    _adds(path, 8, 2, monkeypatch=monkeypatch, during=lambda i: i == 5 and shutil.copytree(path, snapshot))
    assert len(calls) == 1 and not [n for n in os.listdir(snapshot) if n.endswith(".tmp")]  # no temporary left
    # part 0 stays alone; parts 1-2, 3-4 merge, then 1-4: the levels start one part later, nothing overlaps
    assert _spans(_files(snapshot)) == [(0, 0), (1, 4), (5, 5)]
    with pytest.warns(UserWarning, match="incomplete"):
        assert reports.load(snapshot)["seq"].tolist() == list(range(6))
    assert reports.load(path)["seq"].tolist() == list(range(8))


def test_parts_written_at_each_pause_merge_and_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(writer.SmallParts, "FANOUT", 2)
    path = tmp_path / "t"
    with Tracer(path, run_name="paused") as tr:  # tracer.metering.meter pauses the tracer between the steps it traces
        a = torch.zeros(1)
        for _ in range(4):
            a = a + 1  # traced: one row
            tr._pause()  # a part of the rows so far; merges run
            a = a * 2  # not traced
            tr._resume()
    # parts 0-3 (one per pause) merged as 0-1, 2-3, then 0-3; the closing part 4 holds none
    assert _files(path) == [merged_name(0, 3), part_name(4)]
    frame = reports.load(path)
    assert frame["op"].astype(str).tolist() == ["aten.zeros.default"] + ["aten.add.Tensor"] * 4 and frame[
        "seq"
    ].tolist() == list(range(5))
    assert a.item() == 30.0  # ((((0+1)*2+1)*2+1)*2+1)*2: the program's result is its own
