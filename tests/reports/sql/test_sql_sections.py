"""The memory, meter and distributed sections of `optrace report` from the SQL engine (reports/memory/sql_categories.py,
reports/distributed/sql_ranks.py): the same tables, the same text and --json, as the pandas reference.

Traces: the example GPT (3 AdamW steps), one cut mid-step, a checkpointed MLP, a storage resized in place,
a model on the meta device, two runs at once, a damaged trace (a part deleted), a simulated FSDP2 job of
world size 4 (tests/tracer/distributed/test_job.py) with a copy of its rank 0 as rank 1, and a metered run.
"""

import json
import os
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

import reports
from reports.distributed import sql_ranks as distributed
from reports.flops.meter import meter_summary
from reports.memory import sql_categories
from reports.memory.frame_rows import lists_of, runs_in_order
from reports.memory.lifetimes import Lists, Storages
from reports.memory.live import categories_at
from reports.memory.memory import CATEGORY_DTYPES
from reports.memory.sql_categories import SCHEMA, memory_lists, memory_rows
from reports.output.cli import main
from reports.output.source import Source
from reports.sql.engine import Trace
from tests.helpers import copy_rank
from tests.oracles import ranks as pandas_ranks
from tests.reports.sql.test_sql import _gpt
from tests.tracer.distributed.test_job import LAYER_BYTES, simulate
from tracer import Meter, Tracer
from tracer.schema import part_paths


def _checkpointed(path):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 8, requires_grad=True)
    with Tracer(path, model=model, tokens=4, run_name="ckpt"):
        for _ in range(2):
            checkpoint(model, x, use_reentrant=False).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return path


def _resized(path):
    buffer = torch.zeros(4)  # 16 bytes, made before the trace: an input
    with Tracer(path, run_name="r"):
        y = buffer + 1  # seq 0: a 16-byte temporary
        buffer.resize_(16)  # seq 1: the input holds 64 bytes from here on
        z = buffer * 2  # seq 2: a 64-byte temporary
    del y, z
    return path


def _meta(path):
    with torch.device("meta"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
        x = torch.randn(8, 32)
    opt = torch.optim.AdamW(model.parameters())
    with Tracer(path, model=model, tokens=8, run_name="meta"):
        model(x).sum().backward()
        opt.step()
    return path


def _metered(path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Meter(path, model=model, tokens=4, peak_flops=1e12) as meter:
        for i in range(5):  # steps 0 and 1 traced, step 2 metered
            model(torch.randn(2 if i >= 3 else 4, 8)).sum().backward()  # step 3: a new shape, so step 4 is traced
            opt.step()
            opt.zero_grad()
            meter.step()
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("sections")
    gpt = _gpt(root / "gpt", 3)
    job = root / "job"
    simulate(job, 4)
    copy_rank(job / "rank=0", job / "rank=1", 1)
    damaged = root / "damaged"
    shutil.copytree(gpt, damaged)
    os.remove(part_paths(damaged)[1])
    return {
        "gpt": gpt,
        "cut": _gpt(root / "cut", 2, cut=True),
        "ckpt": _checkpointed(root / "ckpt"),
        "resized": _resized(root / "resized"),
        "meta": _meta(root / "meta"),
        "damaged": damaged,
        "job": job,
        "two": [gpt, _checkpointed(root / "ckpt2")],
        "metered": _metered(root / "metered"),
    }


def _pair(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reports.load(path), Trace(path)


def by_category(trace):
    """sql_categories.by_category's pyarrow.Table (of SCHEMA) as the library's DataFrame."""
    table = sql_categories.by_category(trace)
    assert table.schema == SCHEMA
    return table.to_pandas().astype(CATEGORY_DTYPES)  # strings as objects, as the library gives them


@pytest.mark.parametrize("trace", ["gpt", "cut", "ckpt", "resized", "meta", "damaged", "job", "two"])
def test_memory_categories_are_the_references(traces, trace):
    """The report's categories (a scan of the files, no pandas) are the library's (reports.memory.frame_rows' feed of
    the loaded frame), both through the one lifetime model."""
    df, sql = _pair(traces[trace])
    pd.testing.assert_frame_equal(by_category(sql), reports.by_category(df), check_exact=True)


@pytest.mark.parametrize("trace", ["gpt", "cut", "ckpt", "resized", "meta", "damaged", "job", "two"])
def test_the_storage_lists_by_sql_are_the_frames(traces, trace):
    """Each run's lifetimes.Lists from SQL (one row per storage) equal those the reference reads from its frame."""
    df, sql = _pair(traces[trace])
    for i, (name, _, rows) in enumerate(runs_in_order(df)):
        want, got = lists_of(rows), memory_lists(sql, i, memory_rows(sql, i))
        assert got.top == want.top and len(got.seen) > 0
        for field in Lists._fields:
            if field not in ("top", "row_max"):
                assert getattr(got, field).tolist() == getattr(want, field).tolist(), (name, field)
        assert got.row_max().tolist() == want.row_max().tolist()


@pytest.mark.parametrize("shift", [0, 2**62])
def test_the_storage_lists_of_hugeint_keys_and_unpaired_sizes(traces, tmp_path, shift):
    """Keys past a BIGINT ((seq * 2 + 2) x the longest list's length past 2**63: a seq past 2**61, which the loader
    accepts, or lists of billions of items) take HUGEINTs; a row whose output_storage_bytes do not pair one to one
    with its outputs gives no sizes, in SQL as in the reference."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    trace = tmp_path / "unpaired"
    shutil.copytree(traces["gpt"], trace)
    made = []
    for n, part in enumerate(part_paths(trace)):
        table, metadata = pq.read_table(part), pq.read_metadata(part).metadata
        if n == 0:
            sizes = table.column("output_storage_bytes").to_pylist()
            made = [i for i, v in enumerate(sizes) if v and v[0] > 0][:3]
            for i in made:
                sizes[i] = sizes[i] + [8]  # one size more than outputs
            index = table.column_names.index("output_storage_bytes")
            table = table.set_column(index, table.schema.field(index), pa.array(sizes, table.schema.field(index).type))
        index = table.column_names.index("seq")
        table = table.set_column(
            index, table.schema.field(index), pc.add(table.column("seq"), shift)
        )  # 2**62: seq * 2 no int64
        pq.write_table(table.replace_schema_metadata(metadata), part)
    assert len(made) == 3
    df, sql = _pair(trace)
    rows = next(runs_in_order(df))[2]
    want = lists_of(rows)
    assert not np.isin([rows["output_storage_ids"].iloc[i][0] for i in made], want.known[0]).any()  # unpaired: no size
    from reports.memory.row_scan import Scan

    for opened in (sql, Trace(trace, keep=(Scan,))):  # a DuckDB scan of its own; the Trace's read of the parts
        got = memory_lists(opened, 0, memory_rows(opened, 0))
        for field in Lists._fields:
            if field not in ("top", "row_max"):
                assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    pd.testing.assert_frame_equal(by_category(sql), reports.by_category(df), check_exact=True)


def test_the_lifetime_model_reads_the_wide_columns_at_a_few_rows_only(traces, monkeypatch):
    df, sql = _pair(traces["gpt"])
    rows = memory_rows(sql, 0)
    assert len(rows) == len(df) and rows.seq.tolist() == df["seq"].tolist()
    assert rows.phases == tuple(sorted(df["phase"].astype(str).unique()))
    assert [rows.phases[c] for c in rows.phase] == df["phase"].astype(str).tolist()
    assert np.diff(rows.lists.in_offsets).tolist() == df["input_storage_ids"].map(len).tolist()
    asked, real = [], sql_categories._cells
    monkeypatch.setattr(
        sql_categories,
        "_cells",
        lambda t, i, column, seqs, kept: asked.append((column, len(seqs))) or real(t, i, column, seqs, kept),
    )
    got = categories_at(Storages("gpt", df.attrs["runs"]["gpt"], rows), "peak")
    pd.testing.assert_frame_equal(pd.DataFrame(got).astype(CATEGORY_DTYPES), reports.by_category(df), check_exact=True)
    # input dtypes where a storage is first seen as an input, shapes and strides where no size is known
    assert {c for c, _ in asked} <= {"input_shapes", "input_strides", "input_dtypes", "output_shapes"}
    assert asked and all(0 < n < len(df) / 4 for _, n in asked), asked
    got = rows.cell_lists("input_dtypes", np.array([5, 2]), None)  # in the order asked
    assert got.to_pylist() == [list(df["input_dtypes"].iloc[5]), list(df["input_dtypes"].iloc[2])]


def test_a_storage_resized_in_place(traces):
    df, sql = _pair(traces["resized"])
    assert df.attrs["runs"]["r"]["storage_roles"]["resized"] == [[1, 0, 64]]  # [seq, storage id, bytes]
    got = by_category(sql).set_index("category")
    assert (got["seq"] == 2).all()  # the peak: after z = buffer * 2
    assert got.loc["inputs", "bytes"] == 64  # the buffer: 16 float32 after the resize, 16 * 4
    assert got.loc["temporaries", "bytes"] == 16 + 64  # y: 4 * 4; z: 16 * 4
    assert got["bytes"].sum() == 144 and got.loc["inputs", "live_pct"] == pytest.approx(100 * 64 / 144)


def test_the_rank_tables_are_the_references(traces):
    df, sql = _pair(traces["job"])
    assert distributed.is_multi_rank(sql) and pandas_ranks.is_multi_rank(df) and list(sql.ranks) == [0, 1]
    for mine, ref in (
        (distributed.ranks, pandas_ranks.ranks),
        (distributed.imbalance, pandas_ranks.imbalance),
        (distributed.collectives, pandas_ranks.collectives),
    ):
        pd.testing.assert_frame_equal(mine(sql), ref(df), check_exact=True)
    for table in (
        "ranks",
        "imbalance",
        "collectives",
    ):  # the library (reports.ranks(df)) runs the CLI's views over the frame
        pd.testing.assert_frame_equal(getattr(reports, table)(df), getattr(distributed, table)(sql), check_exact=True)
    table = distributed.ranks(sql)
    # per step: 8 all-gathers and 4 reduce-scatters of one layer's 64 * 64 * 4 = 16,384 bytes: 196,608
    assert table["comm_bytes_per_step"].tolist() == [12 * LAYER_BYTES] * 2
    assert distributed.job_summary(sql, 2) == pandas_ranks.job_summary(pandas_ranks.first_rank(df), 2)
    one = _pair(traces["gpt"])[1]
    assert not distributed.is_multi_rank(one) and distributed.job_summary(one, 0) is None


def test_the_meter_section_reads_the_runs(traces):
    df, sql = _pair(traces["metered"])
    found = Source(sql).meter_summary()
    assert found == meter_summary(df) and found["steps"] == 5 and found["traced_steps"] == [0, 1, 4]


@pytest.mark.parametrize("trace", ["job", "ckpt", "resized", "metered"])
def test_the_report_is_the_same_from_either_engine(traces, trace, capsys):
    outputs = []
    for flags in (["--full"], ["--json"]):  # --full: every section of the text
        for engine in ("pandas", "sql"):
            assert main(["report", str(traces[trace]), "--engine", engine, *flags]) == 0
            outputs.append(capsys.readouterr())
    assert outputs[0] == outputs[1] and outputs[2] == outputs[3]
    if trace == "job":
        assert "Ranks (2 of 4)" in outputs[1].out and "Memory: peak" in outputs[1].out
        assert [r["rank"] for r in json.loads(outputs[3].out)["ranks"]] == [0, 1]


def test_the_rank_views_marked_portable_run_in_polars(traces):
    """Each view of reports/sql/ranks.sql marked portable runs unchanged in polars' SQL over the same rows, with
    DuckDB's result (as tests/reports/sql/test_sql.py checks views.sql's)."""
    import polars as pl

    from reports.sql.engine import VIEW_FILES, statements

    sql = _pair(traces["job"])[1]
    rows = pl.from_pandas(
        sql.sql(
            "SELECT run, run_index, seq, step, phase, op, flops, duration_ns, start_ns, comm_bytes, "
            "group_size, CAST(process_group AS VARCHAR) AS process_group FROM rows"
        )
    )
    context = pl.SQLContext(rows=rows)
    [ranks_sql] = [f for f in VIEW_FILES if f.endswith("ranks.sql")]
    portable = [(name, body) for name, body, ok in statements(ranks_sql) if ok]
    assert {n for n, _ in portable} == {"rank_step_phase", "collective_calls"}
    for name, body in portable:
        got = context.execute(body, eager=True).to_pandas()
        want = sql.sql(f"SELECT * FROM {name}")
        assert list(got.columns) == list(want.columns), name
        key = ["run_index", "first_seq"]
        got = (
            got.astype({c: "float64" for c in got if got[c].dtype.kind in "iuf"})
            .sort_values(key)
            .reset_index(drop=True)
        )
        want = (
            want.astype({c: "float64" for c in want if want[c].dtype.kind in "iuf"})
            .sort_values(key)
            .reset_index(drop=True)
        )
        pd.testing.assert_frame_equal(
            got,
            want.astype({"process_group": object}) if "process_group" in want else want,
            check_dtype=False,
            rtol=1e-12,
            obj=name,
        )
        assert len(got) > 0


@pytest.mark.parametrize("trace", ["gpt", "cut", "ckpt", "resized", "meta", "job", "two"])
def test_the_memory_scan_kept_from_the_traces_read_is_the_sql_one(traces, trace):
    """reports/memory/row_scan.py fed by the Trace's one read of the parts (Trace(keep=[Scan]), as `optrace report`
    opens it) gives run 0 the frame, Lists and categories a DuckDB scan of its own gives; the cells the model reads
    come from the rows it kept (no scan of the list columns), and the other runs are read by SQL."""
    from reports.memory.row_scan import Scan

    df, sql = _pair(traces[trace])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = Trace(traces[trace], keep=(Scan,))
    assert (Scan, 0) in kept.kept

    class NoListScan:  # the DuckDB connection, but no read of cells by a scan of their own (sql_categories._cells)
        def __init__(self, db):
            self.db = db

        def register(self, *args):
            raise AssertionError("a scan of the list columns for the model's cells")

        def __getattr__(self, name):
            return getattr(self.db, name)

    kept.db = NoListScan(kept.db)
    got = memory_rows(kept, 0)
    assert (Scan, 0) not in kept.kept  # taken once
    want = memory_rows(sql, 0)
    for column in ("seq", "step", "phase", "live_bytes", "bytes_allocated"):
        assert getattr(got, column).tolist() == getattr(want, column).tolist(), column
    assert got.phases == want.phases
    for field in Lists._fields:
        if field not in ("top", "row_max"):
            assert getattr(got.lists, field).tolist() == getattr(want.lists, field).tolist()
    assert got.lists.top == want.lists.top
    assert got.lists.row_max().tolist() == want.lists.row_max().tolist()
    name, meta = next(iter(df.attrs["runs"].items()))
    categories = pd.DataFrame(categories_at(Storages(name, meta, got), "peak")).astype(CATEGORY_DTYPES)
    reference = reports.by_category(df)
    pd.testing.assert_frame_equal(
        categories, reference[reference["run"] == name].reset_index(drop=True), check_exact=True
    )
    kept.db = kept.db.db  # read again: by SQL, as the other runs are
    pd.testing.assert_frame_equal(by_category(kept), by_category(sql), check_exact=True)


def test_compare_keeps_every_runs_memory_scan_from_the_traces_read(traces, monkeypatch):
    """Trace(every_run=True), as `optrace compare` opens its traces: each run's read of its parts feeds a Scan of its
    own (run 1's lists not scanned again by sql_categories), while the runs fed hold at most checks.KEEP_ROWS rows; the
    categories are those of the Trace without kept scans."""
    from reports.memory.row_scan import Scan
    from reports.sql import checks

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        every, first = Trace(traces["two"], keep=(Scan,), every_run=True), Trace(traces["two"], keep=(Scan,))
    assert sorted(i for _, i in every.kept) == [0, 1]
    assert sorted(i for _, i in first.kept) == [0]  # the report's: run 0's alone
    scanned = []
    monkeypatch.setattr(sql_categories, "_scan", lambda *args, **kwargs: scanned.append(args[1]))
    got = by_category(every)
    assert scanned == [] and not every.kept  # both runs' scans taken from the read
    monkeypatch.undo()
    pd.testing.assert_frame_equal(got, by_category(first), check_exact=True)
    rows = every.run_rows[0]["ops"]  # run 0's rows: run 1 does not fit beside them under a cap of that many
    monkeypatch.setattr(checks, "KEEP_ROWS", rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        capped = Trace(traces["two"], keep=(Scan,), every_run=True)
    assert sorted(i for _, i in capped.kept) == [0]
