"""The SQL engine (reports/sql) gives exactly the tables of the pandas reference path.

Reference: `reports.load(path)` and the pandas report functions. SQL: `reports.sql.engine.Trace(path)`
and reports/sql/tables.py, reports.time.roofline, reports.distributed.collectives. Integer and string
columns must be equal to the last bit; float columns made by summing floats (times, per-step figures) within 1e-12 relative, as
a sum in another order gives. Traces: the example GPT (3 AdamW steps), a trace cut mid-step,
a two-rank trace (a simulated FSDP2 rank with collectives, and a copy as rank 1), a damaged trace
(a part deleted), several runs at once. Then: the views are plain SQL a second engine (polars)
runs, part files are passed literally, and bad values get the reference loader's one line.
"""

import os
import shutil
import warnings

import pandas as pd
import pytest
import torch
from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step

import reports
from reports.distributed import collectives
from reports.errors import ReportError
from reports.flops.coverage import bounds
from reports.sql import tables
from reports.sql.engine import Trace, file_literal, statements
from reports.steps import count_steps
from reports.time import roofline
from tests.oracles import collectives as oracle_collectives
from tests.oracles import coverage as oracle_coverage
from tests.oracles import memory as oracle_memory
from tests.oracles import roofline as oracle_roofline
from tests.oracles import tables as oracle
from tests.oracles.report_json import top_ops
from tracer import Tracer
from tracer.schema import part_paths


def _gpt(path, steps, cut=False):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, 2)
    with Tracer(path, model=model, tokens=2 * cfg.seq_len, run_name=path.name, flush_rows=256):
        for _ in range(steps):
            train_step(model, opt, idx, targets)
        if cut:  # a forward and backward without its optimizer step: the phases' step counts differ
            model(idx, targets).backward()
    return path


def _same(got, want, exact=True):
    pd.testing.assert_frame_equal(got, want, check_exact=exact, rtol=1e-12)


def _phase_flops(df):
    """{phase: FLOPs per step, "total": ...} of one run's rows by reports.steps.per_step (the reference of
    reports.sql.tables.phase_flops), numbers as --json prints them."""
    from reports.output.text import json_number
    from reports.steps import per_step

    phase = df["phase"]
    flops = {p: json_number(per_step(df, mask=phase == p)) for p in ("forward", "backward", "optimizer", "other")}
    flops["total"] = json_number(per_step(df))
    return flops


def _pair(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reports.load(path), Trace(path)


TABLES = {  # name: (pandas reference (tests/oracles for the tables the library runs as SQL), SQL, exact)
    "by_phase": (oracle.by_phase, tables.by_phase, True),
    "by_op": (oracle.by_op, tables.by_op, True),
    "by_dtype": (oracle.by_dtype, tables.by_dtype, True),
    "by_step": (oracle.by_step, tables.by_step, True),
    "by_module": (oracle.by_module, reports.by_module, True),
    "peak": (oracle_memory.peak, tables.peak, True),
    "views": (oracle_memory.views, tables.views, True),
    "roofline": (
        lambda df: oracle_roofline.roofline_with_split(df)[0],
        lambda t: roofline.roofline_with_split(t)[0],
        True,
    ),
    "roofline_split": (
        lambda df: oracle_roofline.roofline_with_split(df)[1],
        lambda t: roofline.roofline_with_split(t)[1],
        True,
    ),
    "per_step_traffic": (oracle_collectives.per_step_traffic, collectives.per_step_traffic, False),
}
ONE_RUN = {  # the CLI's tables of its one run (rank 0)
    "uncounted": (oracle_coverage.uncounted, tables.uncounted, True),
    "top_ops": (lambda df: top_ops(df, 8), lambda t: tables.top_ops(t, 8), False),
}


@pytest.mark.parametrize("trace", ["gpt", "cut", "job", "damaged"])
@pytest.mark.parametrize("name", list(TABLES) + list(ONE_RUN))
def test_every_table_is_identical(traces, trace, name):
    df, sql = _pair(traces[trace])
    if name in ONE_RUN:
        df = df[df["run"] == list(df.attrs["runs"])[0]]
    ref, mine, exact = {**TABLES, **ONE_RUN}[name]
    _same(mine(sql), ref(df), exact)


@pytest.mark.parametrize("trace", ["gpt", "cut", "job", "damaged"])
def test_summary_figures_are_identical(traces, trace):
    df, sql = _pair(traces[trace])
    one = df[df["run"] == list(df.attrs["runs"])[0]]
    assert tables.phase_flops(sql) == _phase_flops(one)
    assert tables.bounds(sql) == bounds(one)
    assert tables.count_steps(sql) == count_steps(one)
    assert (tables.ops(sql), tables.steps_traced(sql)) == (len(one), one["step"].nunique())
    assert sql.runs.keys() == df.attrs["runs"].keys()
    assert [m["damage"] for m in sql.runs.values()] == [m["damage"] for m in df.attrs["runs"].values()]


def test_the_example_gpt_figures(traces):
    """Literal figures of the example GPT (d 16, 1 layer, seq 8, batch 2, 3 steps): the per-phase FLOPs per step
    agree between engines (above) and are the counts the tracer wrote: every step is the same program."""
    sql = Trace(traces["gpt"])
    flops = tables.phase_flops(sql)
    assert tables.count_steps(sql) == 3
    assert flops["total"] == flops["forward"] + flops["backward"] + flops["optimizer"] + flops["other"]
    steps = tables.by_step(sql)
    assert list(steps["step"]) == [0, 1, 2] and steps["flops"].nunique() == 1  # 3 identical steps
    assert flops["total"] == steps["flops"].iloc[0]


def test_damage_is_named_in_the_same_words(traces):
    with pytest.warns(UserWarning) as sql_warnings:
        Trace(traces["damaged"])
    with pytest.warns(UserWarning) as ref_warnings:
        reports.load(traces["damaged"])
    assert [str(w.message) for w in sql_warnings] == [str(w.message) for w in ref_warnings]
    assert "damaged" in str(sql_warnings[0].message) and "part file(s) missing" in str(sql_warnings[0].message)


def test_several_runs_at_once(traces):
    paths = [traces["gpt"], traces["cut"]]
    df, sql = reports.load(paths), Trace(paths)
    for name, (ref, mine, exact) in TABLES.items():
        _same(mine(sql), ref(df), exact)


@pytest.mark.parametrize(
    "column, row, value, message",
    [
        ("flops", 3, -5, "column 'flops' holds -5 at seq 3"),
        ("live_bytes", 2, None, "column 'live_bytes' is null at seq 2"),
        ("seq", 4, 2, "seq 2 follows seq 3"),
        ("duration_ns", 0, 2**62, None),  # in range: no error on either path
    ],
)
def test_bad_values_get_the_reference_loaders_line(traces, tmp_path, column, row, value, message):
    from tests.reports.loading.test_damage import rewrite, set_cell

    bad = tmp_path / "bad"
    shutil.copytree(traces["gpt"], bad)
    rewrite(part_paths(bad)[0], set_cell(column, row, value))
    if message is None:
        assert tables.ops(Trace(bad)) == len(reports.load(bad))
        return
    with pytest.raises(ReportError) as ref:
        reports.load(bad)
    with pytest.raises(ReportError) as mine:
        Trace(bad)
    assert str(mine.value) == str(ref.value)
    assert message in str(mine.value)


def swapped(trace, bad):
    """A copy of `trace` at `bad` with its first two parts' names swapped: seq goes back at the boundary."""
    shutil.copytree(trace, bad)
    first, second = part_paths(bad)[:2]
    os.rename(first, str(first) + ".x")
    os.rename(second, first)
    os.rename(str(first) + ".x", second)
    return bad


def test_a_part_out_of_seq_order_gets_the_reference_loaders_line(traces, tmp_path):
    """Parts whose seq ranges are swapped (the parts renamed): seq goes back at the boundary."""
    bad = swapped(traces["gpt"], tmp_path / "swapped")
    with pytest.raises(ReportError) as ref:
        reports.load(bad)
    with pytest.raises(ReportError) as mine:
        Trace(bad)
    assert str(mine.value) == str(ref.value)


def test_part_files_are_literal_paths(traces, tmp_path):
    """A trace under `exp[1]` is read from there, not from `exp1` (DuckDB globs every file name it is given)."""
    shutil.copytree(traces["gpt"], tmp_path / "exp[1]")
    shutil.copytree(traces["cut"], tmp_path / "exp1")
    assert tables.ops(Trace(tmp_path / "exp[1]")) == len(reports.load(traces["gpt"]))
    assert file_literal("/a/it's [x]*?.parquet") == "'/a/it''s [[]x][*][?].parquet'"


def test_the_simple_views_are_plain_sql_polars_runs(traces):
    """Each view marked portable in views.sql runs unchanged in polars' SQL over the same rows, with the same
    result as DuckDB's (rows sorted by every column, compared as floats)."""
    import polars as pl

    sql = Trace(traces["gpt"])
    rows = pl.from_pandas(
        sql.sql(
            "SELECT * EXCLUDE (input_shapes, input_strides, output_shapes, output_strides, "
            "input_storage_ids, output_storage_ids, freed_storage_ids, output_storage_bytes, "
            "group_sizes, input_dtypes, output_dtypes) FROM rows"
        )
    )
    context = pl.SQLContext(rows=rows)
    portable = [(name, body) for name, body, ok in statements() if ok]
    assert {"phase_steps", "run_totals", "by_phase", "by_step", "module_own", "uncounted", "peak"} <= {
        n for n, _ in portable
    }
    for name, body in portable:
        got = context.execute(body, eager=True).to_pandas()
        context.register(name, pl.from_pandas(got))  # later views read earlier ones
        want = sql.sql(f"SELECT * FROM {name}")
        assert list(got.columns) == list(want.columns), name
        key = list(want.columns)
        got = (
            got.astype({c: "float64" for c in key if got[c].dtype.kind in "iuf"})
            .sort_values(key)
            .reset_index(drop=True)
        )
        want = (
            want.astype({c: "float64" for c in key if want[c].dtype.kind in "iuf"})
            .sort_values(key)
            .reset_index(drop=True)
        )
        pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-12, obj=name)


@pytest.mark.parametrize("trace", ["gpt", "cut", "job", "damaged"])
def test_the_report_is_the_same_from_either_source(traces, trace, capsys):
    """`optrace report` and `--json` print the same text whether every table comes from SQL or from the frame."""
    from reports.output.cli import main

    texts = {}
    for flags in (["--full"], ["--json"]):  # --full: every section of the text
        outs = []
        for engine in ("pandas", "sql"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert main(["report", str(traces[trace]), "--engine", engine, *flags]) == 0
            outs.append(capsys.readouterr().out)
        assert outs[0] == outs[1]
        texts["--json" in flags] = outs[0]
    outs = [texts[False]]
    assert "Roofline" in outs[0] and "Top modules" in outs[0] and "Views (no new memory) vs copies" in outs[0]


def test_views_sql_runs_as_a_script_as_the_readme_shows(traces):
    """The README's DuckDB session: `rows` over a glob of the parts, then views.sql as it is."""
    import duckdb

    from reports.sql.engine import VIEWS_SQL

    db = duckdb.connect()
    glob = str(traces["gpt"] / "part-*.parquet")
    db.execute(f"CREATE VIEW rows AS SELECT 'gpt' AS run, 0 AS run_index, * FROM read_parquet('{glob}')")
    with open(VIEWS_SQL) as f:
        db.execute(f.read())
    got = db.execute("SELECT phase, flops, flops_pct FROM by_phase ORDER BY phase_order").fetchdf()
    want = tables.by_phase(Trace(traces["gpt"]))[["phase", "flops", "flops_pct"]]
    assert got["phase"].tolist() == want["phase"].tolist()
    assert got["flops"].astype("int64").tolist() == want["flops"].tolist()
    assert got["flops_pct"].tolist() == want["flops_pct"].tolist()


def test_the_engine_flag_gives_the_same_report(traces, capsys):
    from reports.output.cli import main

    outputs = []
    for engine in ("pandas", "sql"):
        assert main(["report", str(traces["cut"]), "--engine", engine]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and "Top 8 ops by FLOPs" in outputs[0]


LIBRARY = ("by_phase", "by_op", "by_dtype", "by_step", "by_module", "peak", "views")  # reports.X runs views.sql's X


@pytest.mark.parametrize("trace", ["gpt", "job"])
def test_the_library_and_the_cli_run_the_same_view(traces, trace):
    """reports.X(df) runs the view the CLI runs over the files, over the frame's rows (reports.sql.frame), and over
    an Arrow table of them: each table equal to the last bit to the CLI's (a Trace of the files)."""
    import pyarrow as pa

    df, sql = _pair(traces[trace])
    cli = {"by_module": reports.by_module}
    for name in LIBRARY:
        want = cli[name](sql) if name in cli else getattr(tables, name)(sql)
        _same(getattr(reports, name)(df), want)
        if trace == "gpt" and name != "by_module":  # one run: an Arrow table of its rows (no run column) gives the
            # same table (not by_module: a table holds no run metadata, so no root module to hang the tree on)
            arrow = pa.Table.from_pandas(df.drop(columns=["run"]), preserve_index=False)
            got = getattr(reports, name)(arrow)
            _same(
                got.drop(columns=["run"]) if "run" in got else got,
                want.drop(columns=["run"]) if "run" in want else want,
            )
