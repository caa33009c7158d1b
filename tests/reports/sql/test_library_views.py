"""The library's roofline, roofline_split, comm_split, per_step_traffic and uncounted run the views of views.sql the
CLI runs (roofline_op, roofline_shape, roofline_module, roofline_groups, comm_split, collective_totals, uncounted),
over the user's DataFrame or Arrow table (reports.sql.frame), and return the tables their pandas implementations
returned (kept as oracles under tests/oracles): the same columns, dtypes, row order and values, to the last bit.
"""

import re
import warnings

import pandas as pd
import pyarrow as pa
import pytest

import reports
from reports.distributed.collectives import comm_split, per_step_traffic
from reports.flops.coverage import uncounted
from reports.output.source import Source
from reports.sql.engine import Trace
from reports.time.roofline import roofline, roofline_split
from tests.oracles import collectives as oracle_collectives
from tests.oracles import coverage as oracle_coverage
from tests.oracles import roofline as oracle_roofline

# name: (the library's function, its pandas oracle), each called with the frame alone
TABLES = {
    "roofline": (roofline, oracle_roofline.roofline),
    "roofline_shape": (lambda df: roofline(df, by="shape"), lambda df: oracle_roofline.roofline(df, by="shape")),
    "roofline_module": (lambda df: roofline(df, by="module"), lambda df: oracle_roofline.roofline(df, by="module")),
    "roofline_given_roofs": (
        lambda df: roofline(df, by="module", peak_flops=1e12, bandwidth=2e11),
        lambda df: oracle_roofline.roofline(df, by="module", peak_flops=1e12, bandwidth=2e11),
    ),
    "roofline_split": (roofline_split, oracle_roofline.roofline_split),
    "roofline_split_given_roofs": (
        lambda df: roofline_split(df, peak_flops=1e12, bandwidth=2e11),
        lambda df: oracle_roofline.roofline_split(df, peak_flops=1e12, bandwidth=2e11),
    ),
    "comm_split": (comm_split, oracle_collectives.comm_split),
    "per_step_traffic": (per_step_traffic, oracle_collectives.per_step_traffic),
    "uncounted": (uncounted, oracle_coverage.uncounted),
}


def _load(paths):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reports.load(paths)


def _trace(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Trace(path)


@pytest.mark.parametrize("trace", ["gpt", "cut", "job", "damaged", "several"])
@pytest.mark.parametrize("name", list(TABLES))
def test_each_table_equals_its_pandas_oracle(traces, trace, name):
    """Every column, dtype, row and value equal (check_exact): the views group and sum in integers, and the
    per-step figures and percentages are the same float64 operations in the same order."""
    df = _load([traces["gpt"], traces["cut"]] if trace == "several" else traces[trace])
    mine, oracle = TABLES[name]
    got, want = mine(df), oracle(df)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    if name in ("comm_split", "per_step_traffic") and trace == "job":
        assert len(got) and (got["rank"] == 1).any()  # the job's rank=1 run is named rank 1


class _Queries:
    """The views each Trace.sql or Trace.arrow query of a call reads (reports.sql.engine.Trace: where every table's
    query goes, as a DataFrame or as a pyarrow Table)."""

    def __init__(self, monkeypatch):
        self.seen = []
        for method in ("sql", "arrow"):
            monkeypatch.setattr(Trace, method, self._logged(getattr(Trace, method)))

    def _logged(self, run):
        def logged(trace, query):
            self.seen += re.findall(r"\bFROM\s+(\w+)", query)
            return run(trace, query)

        return logged

    def of(self, call):
        self.seen = []
        out = call()
        return out, set(self.seen)


def _frame(table):
    """A pyarrow Table Source gives (reports.output.source) as a DataFrame of its values, names as objects."""
    frame = table.to_pandas()
    return frame.astype({c: object for c in frame.columns if frame[c].dtype.kind not in "biuf"})


@pytest.mark.parametrize("trace", ["gpt", "job"])
def test_the_library_and_the_cli_run_the_same_view(traces, trace, monkeypatch):
    """reports.X(df) queries the views `optrace report` queries over the files (Source, the report's way to its
    tables; comm_split, which the report does not print, over a Trace of the files), and gets the CLI's table to the
    last bit; an Arrow table of the one run's rows gets the same table."""
    queries = _Queries(monkeypatch)
    df, sql = _load(traces[trace]), _trace(traces[trace])
    source = Source(sql)
    cli, cli_views = queries.of(source.roofline_with_split)
    library, library_views = queries.of(lambda: reports.time.roofline.roofline_with_split(df))
    assert library_views == cli_views == {"roofline_op", "roofline_groups"}
    cli = [_frame(table) for table in cli]  # Source's tables are pyarrow Tables: their values, column for column
    pd.testing.assert_frame_equal(library[0], cli[0], check_exact=True, check_dtype=False)
    pd.testing.assert_frame_equal(library[1], cli[1], check_exact=True, check_dtype=False)
    for name, view in (("roofline", "roofline_op"), ("roofline_split", "roofline_groups")):
        got, seen = queries.of(lambda: getattr(reports, name)(df))
        assert seen == {view}
        pd.testing.assert_frame_equal(got, cli[0 if name == "roofline" else 1], check_exact=True, check_dtype=False)

    first = list(df.attrs["runs"])[0]
    one = df[df["run"] == first]  # the report's tables are of its first run
    cli, cli_views = queries.of(source.uncounted)
    library, library_views = queries.of(lambda: reports.uncounted(one))
    assert library_views == cli_views == {"uncounted"}
    pd.testing.assert_frame_equal(library, _frame(cli), check_exact=True, check_dtype=False)

    cli, cli_views = queries.of(lambda: per_step_traffic(sql))  # the job section's (reports.distributed.sql_ranks)
    library, library_views = queries.of(lambda: per_step_traffic(df))
    assert library_views == cli_views == {"collective_totals"}
    pd.testing.assert_frame_equal(library, cli, check_exact=True)

    cli, cli_views = queries.of(lambda: comm_split(sql))
    library, library_views = queries.of(lambda: reports.comm_split(df))
    assert library_views == cli_views == {"comm_split"}
    pd.testing.assert_frame_equal(library, cli, check_exact=True)

    if trace != "gpt":
        return
    arrow = pa.Table.from_pandas(one.drop(columns=["run"]), preserve_index=False)  # one run: its rows' table
    roofs = {"peak_flops": 1e12, "bandwidth": 2e11}  # a table holds no run metadata: no device to take them from
    for name, function in (
        ("roofline", lambda rows: reports.roofline(rows, **roofs)),
        ("roofline_split", lambda rows: reports.roofline_split(rows, **roofs)),
        ("uncounted", reports.uncounted),
        ("comm_split", reports.comm_split),
        ("per_step_traffic", per_step_traffic),
    ):
        got, want = function(arrow), function(one)
        # an Arrow table without a run column is one run named "" (the frame of the job's rank 0 names both ranks)
        got, want = got.drop(columns=["run"], errors="ignore"), want.drop(columns=["run"], errors="ignore")
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)


def _rows(**columns):
    """A hand-made frame of one run "r" (the columns the roofline reads), its other columns as given."""
    n = len(next(iter(columns.values())))
    base = {
        "run": ["r"] * n,
        "step": [0] * n,
        "phase": ["forward"] * n,
        "bytes_read": [0] * n,
        "bytes_written": [0] * n,
        "busy_ns": [None] * n,
        "output_dtypes": [["float32"]] * n,
        "is_view": [False] * n,
    }
    df = pd.DataFrame({**base, **columns})
    df.attrs["runs"] = {"r": {}}  # as reports.load gives it (the oracle reads it): no device, so the roofs are given
    return df


def test_the_roofline_by_module_figures():
    """Each module gets its heaviest row's dtype and roof; a row without a module is in no group."""
    df = _rows(
        op=["aten.mm.default", "aten.add.Tensor", "aten.view.default", "aten.mm.default"],
        module=["m.a", "m.a", None, "m.b"],
        flops=[1000, 10, 0, 600],
        bytes_read=[100, 80, 64, 100],
        bytes_written=[50, 40, 0, 50],
        duration_ns=[2000, 1000, 500, 1000],
        input_dtypes=[["float32"], ["bfloat16"], ["float32"], ["bfloat16"]],
    )
    table = roofline(df, by="module", peak_flops=1e12, bandwidth=1e11)
    assert table["module"].tolist() == ["m.a", "m.b"]  # most time first
    # m.a: its mm (1000 FLOPs) outweighs its add (10): float32
    assert table["dtype"].tolist() == ["float32", "bfloat16"]
    assert table["flops_per_step"].tolist() == [1010.0, 600.0]  # 1000 + 10; 600
    assert table["bytes_per_step"].tolist() == [270.0, 150.0]  # 100 + 50 + 80 + 40; 100 + 50
    assert table["time_s_per_step"].tolist() == [3e-6, 1e-6]  # 2000 + 1000 ns; 1000 ns
    # 3 of 4 us (the view row has no module), in float64: 100 * 3e-6 / 4e-6
    assert table["time_pct"].tolist() == pytest.approx([75.0, 25.0], rel=1e-15)
    # ridge 1e12 / 1e11 = 10 FLOP/byte: m.a 1010 / 270 = 3.7 and m.b 600 / 150 = 4 are under it
    assert table["bound"].tolist() == ["memory", "memory"]
    pd.testing.assert_frame_equal(table, oracle_roofline.roofline(df, by="module", peak_flops=1e12, bandwidth=1e11))


def test_comm_split_figures():
    """Per step: the collectives' time (rows with comm_bytes) against the other ops'; NaN for a step of no time."""
    df = pd.DataFrame(
        {
            "run": ["r"] * 5,
            "rank": [3] * 5,
            "step": [0, 0, 0, 1, 2],
            "duration_ns": [3000, 1000, 1000, 2000, 0],
            "comm_bytes": [None, None, 4096, None, None],
        }
    )
    table = comm_split(df)
    assert table["rank"].tolist() == [3, 3, 3] and table["step"].tolist() == [0, 1, 2]
    assert table["compute_s"].tolist() == [4e-6, 2e-6, 0.0]  # 3000 + 1000 ns; 2000 ns
    assert table["comm_s"].tolist() == [1e-6, 0.0, 0.0]
    assert table["comm_bytes"].tolist() == [4096, 0, 0]
    assert table["comm_pct"].tolist()[:2] == [20.0, 0.0]  # 100 * 1 / (4 + 1)
    assert pd.isna(table["comm_pct"].iloc[2])  # 0 / 0
    pd.testing.assert_frame_equal(table, oracle_collectives.comm_split(df), check_exact=True)


def test_uncounted_adds_the_runs_up():
    """reports.uncounted takes a frame of several runs as one: a row without an op counts in the total only."""
    df = pd.DataFrame(
        {
            "run": ["a", "a", "b", "b"],
            "op": ["aten.topk.default", "aten.mm.default", "aten.topk.default", None],
            "flop_kind": ["unknown", "matmul", "unknown", "unknown"],
            "duration_ns": [300, 700, 100, 900],
        }
    )
    table = uncounted(df)
    assert table.to_dict("records") == [
        # 2 rows of topk, 300 + 100 ns of 2000 ns: 20%
        {"op": "aten.topk.default", "ops": 2, "duration_us": 0.4, "time_pct": 20.0}
    ]
    pd.testing.assert_frame_equal(table, oracle_coverage.uncounted(df), check_exact=True)
