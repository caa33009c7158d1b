"""The SQL engine (`--engine sql`, the default) against the pandas reference (`--engine pandas`): traces
where the two printed different text or errors. Each trace is damaged by hand the way test_damage.py does it, and
`optrace report` (text and --json) must give the same exit code, stdout and stderr from both engines."""

import os
import shutil

import pandas as pd
import pyarrow as pa
import pytest
import torch

import reports
from reports.output.cli import main
from tests.reports.loading.test_damage import rewrite, set_cell
from tracer import Tracer
from tracer.schema import part_paths


@pytest.fixture
def trace(template, tmp_path):
    return shutil.copytree(template, tmp_path / "t")


def _one(capsys, engine, *argv):
    """(exit code, stdout, stderr) of `optrace argv --engine engine`."""
    rc = main([str(a) for a in argv] + ["--engine", engine])
    return (rc, *capsys.readouterr())


def _both(capsys, *argv):
    """{engine: (exit code, stdout, stderr)} of `optrace argv --engine engine`."""
    return {engine: _one(capsys, engine, *argv) for engine in ("pandas", "sql")}


def _same_report(capsys, path):
    """(exit code, stdout, stderr) of `optrace report path --full`, the same from both engines, as is --json's."""
    text = _both(capsys, "report", path, "--full")
    assert text["sql"] == text["pandas"]
    json = _both(capsys, "report", path, "--json")
    assert json["sql"] == json["pandas"]
    return text["pandas"]


@pytest.mark.parametrize(
    "column", ["input_storage_ids", "output_storage_ids", "freed_storage_ids", "output_storage_bytes"]
)
@pytest.mark.parametrize("narrow", [False, True])
def test_a_null_item_in_an_id_or_size_list_is_refused_by_both_engines(trace, capsys, monkeypatch, column, narrow):
    """The SQL engine scanned list cells for a null list but not for a null item in one: it reported a trace the
    reference refuses (the Parquet statistics count a null item as they count an empty list). Both ways it reads
    the parts: from the files, or once into reports/sql/scan.py `_src` (a trace of many small parts)."""
    from reports.sql import engine

    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    rewrite(part_paths(trace)[0], set_cell(column, 3, [None]))
    rc, out, err = _same_report(capsys, trace)
    assert (rc, out) == (2, "")
    assert (
        err == f"optrace report: error: {trace}: column {column!r} holds a null item at seq 3; expected int64 items\n"
    )


def test_a_step_number_near_int64_gives_the_same_report(trace, capsys):
    """A step of 2**62 passes the checks (a step has no upper bound). reports/steps.py keyed (step, phase) pairs as
    step * phases + phase: 2**62 * 7 phase names wrapped int64 and the SQL engine's frame crashed (IndexError), and
    2**62 * 4 wraps to 0 (step 2**62 counted as step 0)."""
    import reports
    from reports.steps import phase_steps

    rewrite(part_paths(trace)[0], set_cell("step", 3, 2**62))  # seq 3: a forward op of step 0
    df = reports.load(trace)
    assert phase_steps(df) == {"forward": 3, "backward": 2, "optimizer": 2}  # steps 0, 1 and 2**62 ran a forward op
    rc, out, err = _same_report(capsys, trace)
    assert (rc, err) == (0, "") and "(160 ops, 3 step(s)" in out


def _mlp_run(path, name):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    with Tracer(path, model=model, tokens=3, run_name=name):
        model(torch.randn(3, 4)).sum().backward()


def test_a_job_whose_rank_0_traced_nothing_gets_the_same_line(tmp_path, capsys):
    """rank=0 empty, rank=1 with 8 rows. The reference told ranks apart by the rows' rank column (one value here), so
    it printed rank 1's rows under rank 0's name and metadata ("e/rank=0 (8 ops", no parameters); the SQL engine
    reports rank 0, which has no ops. Both now say that rank 0 has none, and name another rank to report."""
    with Tracer(tmp_path / "job" / "rank=0", run_name="e"):
        pass
    _mlp_run(tmp_path / "job" / "rank=1", "m")
    rc, out, err = _same_report(capsys, tmp_path / "job")
    assert (rc, out) == (2, "")
    job = tmp_path / "job"
    assert err == (
        f"optrace report: error: {job / 'rank=0'}: rank 0 has no ops (nothing ran inside `with Tracer(...)` "
        f"there), and the report is of the lowest rank; report another rank's directory, e.g. {job / 'rank=1'}\n"
    )


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("device", None, "column 'device' is null in part-000000.parquet (1 null value(s)); expected string values"),
        ("layout", None, "column 'layout' is null in part-000000.parquet (1 null value(s)); expected string values"),
        ("inplace", None, "column 'inplace' is null in part-000000.parquet (1 null value(s)); expected bool values"),
        (
            "start_ns",
            -1,
            "column 'start_ns' holds -1 in part-000000.parquet; expected ns since the epoch >= 0 "
            "(a damaged or hand-edited trace?)",
        ),
    ],
)
def test_damage_in_a_column_the_report_does_not_read_gets_the_reference_words(trace, capsys, column, value, message):
    """The pandas engine leaves these columns in the files and names damage there by part (from the statistics); the
    SQL engine's reference read took every column and named the seq instead. Now it reads the pandas engine's."""
    rewrite(part_paths(trace)[0], set_cell(column, 3, value))
    assert _same_report(capsys, trace) == (2, "", f"optrace report: error: {trace}: {message}\n")


def test_damage_in_storage_ids_is_refused_by_compare_in_both_engines_alike(trace, template, capsys):
    """`compare` reads the storage ids since it says what changed in memory at the peak (reports.compare_words): a
    null id item, refused by `report`, is refused by `compare` too, in the same one line by both engines."""
    rewrite(part_paths(trace)[0], set_cell("input_storage_ids", 3, [None]))
    got = _both(capsys, "compare", template, trace, "--by", "op", "--json")
    assert got["sql"] == got["pandas"] and got["sql"][0] == 2 and got["sql"][1] == ""
    assert got["sql"][2].count("\n") == 1 and "int64 items" in got["sql"][2]


@pytest.fixture(scope="module")
def bound(tmp_path_factory):
    """A dot whose FLOP formula passes int64 (stored as 2**63 - 1 with flops_bound, as test_schema.py makes it), then
    a Linear(8, 4) forward and backward on 4 rows."""
    from tracer.flops.formulas import _registry

    path = tmp_path_factory.mktemp("bound") / "b"
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    op = torch.ops.aten.dot
    saved = _registry[op]
    _registry[op] = (lambda *a, **k: 2**70, "matmul")
    try:
        with Tracer(path, model=model, tokens=4, run_name="b"):
            torch.dot(torch.ones(3), torch.ones(3))
            model(torch.randn(4, 8)).sum().backward()
    finally:
        _registry[op] = saved
    return path


def test_a_flops_bound_row_is_no_negative_module_total(bound, capsys):
    """The ops outside modules hold 2**63 - 1 + 7 small counts: summed in float64, 9.223372036854776e18 = 2**63, which
    the int64 guard (`> 2**63 - 1`, true of no float64 that rounds to 2**63) cast back to int64: -2**63. Both engines
    printed "-9.22e+18" for the module, and the SQL engine a share of -100%."""
    import reports
    from reports.sql.engine import Trace

    df = reports.load(bound)
    for table in (reports.by_module(df), reports.by_module(Trace(bound))):
        outside = table[table["module"] == ""].iloc[0]
        assert outside["subtree_flops"] == 2.0**63 and outside["subtree_flops_pct"] == 100.0  # 528 FLOPs are 6e-15 %
    rc, out, err = _same_report(capsys, bound)
    assert rc == 0 and "-9.22e+18" not in out


def test_modules_whose_flops_pass_int64_together_roll_up_as_the_reference(tmp_path, capsys):
    """Ten Linear layers whose addmm each counts 10**18 FLOPs (a registered formula; the loader's most for one row):
    each module's own sum fits int64, the root's subtree (10**19) does not. The SQL engine rolled the modules up in
    int64 and printed the root at a negative total and share ("overflow encountered in scalar add"); both engines now
    give 1e19 as float64."""
    import reports
    from reports.sql.engine import Trace
    from tracer.flops.formulas import _registry

    op = torch.ops.aten.addmm
    saved = _registry.get(op)
    _registry[op] = (lambda *a, **k: 10**18, "matmul")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(10)])
        with Tracer(tmp_path / "t", model=model):
            with torch.no_grad():
                model(torch.randn(3, 4))
    finally:
        if saved is None:
            del _registry[op]
        else:
            _registry[op] = saved
    tables = reports.by_module(reports.load(tmp_path / "t")), reports.by_module(Trace(tmp_path / "t"))
    pd.testing.assert_frame_equal(tables[1], tables[0], check_exact=True)
    root = tables[1][tables[1]["module"] == "Sequential"].iloc[0]
    assert root["subtree_flops"] == 1e19 and root["subtree_flops_pct"] == 100.0  # 10 x 10**18
    rc, out, err = _same_report(capsys, tmp_path / "t")
    assert rc == 0 and "overflow" not in err and "-" not in out.split("Top modules")[1].split("\n\n")[0]


@pytest.mark.parametrize("by", ["phase", "op", "module"])
def test_compare_reads_a_trace_with_a_flops_bound_row(bound, template, capsys, by):
    """A count clamped to int64 is a flagged bound, not damage (reports.load accepts it), but compare read flops
    without flops_bound and both engines refused the trace: "holds 9,223,372,036,854,775,807 at seq 2"."""
    got = _both(capsys, "compare", template, bound, "--by", by, "--json")
    assert got["sql"] == got["pandas"]
    assert got["sql"][0] == 0, got["sql"][2]


def test_the_split_by_bound_of_a_gpu_trace_is_the_same_in_json(trace, capsys):
    """The template's metadata says it ran on an H100 (so the roofline knows its peaks) and its times are fixed
    (duration_ns = busy_ns = seq * 7919 % 100003 + 1000). The split by bound summed float seconds in another order in
    each engine (--json printed time_s 0.0020341525 against 0.0020341524999999997 on one such trace); both now add
    the same arrays of op groups in one order (reports/time/roofline.py split_of_groups)."""
    from tests.reports.loading.test_damage import set_metadata

    part = part_paths(trace)[0]
    rewrite(part, _fixed_times)
    rewrite(part, set_metadata(device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}))
    got = _both(capsys, "report", trace, "--json")
    assert got["sql"][0] == 0
    assert got["sql"] == got["pandas"]


def _fixed_times(t, big_at=None):
    """`t` with duration_ns = busy_ns = seq * 7919 % 100003 + 1000, and 2**62 ns at seq `big_at`."""
    seq = t.column("seq").to_pylist()
    ns = pa.array([2**62 if s == big_at else s * 7919 % 100003 + 1000 for s in seq], pa.int64())
    t = t.set_column(t.schema.get_field_index("duration_ns"), "duration_ns", ns)
    return t.set_column(t.schema.get_field_index("busy_ns"), "busy_ns", ns)


@pytest.mark.xfail(
    strict=True,
    reason="per-rank seconds are float64 sums in another order in each engine: equal "
    "bits only while a rank's ns sum stays below 2**53 (104 days); duration_ns has no upper bound",
)
def test_the_ranks_of_a_job_with_a_146_year_op_are_the_same_in_json(template, tmp_path, capsys):
    """Two copies of the template as rank=0 and rank=1; rank 1's seq 3 lasted 2**62 ns (146 years, accepted: a
    duration has no upper bound). --json's ranks and imbalance differ in the last bits (max_s 2305843009.215247
    against 2305843009.215248 on one such trace)."""
    for rank in (0, 1):
        part = part_paths(shutil.copytree(template, tmp_path / "job" / f"rank={rank}"))[0]
        rewrite(part, lambda t: _fixed_times(t, 3 if rank else None))
    got = _both(capsys, "report", tmp_path / "job", "--json")
    assert got["sql"][0] == 0
    assert got["sql"] == got["pandas"]


def test_a_directory_with_a_backslash_and_a_bracket_gives_the_same_report(template, tmp_path, capsys):
    """`a\\[b`: the reference reads it; the SQL engine raised duckdb's IOException "No files found that match the
    pattern" (a traceback, not one line): DuckDB's glob takes the backslash for a separator or an escape once the
    path holds [, * or ?, so file_literal's [x] escapes do not reach the file. A backslash alone, or brackets alone,
    read fine. Such a trace is now read by the pandas engine (as a v2 trace is)."""
    path = shutil.copytree(template, tmp_path / "a\\[b")
    assert _same_report(capsys, path)[0] == 0
    got = _both(capsys, "compare", template, path)
    assert got["sql"] == got["pandas"] and got["sql"][0] == 0


def test_rank_0s_sections_come_from_run_0_of_the_trace_of_every_rank(template, tmp_path, capsys, monkeypatch):
    """The report of a job is rank 0's, and the SQL engine reads it from run 0 of its Trace of every rank
    (Trace.first_run), not from a second Trace of rank 0's files. Rank 1 is another model (the template's MLP, 160
    rows, where rank 0 has 8): a row of rank 1 in rank 0's sections would show in the text and --json. The SQL
    engine both ways it reads the parts (`narrow`) against one run of the pandas reference (which does not read
    SMALL_PARTS)."""
    from reports.sql import engine

    job = tmp_path / "job"
    _mlp_run(job / "rank=0", "m")  # Linear(4, 2) on 3 rows: forward, backward
    shutil.copytree(template, job / "rank=1")
    reference = [_one(capsys, "pandas", "report", job, *extra) for extra in (["--full"], ["--json"])]
    for narrow in (False, True):
        monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
        assert [_one(capsys, "sql", "report", job, *extra) for extra in (["--full"], ["--json"])] == reference
        _first_run_is_rank_0s(job, narrow)
    rc, out, err = reference[0]
    head, ranks = out.split("\nRanks (2): per step")
    assert (rc, err) == (0, "") and "m/rank=0  (14 ops, 1 step(s)" in head and "mlp" not in head
    assert (
        "    total   108            144 0.750" in head
    )  # 2 * 3 * 4 * 2 = 48 (addmm) + 6 (sum) forward, 48 (mm) + 6 back


def _first_run_is_rank_0s(job, narrow):
    """Trace.first_run of the job reads rank 0's rows alone, each table as a Trace of rank 0's directory does, and
    holds its own copy of every table and view of the Trace."""
    from reports.sql import tables
    from reports.sql.engine import Trace

    every, alone = Trace(job), Trace(job / "rank=0")
    one = every.first_run()
    assert list(one.runs) == ["m/rank=0"] and one.ranks == [0] and not one.several and one.narrow == narrow
    assert tables.ops(one) == tables.ops(alone) == 14 and tables.ops(every, 1) == 160
    for table in (tables.by_op, tables.by_step, tables.peak, tables.views, reports.by_module, tables.phase_flops):
        got, want = table(one), table(alone)
        if isinstance(got, dict):
            assert got == want
        else:
            pd.testing.assert_frame_equal(
                got.drop(columns=["run"], errors="ignore"), want.drop(columns=["run"], errors="ignore")
            )
    # every table and view of the Trace has its own in first_run: no query of run 0 falls back to every run's. The
    # views of the .sql files are made when first read (Trace.need): none read yet is made in either schema, then
    # every one is read through both
    # (the Trace's catalogue: its own in the database the process shares, reports.sql.database)
    names = (
        "SELECT {} FROM duckdb_{}() WHERE NOT internal AND database_name = current_database() AND schema_name = '{}'"
    )
    made = {n for (n,) in one.db.execute(names.format("view_name", "views", "first_run")).fetchall()}
    assert "compare_by_op" not in made and "by_op" in made  # read above (tables.by_op), compare's not
    every_view = " ".join(name for name, _ in every._views)
    every.need(every_view)
    one.need(every_view)
    main = {
        n
        for kind, col in (("tables", "table_name"), ("views", "view_name"))
        for (n,) in one.db.execute(names.format(col, kind, "main")).fetchall()
    }
    first = {
        n
        for kind, col in (("tables", "table_name"), ("views", "view_name"))
        for (n,) in one.db.execute(names.format(col, kind, "first_run")).fetchall()
    }
    assert main == first and {"rows", "_src", "_ops", "_steps", "by_op"} <= main and ("_rows" in main) == narrow


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("order", [("null", "swapped"), ("swapped", "null")])
def test_null_lists_flagged_by_the_grouping_scan_are_refused_in_the_references_order(
    parts, tmp_path, monkeypatch, narrow, order
):
    """The SQL engine finds null list cells and items as it reads each run's parts once (reports/sql/rowpass.py; a
    trace read once into memory: as the _ops grouping reads the list columns). A run with a null id item and a run
    whose parts are out of seq order are refused with the first run's line, as reports.load refuses them (read once
    into memory: the null item is found by a scan of that run alone when a later run fails a check before the
    grouping is made)."""
    import reports
    from reports.errors import ReportError
    from reports.sql import engine
    from reports.sql.engine import Trace
    from tests.reports.sql.test_sql import swapped

    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    null = shutil.copytree(parts, tmp_path / "null")
    rewrite(part_paths(null)[0], set_cell("input_storage_ids", 3, [None]))
    runs = {"null": null, "swapped": swapped(parts, tmp_path / "swapped")}
    paths = [runs[name] for name in order]
    with pytest.raises(ReportError) as ref:
        reports.load(paths)
    with pytest.raises(ReportError) as mine:
        Trace(paths)
    assert str(mine.value) == str(ref.value)
    assert (
        str(mine.value)
        == {
            "null": f"{null}: column 'input_storage_ids' holds a null item at seq 3; expected int64 items",
            "swapped": f"{runs['swapped']}: seq 0 follows seq 63; expected seq to increase row by "
            "row (a part or rows repeated?)",
        }[order[0]]
    )


def test_a_null_item_alone_is_found_without_a_scan_of_its_own(parts, tmp_path, monkeypatch):
    """A trace whose only damage is a null id item: refused from the read of its parts that checks them
    (Trace._null_lists, a scan of the list columns of its own, is not run), with the reference loader's line; the
    same trace undamaged opens."""
    import reports
    from reports.errors import ReportError
    from reports.sql.engine import Trace

    def no_scan(self, i):
        raise AssertionError("a scan of the list columns of its own")

    monkeypatch.setattr(Trace, "_null_lists", no_scan)
    assert Trace(parts).totals["ops"].tolist() == [len(reports.load(parts))]
    null = shutil.copytree(parts, tmp_path / "null")
    rewrite(part_paths(null)[1], set_cell("output_storage_ids", 2, [None]))
    with pytest.raises(ReportError, match=r"column 'output_storage_ids' holds a null item at seq 34; expected int64"):
        Trace(null)


@pytest.mark.parametrize("part", [0, 1])
def test_a_part_whose_pages_cannot_be_read_gets_the_reference_loaders_line(parts, tmp_path, part):
    """A part with a sound footer and a corrupt page: the SQL engine's read of the parts fails on it, and the
    reference loader names it, as reports.load does (a DuckDB traceback before)."""
    import reports
    from reports.errors import ReportError
    from reports.sql.engine import Trace

    bad = shutil.copytree(parts, tmp_path / "bad")
    path = part_paths(bad)[part]
    data = bytearray(path.read_bytes() if hasattr(path, "read_bytes") else open(path, "rb").read())
    data[200:600] = bytes((b * 7 + 13) % 256 for b in data[200:600])  # inside the first column chunks
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(ReportError) as ref:
        reports.load(bad)
    with pytest.raises(ReportError) as mine:
        Trace(bad)
    assert str(mine.value) == str(ref.value) and "not a readable Parquet trace" in str(mine.value)


def test_duckdb_spills_under_the_system_temporary_directory_never_the_working_one(trace, tmp_path, monkeypatch):
    """DuckDB's default spill directory is `.tmp` in the working directory: a report past its memory limit would
    write there. The Trace gives it a directory of its own under the system's temporary directory instead."""
    import tempfile

    from reports.sql import database
    from reports.sql.engine import Trace

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(database, "_SHARED", None)  # alone in the database the process shares (reports.sql.database)
    with Trace(trace) as opened:
        spill = opened.db.execute("SELECT current_setting('temp_directory')").fetchone()[0]
        assert os.path.dirname(spill) == tempfile.gettempdir()
        assert os.path.basename(spill).startswith("optrace-duckdb-")
        opened.db.execute("SET memory_limit = '32MB'")  # force a spill: a 3M-row table (about 48 MB) does not fit
        opened.db.execute("SET threads = 1")
        opened.db.execute("CREATE TEMP TABLE big AS SELECT range AS a, range * 2 AS b FROM range(3000000)")
        assert os.listdir(spill)  # spilled there
        assert opened.db.execute("SELECT sum(b) FROM big").fetchone()[0] == 3_000_000 * 2_999_999  # 2 * n(n-1)/2
    assert not os.path.exists(spill)
    assert not os.path.exists(tmp_path / ".tmp")
