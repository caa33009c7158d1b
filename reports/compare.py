"""Several runs side by side: fp32 against bf16 autocast, batch 8 against 16, model A against B.

    compare(["runs/fp32.parquet", "runs/bf16.parquet"], by="op")
    compare(["base.json", "runs/now.parquet"])     # a baseline file saved by reports.compare.save_baseline

One row per (key, run), the key being a phase, an aten op or a module (with `depth`, a module and its
submodules under the path's first `depth` names: "layers.0.attn" at depth 2 is "layers.0"). Runs that traced
different models still line up by op and by phase; a key only some runs have shows 0 for the others
(a module named `total` is the key "total (module)", apart from the whole run's "total" row). Values are
per training step (runs may have traced different numbers of steps), except the peak:

  ops_per_step              aten ops
  flops_per_step            analytic FLOPs (2 per multiply-add)
  bytes_allocated_per_step  bytes of the storages the ops created
  peak_live_bytes           the highest live_bytes after any op of the key
  traced_us_per_step        sum of the ops' duration_ns under the tracer, in us:
                            traced time, slowed by the tracer's bookkeeping; good
                            for ranking ops, not for speed (MFU uses untraced time)
  mfu_pct                   on the "total" rows only: reports.mfu's MFU, from the
                            run's untraced step time; NaN where it cannot be known.
  <metric>_change_pct       signed: (value - baseline's value) / baseline's value x 100 for the same key;
                            +inf for a key the baseline lacks (x / 0), 0 for 0 against 0, NaN where a
                            peak is unknown (the key has no op in one of the runs)
  change_pct                signed: the change of FLOPs or of bytes allocated (whichever moved more)
                            against the baseline, as a share of the baseline run's total

Each run's "total" row comes first, then the keys with the biggest |change_pct| in any run, each
key's rows in run order. A run's figures (reports.compare.Figures) come from compare.sql's views, over a
trace's files or a frame's rows, or from a baseline file that stored them.
"""

import os

import numpy as np
import pandas as pd
import pyarrow as pa

from reports.baseline import VIEWS, is_baseline, load_baseline, write_baseline
from reports.errors import ReportError
from reports.loading.load import require, runs_of
from reports.sql.frame import memory_trace

__all__ = [
    "BY",
    "CHANGES",
    "TOTAL",
    "Figures",
    "at_depth",
    "check_baseline",
    "check_by",
    "columns",
    "compare",
    "figures",
    "mfu_of_rows",
    "mfu_pct",
    "save_baseline",
    "side_by_side",
    "table_of",
]

BY = ("phase", "op", "module")
TOTAL = "total"
_SUMS = ("ops", "flops", "bytes_allocated", "traced_us")
CHANGES = ("ops", "flops", "bytes_allocated", "peak_live_bytes", "traced_us")
_REQUIRED = ("seq", "step", "phase", "flops", "bytes_allocated", "live_bytes", "duration_ns")


def check_by(by):
    if by not in BY:
        raise ReportError(f"compare: by must be one of {list(BY)}, got {by!r}")


def check_depth(depth):
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ReportError(f"compare: depth must be a whole number >= 1 (module path names kept), got {depth!r}")


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
        **{f"{m}_change_pct": "float64" for m in CHANGES},
        "change_pct": "float64",
    }


def columns(by="phase"):
    """The trace columns `compare` reads (every key's, the words' and MFU's): load only these for a big trace."""
    from reports.flops.mfu import COLUMNS as MFU_COLUMNS
    from reports.memory.row_scan import Scan

    # flops_bound: a count clamped to 2**63 - 1 is checked with its flag (a bound, not damage)
    return list(
        dict.fromkeys(
            (
                *_REQUIRED,
                "flops_bound",
                *BY,
                "recompute",
                "input_dtypes",
                "output_dtypes",
                *(c for c in MFU_COLUMNS if c != "run"),
                *Scan.columns,  # the memory categories at the peak (reports.memory.sql_categories.by_category)
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


class Figures:
    """One run's figures as compare.sql's views give them: `views` {view name: its rows of the run, run_index 0}
    (compare_by_phase, compare_by_op, compare_by_module, compare_recompute, compare_dtypes), `steps` {phase: steps
    it ran in} (reports.sql.engine.Trace.phase_steps), `train_steps` (the run's training steps), `mfu` (percent or
    NaN), `categories` ({memory category: bytes live at the run's peak}, reports.by_category; a str saying why
    where it could not be computed). A baseline file (reports.baseline) stores exactly these, so its tables are the
    trace's."""

    VIEWS = VIEWS

    def __init__(self, name, views, steps, train_steps, mfu, categories=None):
        self.name, self.views, self.steps = name, views, dict(steps)
        self.train_steps, self.mfu = int(train_steps), float(mfu)
        self.categories = categories if isinstance(categories, str) else dict(categories or {})
        self.runs = {name: {}}  # as Trace.per_step reads them

    def phase_steps(self):
        return {0: dict(self.steps)}

    def per_step(self, totals, figures, keys=()):
        from reports.sql.engine import Trace

        return Trace.per_step(self, totals, figures, keys)[0]


def figures(trace):
    """[Figures] of every run of `trace` (a reports.sql.engine.Trace), in run order."""
    views = {}
    for view in Figures.VIEWS:
        order = "run_index, first_seq" + ("" if view == "compare_dtypes" else ", phase")
        views[view] = trace.sql(f"SELECT * FROM {view} ORDER BY {order}")
    counts = trace.table("run_totals", order="run_index")
    steps, mfu, categories = trace.phase_steps(), mfu_pct(trace), _categories(trace)
    out = []
    for i, run in enumerate(trace.runs):
        found = counts[counts["run_index"] == i]
        fb, traced = (int(found["fb_steps"].iloc[0]), int(found["steps_traced"].iloc[0])) if len(found) else (0, 0)
        mine = {v: f[f["run_index"] == i].assign(run_index=0).reset_index(drop=True) for v, f in views.items()}
        mem = categories if isinstance(categories, str) else categories.get(run, {})
        out.append(Figures(run, mine, steps[i], max(1, fb or traced), mfu.get(run, np.nan), mem))
    return out


def _categories(trace):
    """{run: {category: bytes live at the run's peak}} (reports.memory.sql_categories.by_category), or the reason
    it could not be computed (a str)."""
    from reports.memory.sql_categories import by_category

    try:
        table = by_category(trace)
    except ReportError as exc:
        return f"memory by category not known: {exc}"
    out = {}
    for run, category, size in zip(*(table.column(c).to_pylist() for c in ("run", "category", "bytes"))):
        out.setdefault(run, {})[category] = int(size)
    return out


def at_depth(module, depth):
    """A module path cut to its first `depth` names ("layers.0.attn" at 2: "layers.0"); '' stays ''."""
    return ".".join(module.split(".")[:depth]) if depth else module


def _keyed(totals, by, depth):
    if by != "module" or not depth or not len(totals):
        return totals
    cut = totals.assign(key=totals["key"].astype(object).map(lambda m: at_depth(m, depth)))
    sums = {c: "sum" for c in ("ops", "flops", "bytes_allocated", "duration_ns")}
    return (
        cut.groupby(["run_index", "key", "phase"], sort=False, observed=True)
        .agg({**sums, "peak_live_bytes": "max", "first_seq": "min"})
        .reset_index()
        .sort_values(["first_seq", "phase"], kind="stable")
    )


_FIGURES = ("ops", "flops", "bytes_allocated", "duration_ns")
_NAMES = {
    "ops": "ops_per_step",
    "flops": "flops_per_step",
    "bytes_allocated": "bytes_allocated_per_step",
    "duration_ns": "traced_us_per_step",
}


def table_of(run, by, depth=None):
    """One run's table (reports.compare.Figures): the "total" row first, then each key per step, its peak, steps."""
    totals = _keyed(run.views[f"compare_by_{by}"], by, depth)
    phases = run.views["compare_by_phase"]
    total = run.per_step(phases, _FIGURES).rename(columns=_NAMES).set_axis([TOTAL])
    table = run.per_step(totals, _FIGURES, keys=("key",)).rename(columns=_NAMES).set_index("key")
    table.index = table.index.astype(object)
    peak = totals.groupby("key", sort=False)["peak_live_bytes"].max() if len(totals) else pd.Series(dtype="float64")
    table["peak_live_bytes"] = peak.reindex(table.index).to_numpy(dtype=np.float64) if len(table) else []
    total["peak_live_bytes"] = float(phases["peak_live_bytes"].max()) if len(phases) else np.nan
    for t in (table, total):
        t["traced_us_per_step"] /= 1000.0
    table = pd.concat([total, table])
    table.index.name = None
    table["steps"] = run.train_steps
    return table


def _sources(items, by):
    """[Figures or None] for each of the paths `items` (a baseline file: its Figures; a trace: None), and a Trace
    over the traces among them (or None)."""
    from reports.sql.engine import Trace

    stored = [Figures(**load_baseline(p)) if is_baseline(p) else None for p in items]
    traces = [p for p, s in zip(items, stored) if s is None]
    return stored, (Trace(traces, columns=columns(by)) if traces else None)


def runs_of_sources(df_or_paths, by="phase"):
    """[Figures] of every run `df_or_paths` holds: paths of traces and baseline files, a Trace, a DataFrame from
    reports.load or an Arrow table of rows with a `run` column. A baseline's run named like another run is renamed
    "<name> (baseline)"."""
    rows = df_or_paths
    if isinstance(rows, (str, os.PathLike)):
        rows = [rows]
    if isinstance(rows, (list, tuple)):
        paths = [os.fspath(p) for p in rows if not isinstance(p, Figures)]
        stored, trace = _sources(paths, by)
        try:
            found = iter(figures(trace) if trace is not None else [])
        finally:
            if trace is not None:
                trace.close()
        given, kept = iter(stored), []
        for item in rows:  # (Figures, read from a baseline file?)
            s = item if isinstance(item, Figures) else next(given)
            kept.append(
                (s, False) if isinstance(item, Figures) else (s if s is not None else next(found), s is not None)
            )
        traced = {r.name for r, b in kept if not b}
        for r, b in kept:
            if b and r.name in traced:
                r.name = f"{r.name} (baseline)"
        return [r for r, _ in kept]
    if isinstance(rows, pd.DataFrame):
        require(rows, (*_REQUIRED, by), "compare")
        runs_of(rows)  # a frame from reports.load, or a one-line error
    elif not isinstance(rows, pa.Table) and not hasattr(rows, "per_step"):
        raise ReportError(f"compare: expected a DataFrame from reports.load or trace paths, got {type(rows).__name__}")
    if hasattr(rows, "per_step"):  # a Trace, left open
        return figures(rows)
    trace = memory_trace(rows, "compare", (*_REQUIRED, by), columns(by), grains=True)  # grains: the memory model's
    try:
        return figures(trace)
    finally:
        trace.close()


def compare(df_or_paths, by="phase", baseline=None, depth=None):
    """Runs side by side by phase, op or module, with signed changes against the baseline run.

    df_or_paths  a DataFrame from reports.load holding several runs (or an Arrow table of their
                 rows with a `run` column), paths of traces and of baseline files (reports.baseline),
                 a reports.sql.engine.Trace, or a list of reports.compare.Figures
    by           "phase", "op" or "module"
    baseline     the run the changes are against (its name); default the first run
    depth        by module: keep the first `depth` names of each module path (a module and its submodules)
    See the module docstring for the columns. The figures are compare.sql's views, run over the
    frame's rows (reports.sql.frame) or over the traces' files."""
    check_by(by)
    check_depth(depth)
    runs = runs_of_sources(df_or_paths, by)
    return side_by_side_runs(runs, by, baseline, depth)


def side_by_side_runs(runs, by, baseline=None, depth=None):
    """The compare table of [Figures]."""
    names = [r.name for r in runs]
    baseline = check_baseline(baseline, names)
    tables = {r.name: table_of(r, by, depth) for r in runs}
    return side_by_side(tables, names, baseline, {r.name: r.mfu for r in runs}, by)


def _own_keys(table, by):
    """`table` with a key named like the whole-run row (a module named `total`) renamed "total (module)"."""
    keys = list(table.index)
    if TOTAL not in keys[1:]:
        return table
    return table.set_axis(keys[:1] + [f"{TOTAL} ({by})" if k == TOTAL else k for k in keys[1:]])


def signed_change(value, base):
    """Signed percent change of `value` against `base` (arrays): +inf for x / 0 (x > 0), 0 for 0 / 0, NaN where
    either is unknown."""
    value, base = np.asarray(value, dtype=np.float64), np.asarray(base, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 100.0 * (value - base) / base
    out = np.where((base == 0) & (value == 0), 0.0, out)
    return np.where(np.isnan(value) | np.isnan(base), np.nan, out)


def side_by_side(tables, runs, baseline, mfu, by):
    """The compare table from each run's figures ({run: frame indexed by key, the "total" row first, with the
    *_per_step sums, peak_live_bytes and steps}), `mfu` {run: MFU in percent}: signed changes, change_pct, order."""
    tables = {run: _own_keys(t, by) for run, t in tables.items()}
    keys = list(dict.fromkeys(k for t in tables.values() for k in t.index))
    base = tables[baseline].reindex(keys)
    sums = [f"{m}_per_step" for m in _SUMS]
    base[sums] = base[sums].fillna(0.0)
    frames = []
    for run in runs:
        table = tables[run].reindex(keys)
        table["steps"] = tables[run]["steps"].iloc[0]
        table[sums] = table[sums].fillna(0.0)
        table["mfu_pct"] = np.nan
        table.loc[TOTAL, "mfu_pct"] = mfu.get(run, np.nan)
        for m in CHANGES:
            column = m if m == "peak_live_bytes" else f"{m}_per_step"
            table[f"{m}_change_pct"] = signed_change(table[column], base[column])
        change = np.zeros(len(keys))
        for m in ("flops", "bytes_allocated"):
            column = f"{m}_per_step"
            whole = base.loc[TOTAL, column]
            if whole:
                moved = (table[column] - base[column]).to_numpy() / whole
                change = np.where(np.abs(moved) > np.abs(change), moved, change)
        table["change_pct"] = 100.0 * change
        table.index.name = by
        table = table.reset_index()
        table.insert(1, "run", run)
        frames.append(table)
    out = pd.concat(frames, ignore_index=True)
    score = out["change_pct"].abs().groupby(out[by], sort=False).transform("max")
    out["_total"] = out[by] != TOTAL
    out["_score"] = -score
    out["_key"] = out[by].map({k: i for i, k in enumerate(keys)})
    out["_run"] = out["run"].map({r: i for i, r in enumerate(runs)})
    out = out.sort_values(["_total", "_score", "_key", "_run"], kind="stable").drop(
        columns=["_total", "_score", "_key", "_run"]
    )
    columns = _columns(by)
    return out[list(columns)].astype(columns).reset_index(drop=True)


def save_baseline(trace, path, source=None):
    """Write the compare figures of `trace` (a trace path of one run, or a reports.compare.Figures read from the
    trace `source`) to `path`, a baseline file (reports.baseline); returns the Figures written."""
    runs = [trace] if isinstance(trace, Figures) else runs_of_sources([trace])
    where = os.fspath(source if source is not None else trace if not isinstance(trace, Figures) else trace.name)
    if len(runs) != 1:
        names = ", ".join(r.name for r in runs)
        raise ReportError(
            f"compare: --save-baseline takes a trace of one run, got {len(runs)} runs in {where}: {names}"
        )
    write_baseline(runs[0], path, where)
    return runs[0]
