"""`optrace compare` from the SQL views of reports/sql/compare.sql: reports.compare's table for the runs of a Trace.

The views give each run's totals per key and phase; the per-step figures are Trace.per_step's
(each phase's total over the steps it ran in, the phases added in reports/steps.py's order: the
same float64 operations as reports/steps.py per_step), and reports/compare.py side_by_side takes
the ratios, change_pct and order from there, for both engines.
"""

import numpy as np
import pandas as pd

from reports.compare import TOTAL, check_baseline, check_by, side_by_side

__all__ = ["compare", "mfu_pct"]

_FIGURES = ("ops", "flops", "bytes_allocated", "duration_ns")
_NAMES = {"ops": "ops_per_step", "flops": "flops_per_step", "bytes_allocated": "bytes_allocated_per_step",
          "duration_ns": "traced_us_per_step"}  # fmt: skip


def compare(trace, by="phase", baseline=None, mfu=None):
    """reports.compare(df, by, baseline) for the runs of `trace` (a reports.sql.engine.Trace); `mfu`:
    {run: MFU in percent} (reports.compare leaves a run out when its MFU cannot be computed)."""
    check_by(by)
    runs = list(trace.runs)
    baseline = check_baseline(baseline, runs)
    totals = trace.sql(f"SELECT * FROM compare_by_{by} ORDER BY run_index, first_seq, phase")
    keyed = trace.per_step(totals, _FIGURES, keys=("key",))
    phases = totals if by == "phase" else trace.sql("SELECT * FROM compare_by_phase ORDER BY run_index, first_seq")
    whole = trace.per_step(phases, _FIGURES)  # the "total" row: every row, a module or not
    counts = trace.table("run_totals", order="run_index")
    tables = {}
    for i, run in enumerate(runs):
        rows, all_rows = totals[totals["run_index"] == i], phases[phases["run_index"] == i]
        peak = rows.groupby("key", sort=False)["peak_live_bytes"].max()
        total = whole[i].rename(columns=_NAMES).set_axis([TOTAL])
        table = keyed[i].rename(columns=_NAMES).set_index("key")
        table.index = table.index.astype(object)
        table["peak_live_bytes"] = peak.reindex(table.index).to_numpy(dtype=np.float64) if len(table) else []
        total["peak_live_bytes"] = float(all_rows["peak_live_bytes"].max()) if len(all_rows) else np.nan
        for t in (table, total):
            t["traced_us_per_step"] /= 1000.0
        table = pd.concat([total, table])
        table.index.name = None
        found = counts[counts["run_index"] == i]
        fb, traced = (int(found["fb_steps"].iloc[0]), int(found["steps_traced"].iloc[0])) if len(found) else (0, 0)
        table["steps"] = max(1, fb or traced)
        tables[run] = table
    return side_by_side(tables, runs, baseline, mfu or {}, by)


def mfu_pct(trace):
    """reports/compare.py mfu_pct of the trace's rows: {run: MFU in percent}. compare gives reports.mfu no step time,
    so a run's MFU is NaN unless its metadata holds an untraced one, and side_by_side writes NaN for a run left out:
    the small frame MFU's model FLOPs and dtype are read from (reports/sql/flops.py, mfu_only: its matmul and
    attention rows, the others summed) is cut only when some run has a step time."""
    from reports.compare import mfu_pct as of_rows
    from reports.sql.flops import frame

    if not any((meta.get("step_time") or {}).get("median_s") for meta in trace.runs.values()):  # as reports.mfu reads it
        return {}
    return of_rows(frame(trace, mfu_only=True))
