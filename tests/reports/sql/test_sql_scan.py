"""The SQL engine's views read from its one-scan grains (reports/sql/scan.py) hold exactly what views.sql's
definitions over `rows` hold: same columns, same DuckDB types, same rows (every value, floats too: the sums
are integer sums), on the traces of tests/reports/sql/test_sql.py. And the seq check's scan finds seq in order where it is."""

import warnings

import duckdb
import pytest

from reports.sql import engine
from reports.sql.engine import VIEW_FILES, Trace, statements
from reports.sql.scan import VIEWS
from tests.reports.sql.test_sql import swapped


def _reference(trace):
    """A connection holding `rows` of the same files and every view as the .sql files write it."""
    db = duckdb.connect()
    db.execute(trace.rows_view)
    for name, body, _ in (v for path in VIEW_FILES for v in statements(path)):
        db.execute(f"CREATE VIEW {name} AS {body}")
    return db


def _rows(db, name):
    types = [(c[0], c[1]) for c in db.execute(f"DESCRIBE SELECT * FROM {name}").fetchall()]
    rows = db.execute(f"SELECT * FROM {name}").fetchall()
    return types, sorted(rows, key=repr)


@pytest.mark.parametrize("narrow", [False, True])  # the grains read from the files, or from the rows read once
@pytest.mark.parametrize("trace", ["gpt", "cut", "job", "damaged"])
def test_each_view_from_the_grains_equals_its_definition(traces, trace, narrow, monkeypatch):
    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    monkeypatch.setattr(engine, "BATCH", 2)  # several statements per run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sql = Trace(traces[trace])
    assert sql.narrow == narrow
    reference = _reference(sql)
    for name in VIEWS:
        types, rows = _rows(sql.db, name)
        assert rows or (name == "collective_totals" and trace != "job"), name  # only the job has collectives
        assert (types, rows) == _rows(reference, name), name
    assert VIEWS.keys() <= {name for path in VIEW_FILES for name, _, _ in statements(path)}  # no new names


@pytest.mark.parametrize("trace", ["gpt", "cut", "job", "damaged"])
def test_each_view_of_a_trace_that_kept_its_rows_equals_its_definition(traces, trace):
    """A Trace that kept run 0's rows from its read of the parts, as `optrace report` opens one, reads module_own and
    peak from tables made of them (reports/sql/kept_views.py) and flop_rest by flops.sql (reports/sql/flop_rows.py
    holds it): every view still holds what its definition holds. A trace of several runs (the job) keeps no view."""
    from reports.memory.row_scan import Scan
    from reports.sql.flop_rows import FlopRows
    from reports.sql.kept_views import ModuleOwn, Peak

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sql = Trace(traces[trace], keep=(FlopRows, Scan, ModuleOwn, Peak))
    reference = _reference(sql)
    for name in VIEWS:
        assert _rows(sql.db, name) == _rows(reference, name), name
    own = "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"  # (reports.sql.database)
    tables = {name for (name,) in sql.db.execute(own).fetchall()}
    assert {"_kept_module_own", "_kept_peak"} <= tables if trace != "job" else not tables & {"_kept_peak"}


@pytest.mark.parametrize("narrow", [False, True])
def test_the_seq_scan_finds_each_run_in_order(traces, narrow, monkeypatch):
    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sql = Trace([traces["gpt"], traces["cut"]])
    assert sql.narrow == narrow and [sql._seq_in_order(i) for i in range(2)] == [True, True]


def test_a_part_out_of_order_read_once_gets_the_reference_loaders_line(traces, tmp_path, monkeypatch):
    """The seq check of the rows read once: parts whose seq ranges are swapped fail it, as they fail reports.load."""
    import reports
    from reports.errors import ReportError

    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40))
    bad = swapped(traces["gpt"], tmp_path / "swapped")
    with pytest.raises(ReportError) as ref:
        reports.load(bad)
    with pytest.raises(ReportError) as mine:
        Trace(bad)
    assert str(mine.value) == str(ref.value) and "follows seq" in str(mine.value)


def test_a_trace_of_several_runs_groups_without_the_keys_only_the_flop_views_read(traces):
    """reports/sql/scan.py grains(several): the FLOP sections of a trace of several runs are run 0's, whose flop_rest
    and flop_steps read flops.sql's definitions over run 0's rows; the _ops and _steps grains of every run then leave
    out their keys. One run keeps them, and the two are read from the grains. Either way they hold what their
    definitions hold."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one, two = Trace(traces["gpt"]), Trace([traces["gpt"], traces["cut"]])
    columns = {t: {c[0] for c in t.db.execute("DESCRIBE _ops").fetchall()} for t in (one, two)}
    assert {"first_dtype", "recompute_flag", "scalar_operand", "first_step"} <= columns[one]
    assert not {"first_dtype", "recompute_flag", "scalar_operand", "first_step"} & columns[two]
    steps = {t: {c[0] for c in t.db.execute("DESCRIBE _steps").fetchall()} for t in (one, two)}
    assert {"last_seq", "recompute"} <= steps[one] and not {"last_seq", "recompute"} & steps[two]
    for sql in (one, two, two.first_run()):
        for view in ("flop_rest", "flop_steps"):
            assert _rows(sql.db, view) == _rows(_reference(sql), view), view
