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
    peak from tables made of them (reports/sql/kept_views.py), its _steps grain from the groups Steps kept, and
    flop_rest by flops.sql (reports/sql/flop_rows.py holds it): every view still holds what its definition holds, and
    _steps what the grain's scan makes (types and rows). A trace of several runs (the job) keeps no view or grain."""
    from reports.memory.row_scan import Scan
    from reports.sql.flop_rows import FlopRows
    from reports.sql.kept_ops import Ops
    from reports.sql.kept_views import ModuleOwn, Peak, Steps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sql, scanned = Trace(traces[trace], keep=(FlopRows, Scan, ModuleOwn, Peak, Steps, Ops)), Trace(traces[trace])
        flop_rows = Trace(traces[trace], keep=(FlopRows,))  # its _ops grain scanned, without flop_rest's keys
    reference = _reference(sql)
    for name in VIEWS:
        assert _rows(sql.db, name) == _rows(reference, name), name
    assert _rows(sql.db, "_steps") == _rows(scanned.db, "_steps")
    assert _rows(sql.db, "_ops") == _rows(flop_rows.db, "_ops")
    own = "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"  # (reports.sql.database)
    tables = {name for (name,) in sql.db.execute(own).fetchall()}
    kept = {"_kept_module_own", "_kept_peak", "_kept_steps_0", "_kept_ops_0"}
    assert kept <= tables if trace != "job" else not tables & kept
    assert not sql.kept.keys() & {(Steps, 0), (Ops, 0)}  # taken as the grains were made


def test_the_ops_grain_with_flop_rests_keys_is_scanned(traces):
    """A run whose FLOP rows were not kept has flop_rest summed from the _ops grain's extra keys, which Ops does not
    make: the grain is the scan's, and flop_rest still holds its definition's rows."""
    from reports.sql.kept_ops import Ops

    sql = Trace(traces["gpt"], keep=(Ops,))
    own = "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
    assert "_kept_ops_0" not in {name for (name,) in sql.db.execute(own).fetchall()}
    assert _rows(sql.db, "flop_rest") == _rows(_reference(sql), "flop_rest")


def test_a_trace_of_several_runs_keeps_its_steps_grain_only_when_every_run_is_kept(traces):
    """The job (2 runs, its ranks): Trace(every_run=True), as compare opens traces, makes _steps of every run's kept groups
    (without flop_steps' columns, as grains(several) makes it), equal to the scan's; the report's Trace (run 0's
    consumers alone) keeps no Steps and scans the grain."""
    from reports.sql.kept_ops import Ops
    from reports.sql.kept_views import Steps

    own = "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        every, first, scanned = (
            Trace(traces["job"], keep=(Steps, Ops), every_run=True),
            Trace(traces["job"], keep=(Steps, Ops)),
            Trace(traces["job"]),
        )
    assert len(every.runs) == 2
    made = {"_kept_steps_0", "_kept_steps_1", "_kept_ops_0", "_kept_ops_1"}
    assert made <= {name for (name,) in every.db.execute(own).fetchall()}
    assert not {name for (name,) in first.db.execute(own).fetchall()} & made and not first.kept
    for sql in (every, first):
        for name in ("_steps", "by_step", "_ops", "op_facts", "collective_totals", "compare_by_op"):
            assert _rows(sql.db, name) == _rows(scanned.db, name), name


def test_compares_views_but_by_module_read_no_part(traces):
    """compare_by_phase, compare_by_op, compare_recompute and compare_dtypes are read from the grains (scan.VIEWS: the
    test above checks them against compare.sql): their plans read no Parquet file; compare_by_module, keyed by module,
    scans the parts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sql = Trace([traces["gpt"], traces["cut"]])

    def reads_parts(view):
        return (
            "READ_PARQUET"
            in " ".join(str(row[1]) for row in sql.db.execute(f"EXPLAIN SELECT * FROM {view}").fetchall()).upper()
        )

    assert [reads_parts(v) for v in ("compare_by_phase", "compare_by_op", "compare_recompute", "compare_dtypes")] == [
        False
    ] * 4
    assert reads_parts("compare_by_module")


def test_the_kept_steps_sum_exactly_and_give_way_past_int64():
    """kept_views.Steps: a step and phase whose rows span parts sums them exactly in 32-bit halves (negative values
    too), null recompute counting as not recomputed; a sum past int64 gives None (the grain is then scanned)."""
    import pyarrow as pa

    from reports.sql.kept_views import Steps

    def part(seq, step, phase, flops, recompute):
        n = len(seq)
        return pa.table(
            {
                "seq": pa.array(seq, pa.int64()),
                "step": pa.array(step, pa.int64()),
                "phase": pa.array(phase, pa.string()).dictionary_encode(),
                "flops": pa.array(flops, pa.int64()),
                "bytes_allocated": pa.array([-3] * n, pa.int64()),
                "duration_ns": pa.array([7] * n, pa.int64()),
                "live_bytes": pa.array(seq, pa.int64()),
                "recompute": pa.array(recompute, pa.bool_()),
            }
        )

    steps = Steps()
    big = 2**62
    steps.feed(part([0, 1, 2], [0, 0, 0], ["forward", "forward", "backward"], [big, 5, 1], [None, False, True]))
    steps.feed(part([3, 4], [0, 1], ["forward", "forward"], [big - 6, 2], [None, None]))
    got = steps.table().to_pydict()
    # by step, then phase in order of first appearance (forward, then backward)
    assert got["step"] == [0, 0, 1] and got["phase"] == ["forward", "backward", "forward"]
    assert got["ops"] == [3, 1, 1]
    assert got["flops"] == [2**63 - 1, 1, 2]  # big + 5 + big - 6 = 2**63 - 1, int64's largest
    assert got["bytes_allocated"] == [-9, -3, -3] and got["duration_ns"] == [21, 7, 7]  # 3 * -3, 3 * 7
    assert got["live_bytes_peak"] == [3, 2, 4] and got["last_seq"] == [3, 2, 4]
    assert got["recompute"] == [False, True, False]
    assert got["recompute_flops"] == [0, 1, 0] and got["recompute_ops"] == [0, 1, 0]  # the backward row of seq 2
    assert got["first_seq"] == [0, 2, 4]
    past = Steps()
    past.feed(part([0, 1], [0, 0], ["forward", "forward"], [big, big], [None, None]))  # 2**63: past int64
    assert past.table() is None


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


def _ops_part(rows):
    """A part of Ops' columns from rows of (seq, op, phase, kind, is_view, input dtypes, output dtypes, flops, bound,
    read, written, allocated, duration, busy, comm, live, group, size)."""
    import pyarrow as pa

    from reports.sql.kept_ops import Ops

    types = [pa.int64(), pa.string(), pa.string(), pa.string(), pa.bool_(), pa.list_(pa.string())]
    types += [pa.list_(pa.string()), pa.int64(), pa.bool_(), *[pa.int64()] * 7, pa.string(), pa.int64()]
    return pa.table({c: pa.array([r[i] for r in rows], t) for i, (c, t) in enumerate(zip(Ops.columns, types))})


_OPS_PARTS = [
    [
        (0, "aten.mm", "forward", "matmul", False, ["float32"], ["float32"], 10, True, 4, 6, 8, 5, None, None, 100)
        + (None, None),
        # a view moves no bytes; an empty first input dtype: the output's
        (1, "aten.view", "forward", "none", True, [""], ["float16"], 0, False, 3, 3, 0, 2, 1, None, 90, None, None),
        # no dtype at all: ''
        (2, "c10d.all_reduce", "backward", "collective", False, [], [], 7, False, 1, 1, 0, 9, None, 64, 90)
        + ("default", 2),
    ],
    [
        (3, "aten.mm", "forward", "matmul", False, ["float32"], ["float32"], 10, False, 4, 6, 2, 3, 2, None, 50)
        + (None, None),
        # a null first input dtype: the output's
        (4, "c10d.all_reduce", "backward", "collective", False, [None], ["bfloat16"], 7, None, 1, 1, 0, 9, None)
        + (None, 40, "default", 2),
    ],
]


@pytest.mark.parametrize("collide", [False, True])  # every hash equal: grouped by the keys themselves
def test_the_kept_ops_grain_sums_exactly_across_parts(collide, monkeypatch):
    """kept_ops.Ops: the _ops grain's groups of rows spread over parts, each sum and extreme as the grain's SQL makes
    it (time_ns coalesce(busy_ns, duration_ns); message_bytes and comm_first_seq NULL without comm_bytes)."""
    import numpy as np

    from reports.sql import kept_ops

    if collide:
        monkeypatch.setattr(kept_ops, "_MIX", np.uint64(0))
    ops = kept_ops.Ops()
    for rows in _OPS_PARTS:
        ops.feed(_ops_part(rows))
    got = ops.table().sort_by("first_seq").to_pydict()
    assert got["op"] == ["aten.mm", "aten.view", "c10d.all_reduce", "c10d.all_reduce"]
    assert got["dtype"] == ["float32", "float16", "", "bfloat16"]
    assert got["ops"] == [2, 1, 1, 1] and got["first_seq"] == [0, 1, 2, 4]
    assert got["bytes"] == [10, 0, 0, 0]  # 4 + 6; a view and a collective: 0 (the roofline's bytes)
    assert got["flops_sum"] == [20, 0, 7, 7] and got["bytes_sum"] == [20, 0, 0, 0]  # 2 * 10, 2 * 10
    assert got["bound_flops"] == [10, 0, 0, 0] and got["bound_rows"] == [1, 0, 0, 0]  # a null bound: not bound
    assert got["bytes_allocated"] == [10, 0, 0, 0] and got["duration_ns"] == [8, 2, 9, 9]  # 8 + 2, 5 + 3
    assert got["bytes_read"] == [8, 3, 1, 1] and got["bytes_written"] == [12, 3, 1, 1]
    assert got["time_ns"] == [7, 1, 9, 9]  # duration 5 (no busy) + busy 2; busy 1; durations 9
    assert got["calls"] == [0, 0, 1, 0] and got["message_bytes"] == [None, None, 64, None]
    assert got["comm_first_seq"] == [None, None, 2, None]
    assert got["process_group"] == [None, None, "default", "default"] and got["group_size"] == [None, None, 2, 2]
    assert got["bytes_allocated_max"] == [8, 0, 0, 0] and got["live_bytes_max"] == [100, 90, 90, 40]


def test_the_kept_ops_grain_gives_way_to_the_scan():
    """kept_ops.Ops gives None (the grain is scanned) for a sum past int64 and for a null it does not group."""
    from reports.sql.kept_ops import Ops

    big = 2**62
    past = Ops()
    for seq in (0, 1):  # 2 * 2**62 bytes allocated: 2**63, past int64
        past.feed(_ops_part([(seq, "aten.mm", "forward", "matmul", False, [], [], 1, False, 0, 0, big, 1, 1, None, 1)
                             + (None, None)]))  # fmt: skip
    assert past.table() is None
    null = Ops()
    null.feed(_ops_part([(0, "aten.mm", "forward", "matmul", False, [], [], 1, False, None, 0, 0, 1, 1, None, 1)
                         + (None, None)]))  # fmt: skip
    assert null.table() is None


_EDGES = (0, 1, -1, 2**31, 2**32 - 1, 2**32, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63))


def _random_ops_part(r, seq, rows, edges):
    """A part of Ops' columns with `rows` random rows from seq `seq` (random.Random `r`): an op named '', null, empty
    and null-item dtype lists, null bounds, busy_ns, comm_bytes, groups and sizes; with `edges`, int64's edges and
    negative values (none the tracer writes: the Trace's checks refuse them, Ops must still equal the grain's SQL);
    half the parts' string columns dictionary-encoded, each part's dictionary its own."""
    import pyarrow as pa

    def value():
        return r.choice(_EDGES) if edges else r.randrange(-3, 60)

    lists = (None, [], [None], [""], ["float32"], ["", "bfloat16"], [None, "float16"])
    made = []
    for k in range(rows):
        row = (seq + k, r.choice(["", "aten.mm", "aten.add"]), r.choice(["forward", "backward"]))
        row += (r.choice(["none", "matmul"]), r.random() < 0.3, r.choice(lists), r.choice(lists))
        row += (r.choice([0, 10, value()]), r.choice([None, True, False]), value(), value(), value(), value())
        row += (r.choice([None, value()]), r.choice([None, value()]), value(), r.choice([None, "default", ""]))
        made.append(row + (r.choice([None, 2, 0]),))
    part = _ops_part(made)
    if r.random() < 0.5:
        for c in ("op", "phase", "flop_kind", "process_group", "input_dtypes", "output_dtypes"):
            plain = part.column(c).combine_chunks()
            coded = (
                plain.dictionary_encode()
                if not pa.types.is_list(plain.type)
                else pa.ListArray.from_arrays(plain.offsets, plain.values.dictionary_encode(), mask=plain.is_null())
            )
            part = part.set_column(part.schema.get_field_index(c), c, coded)
    return part


def _values(table):
    """The rows of `table`, sorted, DuckDB's HUGEINT sums (Decimal in Arrow) as int."""
    from decimal import Decimal

    rows = [tuple(int(v) if isinstance(v, Decimal) else v for v in row.values()) for row in table.to_pylist()]
    return sorted(rows, key=repr)


@pytest.mark.parametrize("edges", [False, True])
def test_the_kept_ops_grain_equals_the_grains_sql_on_random_parts(edges):
    """kept_ops.Ops against reports.sql.scan's _ops grain (without flop_rest's keys) over the same rows, on 40 seeded
    runs of 1 to 3 parts: the same groups, sums and extremes wherever Ops makes a table; where it gives way (None), the
    scan's grain is made instead, so only a table it made is compared. With int64's edges DuckDB's addition of
    bytes_read and bytes_written raises on some runs: Ops must give way there (a grain made where the scan raises is
    a figure made from an overflow)."""
    import random

    import pyarrow as pa

    from reports.sql.kept_ops import Ops
    from reports.sql.scan import _DTYPE, _ops_grain

    made = 0
    for seed in range(40):
        r = random.Random(seed)
        parts, seq = [], 0
        for _ in range(r.randrange(1, 4)):
            rows = r.randrange(1, 8)
            parts.append(_random_ops_part(r, seq, rows, edges))
            seq += rows
        ops = Ops()
        for part in parts:
            ops.feed(part)
        got = ops.table()
        db = duckdb.connect()
        plain = [p.cast(_ops_part([]).schema) for p in parts]  # the rows as the files hold them
        db.register("_rows", pa.concat_tables(plain))
        db.execute(f"CREATE TABLE _src AS SELECT 'r' AS run, 0 AS run_index, *, {_DTYPE} AS dtype FROM _rows")
        try:
            want = db.sql(_ops_grain(False, null_lists=False)).to_arrow_table()
        except duckdb.Error:
            assert got is None, seed  # DuckDB's addition raised: no grain made of the wrapped sum
            continue
        if got is None:
            continue
        made += 1
        names = [c for c in want.column_names if c not in ("run", "run_index", "null_lists")]
        assert _values(got.select(names)) == _values(want.select(names)), seed
    assert made >= (15 if edges else 40)  # the comparison ran: every small-valued run, most of the edges' runs


@pytest.mark.parametrize("edges", [False, True])
def test_the_kept_steps_grain_equals_the_grains_sql_on_random_parts(edges):
    """kept_views.Steps against reports.sql.scan's _steps grain over the same rows, on 40 seeded runs of 1 to 3 parts
    whose steps go back and repeat (a step and phase split over parts and runs of rows), phase '' among them, null
    recompute flags, half the parts' phases dictionary-encoded; with int64's edges and negative values: equal wherever
    Steps makes a table (None: a sum past int64, the scan's grain then)."""
    import random

    import pyarrow as pa

    from reports.sql.kept_views import Steps
    from reports.sql.scan import _steps_grain

    kinds = {"seq": pa.int64(), "step": pa.int64(), "phase": pa.string(), "flops": pa.int64()}
    kinds.update({c: pa.int64() for c in ("bytes_allocated", "duration_ns", "live_bytes")}, recompute=pa.bool_())
    made = 0
    for seed in range(40):
        r = random.Random(seed)
        value = (lambda: r.choice(_EDGES)) if edges else (lambda: r.randrange(-5, 50))
        parts, seq, step = [], 0, 0
        for _ in range(r.randrange(1, 4)):
            rows = []
            for k in range(r.randrange(1, 9)):
                step += r.choice([0, 0, 1, -1, 5])
                rows.append((seq + k, step, r.choice(["forward", "backward", ""]), value(), value(), value(), value()))
                rows[-1] += (r.choice([None, True, False]),)
            seq += len(rows)
            part = pa.table({c: pa.array([row[j] for row in rows], t) for j, (c, t) in enumerate(kinds.items())})
            if r.random() < 0.5:
                part = part.set_column(2, "phase", part.column("phase").combine_chunks().dictionary_encode())
            parts.append(part)
        steps = Steps()
        for part in parts:
            steps.feed(part)
        got = steps.table()
        if got is None:
            continue
        db = duckdb.connect()
        db.register("_rows", pa.concat_tables([p.cast(pa.schema(kinds)) for p in parts]))
        db.execute("CREATE TABLE _src AS SELECT 'r' AS run, 0 AS run_index, * FROM _rows")
        want = db.sql(_steps_grain(True)).to_arrow_table()
        names = [c for c in want.column_names if c not in ("run", "run_index")]
        assert _values(got.select(names)) == _values(want.select(names)), seed
        made += 1
    assert made >= (10 if edges else 40)  # the comparison ran
