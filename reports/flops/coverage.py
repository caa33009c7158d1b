"""Which FLOPs are missing or only bounds: the ops no formula counted, so no zero passes silently.

An op without a FLOP formula is recorded with 0 FLOPs and `flop_kind` "unknown"
(tracer.flops.formulas). `uncounted(df)` lists them, as fvcore lists the ops it skips,
with their share of the traced op time: an op that takes 30% of the time and
counts nothing is worth a formula (`tracer.register_flop_formula`). `bounds(df)`
gives the FLOPs per step that are upper bounds rather than counts (the `flops_bound`
column of a v3 trace: lengths or group sizes the tracer could not read).
"""

import numpy as np
import pyarrow as pa

from reports._util import pct
from reports.flops.rows import Rows, from_frame, per_step, records_table, to_frame

__all__ = ["FIX", "bounds", "uncounted", "uncounted_table"]

FIX = "tracer.register_flop_formula(op, kind=...) before tracing gives an op its count"
_UNCOUNTED = {"op": pa.string(), "ops": pa.int64(), "duration_us": pa.float64(), "time_pct": pa.float64()}


def uncounted(df):
    """One row per op whose FLOPs no formula counted (flop_kind "unknown"), over the whole trace.

    Columns: op, ops (rows), duration_us (traced op time) and time_pct (share of
    the trace's op time, 0-100); the largest share first. Empty when every op was counted."""
    from reports.loading.load import require

    require(df, ["op", "flop_kind", "duration_ns"], "uncounted")
    return to_frame(uncounted_table(Rows(from_frame(df, ["op", "flop_kind", "duration_ns"]))))


def uncounted_table(rows):
    """`uncounted` of reports.flops.rows.Rows, as a pyarrow.Table."""
    unknown = rows.labels("flop_kind").eq("unknown")
    op = rows.labels("op")
    picked = unknown & op.notna()  # a row without an op is in no group, as pandas' groupby drops it
    codes, duration = op.codes[picked], rows["duration_ns"][picked]
    at = np.unique(codes, return_index=True)[1] if len(codes) else np.zeros(0, dtype=np.int64)
    keys = codes[np.sort(at)]  # in order of first appearance
    size = np.bincount(codes, minlength=len(op.words))[keys] if len(codes) else keys
    sums = np.zeros(len(op.words), dtype=np.int64)
    np.add.at(sums, codes, duration.astype(np.int64))
    total = float(rows["duration_ns"].astype(np.float64).sum())
    time_pct = pct(sums[keys].astype(np.float64), total)
    records = [
        {"op": op.words[k], "ops": int(n), "duration_us": float(d) / 1e3, "time_pct": float(t)}
        for k, n, d, t in zip(keys.tolist(), size.tolist(), sums[keys].astype(np.float64).tolist(), time_pct.tolist())
    ]
    records.sort(key=lambda r: (-r["time_pct"], -r["ops"], r["op"]))  # the largest share first
    return records_table(records, _UNCOUNTED)


def bounds(df):
    """{"flops": per-step FLOPs of the rows whose count is an upper bound (the flops_bound column), "rows": how many
    rows}; zeros for a trace without the column (v1, v2)."""
    rows = Rows(from_frame(df, ["phase", "step", "flops", "flops_bound"]))
    bound = rows.flag("flops_bound")
    if not bound.any():
        return {"flops": 0, "rows": 0}
    flops = per_step(rows, mask=bound)
    return {
        "flops": int(flops) if float(flops).is_integer() and abs(flops) < 2**53 else float(flops),
        "rows": int(bound.sum()),
    }
