"""Which FLOPs are missing or only bounds: the ops no formula counted, so no zero passes silently.

An op without a FLOP formula is recorded with 0 FLOPs and `flop_kind` "unknown"
(tracer.flops.formulas). `uncounted(df)` lists them, as fvcore lists the ops it skips,
with their share of the traced op time: an op that takes 30% of the time and
counts nothing is worth a formula (`tracer.register_flop_formula`). `bounds(df)`
gives the FLOPs per step that are upper bounds rather than counts (the `flops_bound`
column of a v3 trace: lengths or group sizes the tracer could not read).
"""

import pyarrow as pa

from reports.flops.rows import Rows, from_frame, per_step

__all__ = ["FIX", "bounded", "bounds", "uncounted"]

FIX = "tracer.register_flop_formula(op, kind=...) before tracing gives an op its count"
_COLUMNS = ["op", "flop_kind", "duration_ns"]


def uncounted(df):
    """One row per op whose FLOPs no formula counted (flop_kind "unknown"), over the whole trace.

    Columns: op, ops (rows), duration_us (traced op time) and time_pct (share of
    the trace's op time, 0-100); the largest share first. Empty when every op was counted.
    views.sql's view uncounted, the report's, run over the rows of `df` (a DataFrame or a pyarrow Table)
    taken as one run: the runs of a trace of several are added up, a row without an op is in no group."""
    from reports.loading.load import require  # (pandas: FIX and bounds, which the report reads, import none)
    from reports.sql import tables
    from reports.sql.frame import trace_of

    if isinstance(df, pa.Table):
        rows = df.select([c for c in _COLUMNS if c in df.column_names])  # trace_of names a missing one
    else:
        require(df, _COLUMNS, "uncounted")
        rows = from_frame(df, _COLUMNS)  # no run column: one run
    with trace_of(rows, "uncounted", _COLUMNS) as trace:
        table = tables.uncounted(trace)
    return table[table["op"].notna()].reset_index(drop=True)


def bounds(df):
    """{"flops": per-step FLOPs of the rows whose count is an upper bound (the flops_bound column), "rows": how many
    rows}; zeros for a trace without the column (v1, v2)."""
    rows = Rows(from_frame(df, ["phase", "step", "flops", "flops_bound"]))
    return bounded(rows, rows.flag("flops_bound"))


def bounded(rows, bound):
    """bounds of reports.flops.rows.Rows whose flops_bound column is `bound` (a bool array)."""
    if not bound.any():
        return {"flops": 0, "rows": 0}
    flops = per_step(rows, mask=bound)
    return {
        "flops": int(flops) if float(flops).is_integer() and abs(flops) < 2**53 else float(flops),
        "rows": int(bound.sum()),
    }
