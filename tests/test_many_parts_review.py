"""Review of the merges during the run (tracer/writer.py SmallParts, PartWriter.roll): a kill or a Ctrl-C at
any point of a merge, copies of parts, a reader racing the tracer, the storage roles of merged parts.

SmallParts.FANOUT is made 2 or 4 here so that a few one-row parts (`flush_rows=1`) make levels of merged
files: with FANOUT 2, parts 0-7 become part-000000-000001, then part-000000-000003 (a cascade: level 1
then level 2 in one roll), ..., part-000000-000007.
"""

import bisect
import json
import os
import random
import shutil
import time

import pandas as pd
import pytest
import torch
from torch import nn

import reports
import reports.loading.integrity as integrity
import tracer.writer as writer
from reports.errors import ReportError
from reports.output.cli import main
from tracer import Tracer, read_metadata
from tracer.schema import MARKER_NAME, merged_name, part_name, part_paths, superseded


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
        stem = name[len("part-"):-len(".parquet")].split("-")
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

    def ctrl_c_once(file):  # the first removal of the first merge (parts 0, 1 into part-000000-000001)
        calls.append(os.path.basename(file))
        if len(calls) == 1:
            raise KeyboardInterrupt
        remove(file)

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

    def snapshot_then_remove(file):  # what a kill just before this removal leaves (the lock and temporaries too)
        if os.path.basename(file).startswith("part-"):  # (os.remove is the os module's: the lock's removal too)
            snap = tmp_path / f"kill{len(snapshots):02d}"
            shutil.copytree(path, snap)
            snapshots.append(snap)
        remove(file)

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
        assert damage == {"record_errors": 0, "lost_rows": 0, "missing_rows": 4, "missing_parts": 4, "seq_gaps": 1}


# copies of parts ----------------------------------------------------------------------------------------


def test_a_copy_of_the_first_part_a_merged_part_holds_is_named_not_the_merged_part(tmp_path, monkeypatch):
    path = tmp_path / "t"
    remove = os.remove

    def sync_copy(file):  # a sync tool copied part 4 before the tracer merged it into part-000004-000007
        if os.path.basename(file) == part_name(4):
            shutil.copy(file, path / "part-000004 (1).parquet")
        remove(file)

    monkeypatch.setattr(writer.os, "remove", sync_copy)
    _adds(path, 10, 4, monkeypatch=monkeypatch)  # 0-3, 4-7, 8, 9 and the closing part 10
    monkeypatch.setattr(writer.os, "remove", remove)
    assert _files(path) == [merged_name(0, 3), "part-000004 (1).parquet", merged_name(4, 7)] + [part_name(i) for i in (8, 9, 10)]
    with pytest.raises(ReportError, match=r"part-000004 \(1\)\.parquet repeats seq 4 to 4 of part-000004-000007\.parquet"):
        reports.load(path)
    os.remove(path / "part-000004 (1).parquet")
    shutil.copy(path / merged_name(4, 7), path / "part-000004-000007 (1).parquet")  # and a copy of the merged part
    with pytest.raises(ReportError, match=r"part-000004-000007 \(1\)\.parquet says it is part 8 like part-000004-000007\.parquet"):
        reports.load(path)


# a reader racing the tracer's merges ---------------------------------------------------------------------


def test_a_merge_between_the_two_listings_of_check_parts_is_read_again(tmp_path, monkeypatch):
    path, live = tmp_path / "t", tmp_path / "live"
    remove = os.remove
    monkeypatch.setattr(writer.os, "remove", lambda file: os.path.basename(file).startswith("part-") or remove(file))
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
