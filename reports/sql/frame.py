"""The library API's rows as a reports.sql.engine.Trace held in memory: `reports.by_op(df)` runs the view `optrace
report` runs over the trace's files (views.sql, made from the grains of reports.sql.scan) over the rows of `df`.

    with memory_trace(df, "by_op", ["op", "flops", ...]) as trace:
        table = reports.sql.tables.by_op(trace)

`rows`: a DataFrame `reports.load` returned (list columns as objects or Arrow), or a pyarrow Table of trace columns
(one run unless it has a `run` column). Only the columns a table reads are handed to DuckDB (`columns`; the others
read as NULL), each cast to tracer.schema's type; a frame without `seq` has its row numbers as seq, so "in order of
first appearance" keeps meaning the frame's order.
"""

import json
from contextlib import contextmanager

import numpy as np
import pyarrow as pa

from reports.errors import ReportError
from reports.loading.load import kept_runs, require
from tracer.schema import ARROW_SCHEMA, METADATA_KEY

__all__ = ["memory_trace", "run_names", "trace_of"]

_TYPES = {f.name: f.type for f in ARROW_SCHEMA}


def run_names(df):
    """The runs of a loaded trace in load order, but for those a filter emptied (reports.loading.load.kept_runs)."""
    import pandas as pd  # a DataFrame's: pandas is loaded

    col = df["run"]
    runs = df.attrs.get("runs")
    if not runs:
        return list(col.cat.categories) if isinstance(col.dtype, pd.CategoricalDtype) else list(pd.unique(col))
    return list(kept_runs(df, runs))


@contextmanager
def trace_of(rows, what, required, columns=()):
    """`rows` as a Trace for one table: a Trace as it is (the CLI's, left open), else memory_trace's, closed after."""
    from reports.sql.engine import Trace

    if isinstance(rows, Trace):
        yield rows
        return
    trace = memory_trace(rows, what, required, columns)
    try:
        yield trace
    finally:
        trace.close()


def memory_trace(rows, what, required, columns=(), grains=False):
    """A Trace over `rows` holding `required` and `columns` (those of them `rows` has); ReportError naming the
    `required` columns `rows` lacks, for table `what`, in reports.load's words. `grains`: as Trace.over takes it."""
    from reports.sql.engine import Trace

    if isinstance(rows, pa.Table):
        return _of_arrow(rows, what, required, columns, grains)
    import pandas as pd  # a DataFrame's: pandas is loaded

    require(rows, ["run", *required], what)
    names = run_names(rows)
    meta = rows.attrs.get("runs") or {}
    wanted = [c for c in dict.fromkeys([*required, *columns, "seq"]) if c in rows.columns and c in _TYPES]
    data = {c: _column(rows[c], _TYPES[c]) for c in wanted}
    if "seq" not in data:
        data["seq"] = pa.array(np.arange(len(rows), dtype=np.int64))
    at = {name: i for i, name in enumerate(names)}
    run = rows["run"]
    if isinstance(run.dtype, pd.CategoricalDtype):  # reports.load's: by its codes, no string per row
        codes = np.array([at.get(c, -1) for c in run.cat.categories] + [-1], dtype=np.int32)
        data["run_index"] = pa.array(codes[run.cat.codes.to_numpy()], pa.int32())
    else:
        data["run_index"] = pa.array(run.astype(object).map(at).to_numpy(dtype=np.int32), pa.int32())
    ranks = [(meta.get(n) or {}).get("rank") for n in names]
    if "rank" in rows.columns and len(rows):  # a distributed trace's: each run's rank (its directory's)
        found = dict(zip(rows["run"].astype(object), rows["rank"]))
        ranks = [int(found[n]) if n in found else r for n, r in zip(names, ranks)]
    return Trace.over(pa.table(data), {n: meta.get(n) or {} for n in names}, ranks, grains=grains)


def _of_arrow(table, what, required, columns, grains):
    from reports.sql.engine import Trace

    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ReportError(f"{what}: the trace lacks column(s) {missing}; load it with them")
    if "run" in table.column_names:
        names = list(dict.fromkeys(table.column("run").to_pylist()))
        at = {name: i for i, name in enumerate(names)}
        index = pa.array([at[r] for r in table.column("run").to_pylist()], pa.int32())
    else:
        names, index = [""], pa.array(np.zeros(table.num_rows, dtype=np.int32))
    wanted = [c for c in dict.fromkeys([*required, *columns, "seq"]) if c in table.column_names and c in _TYPES]
    data = {c: table.column(c) for c in wanted}
    if "seq" not in data:
        data["seq"] = pa.array(np.arange(table.num_rows, dtype=np.int64))
    data["run_index"] = index
    meta = _schema_metadata(table) if len(names) == 1 else {}
    return Trace.over(pa.table(data), {n: meta for n in names}, grains=grains)


def _schema_metadata(table):
    """The root module a table of one run names in the run metadata of its schema (tracer.schema.read_part's), as
    {"root_module": name}, else {}: by_module hangs the tree on it. Nothing else of it: a part's storage roles are
    only that part's, where reports.load merges them over all parts."""
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    root = meta.get("root_module") if isinstance(meta, dict) else None
    return {"root_module": root} if isinstance(root, str) else {}


def _column(series, typ):
    """A frame's column as Arrow: an Arrow-backed one as it is, a list column of Python objects as lists of `typ`'s
    items, the others as pyarrow converts them (a categorical as a dictionary); `rows` casts each to `typ`."""
    import pandas as pd

    if isinstance(series.dtype, pd.ArrowDtype):
        return series.array.__arrow_array__()
    if pa.types.is_list(typ):
        item = typ.value_type.value_type if pa.types.is_dictionary(typ.value_type) else typ.value_type
        return pa.array(series.to_numpy(dtype=object), type=pa.list_(item), from_pandas=True)
    return pa.Array.from_pandas(series)
