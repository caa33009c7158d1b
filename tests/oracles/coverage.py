"""The numpy implementation of reports.uncounted, kept as a test oracle of views.sql's uncounted as
reports.flops.coverage runs it over a frame (tests/reports/sql/test_library_views.py)."""

import numpy as np
import pyarrow as pa

from reports._util import pct
from reports.flops.rows import Rows, from_frame, records_table, to_frame

__all__ = ["uncounted", "uncounted_table"]

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
