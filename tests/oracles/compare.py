"""The pandas implementation of reports.compare's per-run figures (by reports.steps.per_step), kept as the test
oracle of compare.sql's views (tests/reports/sql/test_sql_compare.py); the runs are set side by side by
reports.compare_table.side_by_side, as the library's are."""

import numpy as np
import pandas as pd

from reports.compare import TOTAL, RunTable, check_baseline, check_by, frame_of, mfu_of_rows, side_by_side
from reports.loading.load import require, runs_of
from reports.steps import count_steps, per_step, step_phases
from reports.tables import split_runs

__all__ = ["compare"]


def _per_run(rows, by):
    values = {
        "ops_per_step": pd.Series(1, index=rows.index, dtype="int64"),
        "flops_per_step": rows["flops"],
        "bytes_allocated_per_step": rows["bytes_allocated"],
        "traced_us_per_step": rows["duration_ns"],
    }
    phases = step_phases(rows)  # one pass for the eight figures below
    table = pd.DataFrame({name: per_step(rows, values=v, by=by, phases=phases) for name, v in values.items()})
    table["traced_us_per_step"] /= 1000.0
    peak = rows["live_bytes"].groupby(rows[by], observed=True, sort=False).max()
    peak.index = peak.index.astype(object)
    table["peak_live_bytes"] = peak
    total = pd.DataFrame({name: [per_step(rows, values=v, phases=phases)] for name, v in values.items()}, index=[TOTAL])
    total["traced_us_per_step"] /= 1000.0
    total["peak_live_bytes"] = rows["live_bytes"].max() if len(rows) else np.nan
    return pd.concat([total, table])


def compare(df, by="phase", baseline=None):
    """reports.compare of a frame from reports.load, in pandas."""
    check_by(by)
    require(df, ("seq", "step", "phase", "flops", "bytes_allocated", "live_bytes", "duration_ns", by), "compare")
    runs = list(runs_of(df))
    baseline = check_baseline(baseline, runs)
    tables = {}
    for run, rows in split_runs(df):
        table = _per_run(rows, by)
        columns = {c: table[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in table.columns}
        tables[run] = RunTable(list(table.index), columns, count_steps(rows))
    return frame_of(side_by_side(tables, runs, baseline, mfu_of_rows(df), by), by)
