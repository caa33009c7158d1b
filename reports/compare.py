"""Several runs side by side: fp32 against bf16 autocast, batch 8 against 16, model A against B.

    compare(["runs/fp32.parquet", "runs/bf16.parquet"], by="op")

One row per (key, run), the key being a phase, an aten op or a module. Runs that
traced different models still line up by op and by phase; by module, a module
only one run has shows 0 for the others (a module named `total` is the key "total (module)",
apart from the whole run's "total" row). Values are per training step (runs may
have traced different numbers of steps), except the peak:

  ops_per_step              aten ops
  flops_per_step            analytic FLOPs (2 per multiply-add)
  bytes_allocated_per_step  bytes of the storages the ops created
  peak_live_bytes           the highest live_bytes after any op of the key
  traced_us_per_step        sum of the ops' duration_ns under the tracer, in us:
                            traced time, slowed by the tracer's bookkeeping; good
                            for ranking ops, not for speed (MFU uses untraced time)
  mfu_pct                   on the "total" rows only: reports.mfu's MFU, from the
                            run's untraced step time; NaN where it cannot be known.
                            MFU per phase, op or module would need untraced time per
                            phase, op or module, which no trace has.
  <metric>_ratio            the value over the baseline run's value for the same key
                            (NaN for 0 / 0, inf for x / 0)
  change_pct                the larger change of FLOPs and of bytes allocated against
                            the baseline, as a share of the baseline run's total

Each run's "total" row comes first, then the keys with the biggest change_pct
in any run, each key's rows in run order.
"""

import os

import numpy as np
import pandas as pd
import pyarrow as pa

from reports.errors import ReportError
from reports.loading.load import require, runs_of
from reports.sql.frame import trace_of

__all__ = ["BY", "TOTAL", "check_baseline", "check_by", "columns", "compare", "mfu_of_rows", "mfu_pct", "side_by_side"]

BY = ("phase", "op", "module")
TOTAL = "total"
_SUMS = ("ops", "flops", "bytes_allocated", "traced_us")
_RATIOS = ("flops", "bytes_allocated", "peak_live_bytes", "traced_us")


def check_by(by):
    if by not in BY:
        raise ReportError(f"compare: by must be one of {list(BY)}, got {by!r}")


def check_baseline(baseline, runs):
    """The baseline run's name: the first run by default."""
    if baseline is None:
        return runs[0]
    if baseline not in runs:
        raise ReportError(f"compare: baseline {baseline!r} is not one of the runs {runs}")
    return baseline


def _columns(by):
    return {
        by: "object",
        "run": "object",
        "steps": "int64",
        **{f"{m}_per_step": "float64" for m in _SUMS},
        "peak_live_bytes": "Int64",
        "mfu_pct": "float64",
        **{f"{m}_ratio": "float64" for m in _RATIOS},
        "change_pct": "float64",
    }


def columns(by="phase"):
    """The trace columns `compare` reads, MFU's included: load only these for a big trace."""
    from reports.flops.mfu import COLUMNS as MFU_COLUMNS

    # flops_bound: a count clamped to 2**63 - 1 is checked with its flag (a bound, not damage)
    return list(
        dict.fromkeys(
            (
                "seq",
                "step",
                "phase",
                "flops",
                "flops_bound",
                "bytes_allocated",
                "live_bytes",
                "duration_ns",
                by,
                *(c for c in MFU_COLUMNS if c != "run"),
            )
        )
    )


def mfu_pct(trace):
    """{run: MFU in percent} of the runs of `trace` (a reports.sql.engine.Trace), from reports.mfu. compare gives
    reports.mfu no step time, so a run's MFU is NaN unless its metadata holds an untraced one, and side_by_side writes
    NaN for a run left out: the small frame MFU's model FLOPs and dtype are read from (reports/sql/flops.py, mfu_only:
    its matmul and attention rows, the others summed) is cut only when some run has a step time."""
    if not any(
        (meta.get("step_time") or {}).get("median_s") for meta in trace.runs.values()
    ):  # as reports.mfu reads it
        return {}
    from reports.sql.flops import frame

    return mfu_of_rows(frame(trace, mfu_only=True))


def mfu_of_rows(df):
    """{run: MFU in percent} from reports.mfu over a frame of rows, or {} when MFU cannot be computed from it."""
    try:
        from reports.flops.mfu import mfu
    except ImportError:
        return {}
    try:
        table = mfu(df)
    except ReportError:  # e.g. loaded without the columns mfu needs
        return {}
    return dict(zip(table["run"], 100.0 * table["mfu"].astype("float64")))


def compare(df_or_paths, by="phase", baseline=None):
    """Runs side by side by phase, op or module, with ratios against the baseline run.

    df_or_paths  a DataFrame from reports.load holding several runs (or an Arrow table of their
                 rows with a `run` column), trace paths, or a reports.sql.engine.Trace
    by           "phase", "op" or "module"
    baseline     the run the ratios divide by (its name); default the first run
    See the module docstring for the columns. The figures are compare.sql's views, run over the
    frame's rows (reports.sql.frame) or over the traces' files."""
    check_by(by)
    rows = df_or_paths
    if isinstance(rows, (str, os.PathLike, list, tuple)):
        from reports.sql.engine import Trace

        rows = Trace(rows, columns=columns(by))
    elif isinstance(rows, pd.DataFrame):
        require(rows, ("seq", "step", "phase", "flops", "bytes_allocated", "live_bytes", "duration_ns", by), "compare")
        runs_of(rows)  # a frame from reports.load, or a one-line error
    elif not isinstance(rows, pa.Table) and not hasattr(rows, "per_step"):
        raise ReportError(f"compare: expected a DataFrame from reports.load or trace paths, got {type(rows).__name__}")
    with trace_of(
        rows,
        "compare",
        ("seq", "step", "phase", "flops", "bytes_allocated", "live_bytes", "duration_ns", by),
        columns(by),
    ) as trace:
        return _compare(trace, by, baseline)


_FIGURES = ("ops", "flops", "bytes_allocated", "duration_ns")
_NAMES = {
    "ops": "ops_per_step",
    "flops": "flops_per_step",
    "bytes_allocated": "bytes_allocated_per_step",
    "duration_ns": "traced_us_per_step",
}


def _compare(trace, by, baseline):
    """compare of a Trace: each run's totals per key and phase from compare.sql's view, per step as Trace.per_step
    gives them (each phase's total over the steps it ran in, the phases added in reports/steps.py's order)."""
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
    return side_by_side(tables, runs, baseline, mfu_pct(trace), by)


def _own_keys(table, by):
    """`table` with a key named like the whole-run row (a module named `total`) renamed "total (module)"."""
    keys = list(table.index)
    if TOTAL not in keys[1:]:
        return table
    return table.set_axis(keys[:1] + [f"{TOTAL} ({by})" if k == TOTAL else k for k in keys[1:]])


def side_by_side(tables, runs, baseline, mfu, by):
    """The compare table from each run's figures ({run: frame indexed by key, the "total" row first, with the
    *_per_step sums, peak_live_bytes and steps}), `mfu` {run: MFU in percent}: ratios, change_pct, order."""
    tables = {run: _own_keys(t, by) for run, t in tables.items()}
    keys = list(dict.fromkeys(k for t in tables.values() for k in t.index))
    base = tables[baseline].reindex(keys)
    frames = []
    for run in runs:
        table = tables[run].reindex(keys)
        table["steps"] = tables[run]["steps"].iloc[0]
        sums = [f"{m}_per_step" for m in _SUMS]
        table[sums] = table[sums].fillna(0.0)
        table["mfu_pct"] = np.nan
        table.loc[TOTAL, "mfu_pct"] = mfu.get(run, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            for m in _RATIOS:
                column = m if m == "peak_live_bytes" else f"{m}_per_step"
                table[f"{m}_ratio"] = table[column].astype("float64") / base[column].fillna(0).astype("float64")
        change = np.zeros(len(keys))
        for m in ("flops", "bytes_allocated"):
            column = f"{m}_per_step"
            whole = base.loc[TOTAL, column]
            if whole:
                change = np.maximum(change, (table[column] - base[column].fillna(0)).abs().to_numpy() / whole)
        table["change_pct"] = 100.0 * change
        table.index.name = by
        table = table.reset_index()
        table.insert(1, "run", run)
        frames.append(table)
    out = pd.concat(frames, ignore_index=True)
    score = out.groupby(by, sort=False)["change_pct"].transform("max")
    out["_total"] = out[by] != TOTAL
    out["_score"] = -score
    out["_key"] = out[by].map({k: i for i, k in enumerate(keys)})
    out["_run"] = out["run"].map({r: i for i, r in enumerate(runs)})
    out = out.sort_values(["_total", "_score", "_key", "_run"], kind="stable").drop(
        columns=["_total", "_score", "_key", "_run"]
    )
    columns = _columns(by)
    return out[list(columns)].astype(columns).reset_index(drop=True)
