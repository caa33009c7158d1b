"""The pandas implementations of reports.peak and reports.views, kept as test oracles of views.sql's `peak` and
`views` (tests/reports/sql/test_sql.py)."""

import numpy as np
import pandas as pd

from reports._util import empty_frame, pct
from reports.loading.load import require, runs_of
from reports.memory.frame_rows import runs_in_order
from reports.memory.views import _KIND_NAMES, _VIEW_COLUMNS, _kind_codes
from reports.sql.tables import _VIEWS
from reports.sql.tables import PEAK_DTYPES as _PEAK_DTYPES
from reports.tables import split_runs

__all__ = ["peak", "views"]


def peak(df):
    """The highest `live_bytes` of each run and the op after which it was reached (the first, on a tie)."""
    require(df, ("seq", "step", "op", "phase", "module", "live_bytes"), "peak")
    found = []
    for name, _, rows in runs_in_order(df):
        if not len(rows):
            continue
        top = rows.iloc[int(np.argmax(rows["live_bytes"].to_numpy()))]
        found.append(
            {"run": name, "peak_live_bytes": top["live_bytes"], "seq": top["seq"], "step": top["step"],
             "phase": str(top["phase"]), "module": str(top["module"]), "op": str(top["op"])}
        )  # fmt: skip
    if not found:
        return empty_frame(_PEAK_DTYPES)
    return pd.DataFrame(found).astype(_PEAK_DTYPES)


def views(df):
    """View ops against copying ops: one row per (run, kind, op), views first, then copies by bytes.

    Columns: kind ("view" or "copy"), op, ops (how many calls), bytes_allocated
    (new memory: 0 for views), bytes_written (data moved), allocated_pct
    (share of all the bytes the run's ops allocated)."""
    require(df, _VIEW_COLUMNS, "views")
    frames = []
    runs_of(df)  # a frame from reports.load, or a one-line error
    for name, rows in split_runs(df):
        code = _kind_codes(rows)
        keep = code > 0
        if not keep.any():
            continue
        total = int(rows["bytes_allocated"].sum())
        op = rows["op"].astype("category").array[keep]  # group on codes: no string per row
        table = (
            pd.DataFrame(
                {
                    "kind": pd.Categorical.from_codes(code[keep], categories=_KIND_NAMES),
                    "op": op,
                    "bytes_allocated": rows["bytes_allocated"].to_numpy()[keep],
                    "bytes_written": rows["bytes_written"].to_numpy()[keep],
                }
            )
            .groupby(["kind", "op"], sort=False, observed=True)
            .agg(ops=("op", "size"), bytes_allocated=("bytes_allocated", "sum"), bytes_written=("bytes_written", "sum"))
            .reset_index()
        )
        table["kind"], table["op"] = table["kind"].astype(object), table["op"].astype(object)
        table["allocated_pct"] = pct(table["bytes_allocated"], total)
        table["order"] = (table["kind"] == "copy").astype(int)
        table = table.sort_values(
            ["order", "bytes_allocated", "bytes_written", "ops"], ascending=[True, False, False, False], kind="stable"
        )
        table.insert(0, "run", name)
        frames.append(table.drop(columns="order"))
    if not frames:
        return empty_frame(_VIEWS)
    return pd.concat(frames, ignore_index=True)[list(_VIEWS)].astype(_VIEWS)
