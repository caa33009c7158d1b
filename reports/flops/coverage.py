"""Which FLOPs are missing or only bounds: the ops no formula counted, so no zero passes silently.

An op without a FLOP formula is recorded with 0 FLOPs and `flop_kind` "unknown"
(tracer.flops.formulas). `uncounted(df)` lists them, as fvcore lists the ops it skips,
with their share of the traced op time: an op that takes 30% of the time and
counts nothing is worth a formula (`tracer.register_flop_formula`). `bounds(df)`
gives the FLOPs per step that are upper bounds rather than counts (the `flops_bound`
column of a v3 trace: lengths or group sizes the tracer could not read).
"""

import numpy as np
import pandas as pd

from reports._util import empty_frame, pct
from reports.loading.load import require

__all__ = ["FIX", "bounds", "uncounted"]

FIX = "tracer.register_flop_formula(op, kind=...) before tracing gives an op its count"
_UNCOUNTED = {"op": object, "ops": "int64", "duration_us": "float64", "time_pct": "float64"}


def uncounted(df):
    """One row per op whose FLOPs no formula counted (flop_kind "unknown"), over the whole trace.

    Columns: op, ops (rows), duration_us (traced op time) and time_pct (share of
    the trace's op time, 0-100); the largest share first. Empty when every op was counted."""
    require(df, ["op", "flop_kind", "duration_ns"], "uncounted")
    unknown = (df["flop_kind"] == "unknown").to_numpy()
    if not unknown.any():
        return empty_frame(_UNCOUNTED)
    rows = df.loc[unknown, ["op", "duration_ns"]]
    grouped = rows.groupby(rows["op"].astype(object), sort=False)["duration_ns"].agg(["size", "sum"])
    total = float(df["duration_ns"].to_numpy(np.float64).sum())
    table = pd.DataFrame({
        "op": grouped.index.astype(object),
        "ops": grouped["size"].to_numpy(np.int64),
        "duration_us": grouped["sum"].to_numpy(np.float64) / 1e3,
        "time_pct": pct(grouped["sum"].to_numpy(np.float64), total),
    })  # fmt: skip
    return table.sort_values(["time_pct", "ops", "op"], ascending=[False, False, True], kind="stable").reset_index(drop=True)


def bounds(df):
    """{"flops": per-step FLOPs of the rows whose count is an upper bound (the flops_bound column), "rows": how many
    rows}; zeros for a trace without the column (v1, v2)."""
    from reports.steps import per_step

    bound = df["flops_bound"].fillna(False).to_numpy(dtype=bool) if "flops_bound" in df.columns else None
    if bound is None or not bound.any():
        return {"flops": 0, "rows": 0}
    flops = per_step(df, mask=bound)
    return {"flops": int(flops) if float(flops).is_integer() and abs(flops) < 2**53 else float(flops), "rows": int(bound.sum())}
