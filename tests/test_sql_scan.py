"""The SQL engine's views read from its one-scan grains (reports/sql/scan.py) hold exactly what views.sql's
definitions over `rows` hold: same columns, same DuckDB types, same rows (every value, floats too: the sums
are integer sums), on the traces of tests/test_sql.py. And the seq check's scan finds seq in order where it is."""

import warnings

import duckdb
import pytest
from test_sql import swapped, traces  # noqa: F401  (the module's traces: the example GPT, a cut one, two ranks, damaged)

from reports.sql import engine
from reports.sql.engine import VIEW_FILES, Trace, statements
from reports.sql.scan import VIEWS


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
def test_each_view_from_the_grains_equals_its_definition(traces, trace, narrow, monkeypatch):  # noqa: F811
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


@pytest.mark.parametrize("narrow", [False, True])
def test_the_seq_scan_finds_each_run_in_order(traces, narrow, monkeypatch):  # noqa: F811
    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sql = Trace([traces["gpt"], traces["cut"]])
    assert sql.narrow == narrow and [sql._seq_in_order(i) for i in range(2)] == [True, True]


def test_a_part_out_of_order_read_once_gets_the_reference_loaders_line(traces, tmp_path, monkeypatch):  # noqa: F811
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
