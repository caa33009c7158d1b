"""The SQL engine (`--engine sql`, the default) against the pandas reference (`--engine pandas`):
traces of several runs or ranks where one run cannot be read, or lacks a column, and Trace.first_run. Each trace is
damaged by hand as test_damage.py does it; both engines must give the same exit code, stdout and stderr."""

import shutil

import pytest

from tests.helpers import copy_rank
from tests.reports.loading.test_damage import rewrite, set_cell
from tests.reports.sql.test_engines_agree_on_damage import _both, _one
from tracer.schema import part_paths


def _job(template, tmp_path, ranks=2):
    """A distributed trace: copies of the template as rank=0, rank=1, ..."""
    job = tmp_path / "job"
    shutil.copytree(template, job / "rank=0")
    for rank in range(1, ranks):
        copy_rank(template, job / f"rank={rank}", rank)
    return job


@pytest.mark.parametrize("narrow", [False, True])
def test_a_bad_row_in_rank_0_is_named_before_a_part_of_rank_1_without_a_column(
    template, tmp_path, capsys, monkeypatch, narrow
):
    """rank=0 holds a null id item (found only by reading its rows), a part of rank=1 lacks `inplace` (found from its
    footers). reports.load reads rank 0's rows before rank 1's footers and names the null item; the SQL engine read
    every run's footers first and named rank 1's part."""
    from reports.sql import engine

    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    job = _job(template, tmp_path)
    rewrite(part_paths(job / "rank=0")[0], set_cell("input_storage_ids", 3, [None]))
    rewrite(part_paths(job / "rank=1")[0], lambda t: t.drop_columns(["inplace"]))
    for extra in ([], ["--json"]):
        got = _both(capsys, "report", job, *extra)
        assert got["sql"] == got["pandas"]
        assert got["sql"] == (
            2,
            "",
            f"optrace report: error: {job / 'rank=0'}: column 'input_storage_ids' holds a "
            "null item at seq 3; expected int64 items\n",
        )


def test_a_bad_row_in_the_first_trace_is_named_before_a_missing_second_one(template, tmp_path, capsys):
    """`compare A B` where A holds a null input_shapes cell (a column compare reads for MFU) and B does not exist:
    reports.load names A's cell, the SQL engine named B."""
    bad = shutil.copytree(template, tmp_path / "a")
    rewrite(part_paths(bad)[0], set_cell("input_shapes", 3, None))
    got = _both(capsys, "compare", bad, tmp_path / "nothing")
    assert got["sql"] == got["pandas"]
    assert got["sql"][:2] == (2, "") and got["sql"][2].startswith(
        f"optrace compare: error: {bad}: column 'input_shapes' is null at seq 3"
    )


@pytest.mark.parametrize("column", ["inplace", "layout", "start_ns", "comm_bytes"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_trace_without_a_column_the_command_does_not_read(template, tmp_path, capsys, column, ranks):
    """Every part of the trace (of rank=1 in a job) lacks `column`. The pandas engine reads only the columns its
    sections read, so it reports a trace without layout, device or inplace (and a single rank without start_ns,
    which only the rank figures read) and names the column where it reads it; the SQL engine refused every such trace ("trace lacks
    column(s) ['inplace']"). It now leaves such a trace to the pandas engine, as it does a v2 trace."""
    job = _job(template, tmp_path, ranks) if ranks > 1 else shutil.copytree(template, tmp_path / "t")
    damaged = job / "rank=1" if ranks > 1 else job
    for part in part_paths(damaged):
        rewrite(part, lambda t: t.drop_columns([column]))
    report = _both(capsys, "report", job)
    compare = _both(capsys, "compare", template, damaged, "--json")
    assert report["sql"] == report["pandas"] and compare["sql"] == compare["pandas"]
    read = column == "comm_bytes" or (ranks > 1 and column == "start_ns")  # the job section, the rank figures
    assert report["sql"][0] == (2 if read else 0) and compare["sql"][0] == 0
    if read:
        assert report["sql"][2] == f"optrace report: error: {damaged}: trace lacks column(s) ['{column}']\n"


@pytest.mark.parametrize("narrow", [False, True])
def test_first_run_twice(template, tmp_path, monkeypatch, narrow):
    """A second Trace.first_run() raised DuckDB's CatalogException (a traceback: schema "first_run" already exists).
    Both now read run 0 alone (the template's 160 rows, of a job of 2 ranks), the first still open, and the Trace
    itself still reads every run (USE first_run is the cursor's alone)."""
    from reports.sql import engine, tables
    from reports.sql.engine import Trace

    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    with Trace(_job(template, tmp_path)) as every:
        one, again = every.first_run(), every.first_run()
        assert tables.ops(one) == tables.ops(again) == 160
        assert one.totals["ops"].tolist() == again.totals["ops"].tolist() == [160]
        assert every.totals["ops"].tolist() == [160, 160]
        assert every.db.execute("SELECT count(*) FROM rows").fetchone()[0] == 320  # 2 * 160
        assert one.db.execute("SELECT count(*) FROM rows").fetchone()[0] == 160


def _swapped_columns(table):
    """`table` with flops and bytes_allocated (both int64) in each other's place, each keeping its name and values."""
    names = table.column_names
    a, b = names.index("flops"), names.index("bytes_allocated")
    names[a], names[b] = names[b], names[a]
    return table.select(names)


def _reversed_columns(table):
    return table.select(table.column_names[::-1])


def _extra_column(table):
    import pyarrow as pa

    return table.append_column("note", pa.array([1] * len(table), pa.int64()))


@pytest.mark.parametrize("change", [_swapped_columns, _reversed_columns, _extra_column])
def test_a_rank_whose_parts_hold_the_columns_in_another_order(template, tmp_path, capsys, monkeypatch, change):
    """rank=1 is a copy of rank=0 whose parts hold the columns in another order (or one more column). reports.load
    reads columns by name; the SQL engine's `rows` (a UNION ALL of the runs) and its copy of many small parts (INSERT)
    matched them by position: with flops and bytes_allocated swapped it reported rank 1's bytes as its FLOPs (exit 0,
    other figures), with the columns reversed or one more it raised DuckDB's BinderException (a traceback). The SQL
    engine both ways it reads the parts (`narrow`: from the files, or once into memory) against one run of the pandas
    reference, which reads them one way (SMALL_PARTS is the SQL engine's)."""
    import json

    from reports.sql import engine

    job = _job(template, tmp_path)
    for part in part_paths(job / "rank=1"):
        rewrite(part, change)
    commands = [("report", job), ("report", job, "--json"), ("compare", job / "rank=0", job / "rank=1", "--json")]
    want = [_one(capsys, "pandas", *argv) for argv in commands]
    assert [rc for rc, _, _ in want] == [0, 0, 0]
    for narrow in (False, True):
        monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
        assert [_one(capsys, "sql", *argv) for argv in commands] == want, f"narrow={narrow}"
    total = [row for row in json.loads(want[2][1])["rows"] if row["phase"] == "total"]
    # signed changes: no change (the ratios 1 before)
    assert [row["flops_change_pct"] for row in total] == [0, 0]
    assert [row["bytes_allocated_change_pct"] for row in total] == [0, 0]
