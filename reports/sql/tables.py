"""The report tables from the SQL views: each function takes a reports.sql.engine.Trace (of the files, or of a
frame's rows: reports.sql.frame) and returns the DataFrame of the library function, column for column and dtype
for dtype (the library's by_op, by_phase, by_dtype, by_step, peak and views call these; their pandas versions are
test oracles under tests/oracles).

    library function                         here (a Trace)
    reports.by_phase, by_op, by_dtype,       by_phase, by_op, by_dtype, by_step
      by_step (reports.tables)
    reports.uncounted, coverage.bounds       uncounted, bounds
    reports.peak                             peak
    reports.views                            views
    reports.steps.count_steps, per_step   count_steps, phase_flops
    the report's top ops                     top_ops
    module rows of reports.by_module         module_own (reports.tables rolls the tree up)

The printed report reads the same views as pyarrow Tables or Python values, without pandas: top_ops_arrow,
uncounted_arrow, peak_rows, views_arrow (pandas is imported by the functions that return a DataFrame only).

Integer sums are exact (DuckDB sums int64 in 128 bits); a float sum (a percentage's parts,
per-step figures) can differ from pandas' in the last bit, as sums in another order do.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import empty_frame
from reports.arrays import arrow_of, numpy_of, scalar, strings, values_of

__all__ = [
    "bounds",
    "by_dtype",
    "by_op",
    "by_phase",
    "by_step",
    "count_steps",
    "kinds",
    "module_own",
    "modules_arrow",
    "ops",
    "peak",
    "phase_flops",
    "steps_traced",
    "top_ops",
    "top_ops_arrow",
    "uncounted",
    "uncounted_arrow",
    "peak_rows",
    "views",
    "views_arrow",
]

_SUMS = ("ops", "flops", "bytes_allocated", "bytes_read", "bytes_written")
_SUM_DTYPES = {
    "ops": "int64",
    "flops": "int64",
    "flops_pct": "float64",
    "bytes_allocated": "int64",
    "bytes_read": "int64",
    "bytes_written": "int64",
    "duration_us": "float64",
    "duration_pct": "float64",
}


def fetch(trace, view, order, sums=(), where=None):
    """A view's rows in `order` (SQL, after run_index), the `sums` cast as reports.tables gives them: int64,
    or float64 when an int64 sum could wrap (its values above int64 stay float64, as combine keeps them)."""
    query, wide = _query(trace, view, order, sums, where)
    frame = trace.sql(query)
    for c in wide:
        if not (frame[c].abs() >= 2.0**63).any():  # 2**63 - 1 is 2.0**63 in float64
            frame[c] = frame[c].astype("int64")
    return frame


def fetch_arrow(trace, view, order, sums=(), where=None):
    """fetch's rows as a pyarrow Table, the same types column for column."""
    query, wide = _query(trace, view, order, sums, where)
    table = trace.arrow(query)
    for c in wide:
        column = table.column(c)
        if not pc.any(
            pc.greater_equal(pc.abs(column), scalar(2.0**63, pa.float64()))
        ).as_py():  # 2**63 - 1 is 2.0**63 in float64
            table = table.set_column(table.schema.get_field_index(c), c, pc.cast(column, pa.int64()))
    return table


def _query(trace, view, order, sums, where):
    """(fetch's query, the sums cast to DOUBLE: an int64 sum of them could wrap)."""
    wide = {c for c in sums if any(trace.wide(_summed(c), i) for i in range(len(trace.runs)))}
    casts = ", ".join(f"CAST({c} AS {'DOUBLE' if c in wide else 'BIGINT'}) AS {c}" for c in sums)
    query = f"SELECT * {f'REPLACE ({casts})' if casts else ''} FROM {view}"
    query += f" WHERE {where}" if where else ""
    return query + f" ORDER BY run_index, {order}", wide


def _summed(column):
    """The trace column a table's sum adds up: flops for a part of them (matmul_flops, flops_forward, ...)."""
    return "flops" if column == "matmul_flops" or column.startswith("flops_") else column


def _shape(trace, frame, columns, dtypes):
    """The frame as reports.tables.combine shapes it: a `run` column first when there are several runs."""
    cols = (["run"] if trace.several else []) + list(columns)
    if not len(frame):
        return empty_frame({c: ({"run": object, **dtypes}).get(c, object) for c in cols})
    frame = frame.astype({"run": object})
    keep = {c: t for c, t in dtypes.items() if c in frame.columns and not (t == "int64" and frame[c].dtype.kind == "f")}
    return frame[cols].astype(keep).reset_index(drop=True)


def by_phase(trace):
    frame = fetch(trace, "by_phase", "phase_order, first_seq", _SUMS)
    return _shape(trace, frame, ["phase", *_SUM_DTYPES], {"phase": object, **_SUM_DTYPES})


def by_op(trace):
    frame = fetch(trace, "by_op", "flops DESC, duration_us DESC, first_seq", _SUMS)
    return _shape(trace, frame, ["op", "flop_kind", *_SUM_DTYPES], {"op": object, "flop_kind": object, **_SUM_DTYPES})


def by_dtype(trace):
    frame = fetch(trace, "by_dtype", "flops DESC, first_seq", (*_SUMS[1:], "matmul_flops"))
    columns = [
        "dtype",
        "ops",
        "flops",
        "flops_pct",
        "matmul_flops",
        "bytes_allocated",
        "bytes_read",
        "bytes_written",
        "duration_us",
        "duration_pct",
    ]
    return _shape(trace, frame, columns, {"dtype": object, "matmul_flops": "int64", **_SUM_DTYPES})


def by_step(trace):
    flops = ["flops", "flops_forward", "flops_backward", "flops_optimizer", "flops_other"]
    frame = fetch(trace, "by_step", "step", ("ops", *flops, "bytes_allocated"))
    columns = ["step", "ops", *flops, "bytes_allocated", "live_bytes_peak", "duration_us"]
    dtypes = {c: "int64" for c in columns}
    dtypes["duration_us"] = "float64"
    return _shape(trace, frame, columns, dtypes)


def module_own(trace):
    """{run_index: each module's own figures, indexed by module, in order of first appearance}."""
    frame = fetch(trace, "module_own", "first_seq", ("ops", "flops", "bytes_allocated"))
    runs = {int(i): t for i, t in frame.groupby("run_index", sort=False)}  # each run's rows in their order
    return {
        i: runs.get(i, frame.iloc[:0]).set_index("module")[
            ["ops", "flops", "bytes_allocated", "duration_us", "first_seq"]
        ]
        for i in range(len(trace.runs))
    }


def modules_arrow(trace, run_index=0):
    """reports.by_module of one run (a Trace's, its module_own view) as a pyarrow Table, typed as the library's
    DataFrame is: each int64 column int64 unless a value reaches 2**63 (then float64)."""
    from reports.sql.module_tree import MODULE_COLUMNS, OWN_COLUMNS, module_columns

    own = fetch_arrow(trace, "module_own", "first_seq", ("ops", "flops", "bytes_allocated"), f"run_index = {run_index}")
    figures = {c: values_of(own.column(c)) for c in OWN_COLUMNS}
    for c in ("flops", "bytes_allocated"):  # float64 where a sum could wrap, as pandas sums them
        figures[c] = figures[c].astype("float64" if trace.wide(c, run_index) else "int64")
    total = (trace.run_row(run_index) or {}).get("flops") or 0
    columns = module_columns(
        own.column("module").to_pylist(),
        figures,
        numpy_of(own.column("first_seq")),
        trace.runs[list(trace.runs)[run_index]].get("root_module"),
        float(total),
    )
    out = {}
    for c in MODULE_COLUMNS:
        v = columns[c]
        if c in ("module", "parent"):
            out[c] = strings(v)
        elif c in ("duration_us", "subtree_duration_us", "subtree_flops_pct") or (
            np.asarray(v).dtype.kind == "f" and bool((np.abs(v) >= 2.0**63).any())
        ):
            out[c] = arrow_of(np.asarray(v, dtype=np.float64))
        else:
            out[c] = arrow_of(np.asarray(v).astype(np.int64))
    return pa.table(out)


_UNCOUNTED = {"op": object, "ops": "int64", "duration_us": "float64", "time_pct": "float64"}


_UNCOUNTED_ARROW = pa.schema(
    [("op", pa.string()), ("ops", pa.int64()), ("duration_us", pa.float64()), ("time_pct", pa.float64())]
)


def _uncounted_query(run_index):
    return f"SELECT * FROM uncounted WHERE run_index = {run_index} ORDER BY time_pct DESC, ops DESC, op"


def uncounted(trace, run_index=0):
    """reports.uncounted of one run (the CLI's run)."""
    frame = trace.sql(_uncounted_query(run_index))
    if not len(frame):
        return empty_frame(_UNCOUNTED)
    return frame[list(_UNCOUNTED)].astype(_UNCOUNTED).reset_index(drop=True)


def uncounted_arrow(trace, run_index=0):
    """uncounted's rows as a pyarrow Table (op, ops, duration_us, time_pct)."""
    return _typed(trace.arrow(_uncounted_query(run_index)), _UNCOUNTED_ARROW)


def _typed(table, schema):
    """`table`'s columns of `schema`, each cast to its type there."""
    return pa.table([pc.cast(table.column(f.name), f.type) for f in schema], schema=schema)


def _run(trace, run_index):
    return trace.run_row(run_index)


def count_steps(trace, run_index=0):
    """reports.steps.count_steps: steps with forward or backward ops, else all steps; at least 1."""
    t = _run(trace, run_index)
    if t is None:
        return 1
    return max(1, int(t["fb_steps"] or t["steps_traced"]))


def steps_traced(trace, run_index=0):
    """Distinct step numbers of a run (df['step'].nunique())."""
    t = _run(trace, run_index)
    return 0 if t is None else int(t["steps_traced"])


def ops(trace, run_index=0):
    t = _run(trace, run_index)
    return 0 if t is None else int(t["ops"])


def phase_flops(trace, run_index=0):
    """FLOPs per step by phase and in total ({phase: figure}), as per_step(df, mask=phase == p) gives them."""
    totals = trace.arrow("SELECT * FROM phase_totals")
    steps = trace.phase_steps()[run_index]
    mine = {
        r["phase"]: r["flops"]
        for r in totals.select(["run_index", "phase", "flops"]).to_pylist()
        if r["run_index"] == run_index
    }
    out = {}
    for p in ("forward", "backward", "optimizer", "other"):
        out[p] = float(mine[p]) / steps[p] if p in mine else 0.0
    out["total"] = float(trace.per_step_arrow(totals, ["flops"])[run_index][1]["flops"][0])
    return out


def bounds(trace, run_index=0):
    """reports.coverage.bounds: per-step FLOPs of the rows whose count is a bound, and how many rows."""
    t = _run(trace, run_index)
    rows = 0 if t is None else int(t["bound_rows"])
    if not rows:
        return {"flops": 0, "rows": 0}
    totals = trace.arrow("SELECT * FROM phase_totals")
    flops = float(trace.per_step_arrow(totals, ["bound_flops"])[run_index][1]["bound_flops"][0])
    return {"flops": int(flops) if float(flops).is_integer() and abs(flops) < 2**53 else float(flops), "rows": rows}


def top_ops(trace, top, run_index=0):
    """The report's top ops: the `top` ops of by_op's order, their ops, FLOPs and bytes allocated per step."""
    frame = top_ops_arrow(trace, top, run_index).to_pandas()
    return frame.astype({"op": object})  # names as objects, as the library's tables hold them


def top_ops_arrow(trace, top, run_index=0):
    """top_ops as a pyarrow Table: op, ops_per_step, flops_per_step, flops_pct, bytes_allocated_per_step."""
    query, _ = _query(trace, "by_op", "flops DESC, duration_us DESC, first_seq", _SUMS, f"run_index = {run_index}")
    ops_table = trace.arrow(f"{query} LIMIT {int(top)}").select(["op", "flops_pct"])
    columns = ["ops", "flops", "bytes_allocated"]
    found, figures = trace.per_step_arrow(trace.arrow("SELECT * FROM op_phase_totals"), columns, keys=("op",))[
        run_index
    ]
    at = {key[0]: n for n, key in enumerate(found)}
    op = ops_table.column("op").to_pylist()

    def per_step(column):
        return arrow_of(np.asarray([float(figures[column][at[o]]) if o in at else np.nan for o in op], np.float64))

    return pa.table(
        {
            "op": strings(op),
            "ops_per_step": per_step("ops"),
            "flops_per_step": per_step("flops"),
            "flops_pct": pc.cast(ops_table.column("flops_pct"), pa.float64()),
            "bytes_allocated_per_step": per_step("bytes_allocated"),
        }
    )


PEAK_DTYPES = {  # reports.peak's columns and dtypes
    "run": "object",
    "peak_live_bytes": "int64",
    "seq": "int64",
    "step": "int64",
    "phase": "object",
    "module": "object",
    "op": "object",
}


def peak(trace):
    frame = trace.sql("SELECT * FROM peak ORDER BY run_index")
    if not len(frame):
        return empty_frame(PEAK_DTYPES)
    return frame[list(PEAK_DTYPES)].astype(PEAK_DTYPES).reset_index(drop=True)


def peak_rows(trace):
    """peak's rows as [{column: value}] (the report's: its first is the run's peak)."""
    return trace.arrow("SELECT * FROM peak ORDER BY run_index").select(list(PEAK_DTYPES)).to_pylist()


_VIEWS = {
    "run": "object",
    "kind": "object",
    "op": "object",
    "ops": "int64",
    "bytes_allocated": "int64",
    "bytes_written": "int64",
    "allocated_pct": "float64",
}


_VIEWS_ORDER = (
    "CASE WHEN kind = 'copy' THEN 1 ELSE 0 END, bytes_allocated DESC, bytes_written DESC, ops DESC, first_seq"
)


def views(trace):
    frame = fetch(trace, "views", _VIEWS_ORDER, ("ops", "bytes_allocated", "bytes_written"))
    if not len(frame):
        return empty_frame(_VIEWS)
    return frame[list(_VIEWS)].astype(_VIEWS).reset_index(drop=True)


def views_arrow(trace):
    """views' rows as a pyarrow Table (kind, op, ops, bytes_allocated, bytes_written, allocated_pct)."""
    return fetch_arrow(trace, "views", _VIEWS_ORDER, ("ops", "bytes_allocated", "bytes_written")).select(
        list(_VIEWS)[1:]
    )


def kinds(table):
    """The views table summed per kind (the report's "Views vs copies" lines)."""
    return table.groupby("kind", sort=False, observed=True)[["ops", "bytes_allocated"]].sum().reset_index()
