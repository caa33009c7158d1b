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

The table is made over numpy arrays ({column: array}, side_by_side_runs), which `optrace compare` prints and writes
as JSON without pandas; compare() makes it a DataFrame at the end.
"""

import math
import os
import re
import sys

import numpy as np
import pyarrow as pa

from reports.arrays import objects_of, values_of
from reports.baseline import VIEWS, is_baseline, load_baseline, write_baseline
from reports.compare_table import (
    BY,
    CHANGES,
    TOTAL,
    RunTable,
    at_depth,
    baselines_of,
    check_baseline,
    frame_of,
    keyed,
    largest,
    rows_of,
    side_by_side,
    signed_change,
)
from reports.errors import ReportError
from reports.loading.load import require, runs_of, runs_with_ranks
from reports.sql.frame import memory_trace
from reports.sql.per_step import per_step_arrays

__all__ = [
    "BY",
    "CHANGES",
    "TOTAL",
    "Figures",
    "RunTable",
    "at_depth",
    "baselines_of",
    "check_baseline",
    "check_by",
    "columns",
    "compare",
    "figures",
    "frame_of",
    "mfu_of_rows",
    "mfu_pct",
    "rows_of",
    "save_baseline",
    "side_by_side",
    "side_by_side_runs",
    "signed_change",
    "table_of",
]

_REQUIRED = ("seq", "step", "phase", "flops", "bytes_allocated", "live_bytes", "duration_ns")


def check_by(by):
    if by not in BY:
        raise ReportError(f"compare: by must be one of {list(BY)}, got {by!r}")


def check_depth(depth):
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ReportError(f"compare: depth must be a whole number >= 1 (module path names kept), got {depth!r}")


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
    """{run: MFU in percent} of the runs of `trace` (a reports.sql.engine.Trace), from reports.mfu's table over the
    small table of reports.sql.flops (mfu_only: its matmul and attention rows, the others summed), as the report
    reads it (no pandas). compare gives reports.mfu no step time, so a run's MFU is NaN unless its metadata holds an
    untraced one, and side_by_side writes NaN for a run left out: that table is made only when some run has a step
    time."""
    if not any(
        (meta.get("step_time") or {}).get("median_s") for meta in trace.runs.values()
    ):  # as reports.mfu reads it
        return {}
    from reports.flops.mfu import mfu_table
    from reports.flops.rows import Frame
    from reports.sql.flops import table

    try:
        found = mfu_table(Frame(table(trace, mfu_only=True), trace.runs))
    except ReportError:
        return {}
    runs, mfu = (found.column(c).to_pylist() for c in ("run", "mfu"))
    return {run: math.nan if m is None else 100.0 * float(m) for run, m in zip(runs, mfu)}


def mfu_of_rows(df):
    """{run: MFU in percent} from reports.mfu over a DataFrame of rows, or {} when MFU cannot be computed from it
    (the pandas oracle's, tests/oracles/compare.py)."""
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
    """One run's figures as compare.sql's views give them: `views` {view name: its rows of the run, run_index 0, as
    {column: numpy array}} (compare_by_phase, compare_by_op, compare_by_module, compare_recompute, compare_dtypes),
    `steps` {phase: steps it ran in} (reports.sql.engine.Trace.phase_steps), `train_steps` (the run's training
    steps), `mfu` (percent or NaN), `categories` ({memory category: bytes live at the run's peak}, reports.by_category;
    a str saying why where it could not be computed). A baseline file (reports.baseline) stores exactly these, so its
    tables are the trace's. `rank` and `job`: the run's rank and which distributed trace it is a rank of (a key equal
    for the ranks of one trace), None for a trace of one process and a baseline file (reports.compare.baselines_of
    pairs runs by them)."""

    VIEWS = VIEWS

    def __init__(self, name, views, steps, train_steps, mfu, categories=None, rank=None, job=None):
        self.name, self.views, self.steps = name, views, dict(steps)
        self.train_steps, self.mfu = int(train_steps), float(mfu)
        self.categories = categories if isinstance(categories, str) else dict(categories or {})
        self.rank, self.job = rank, job

    def per_step(self, totals, figures, keys=()):
        """reports.sql.per_step.per_step_arrays of a view's rows of this run ({column: array}): ([key tuple],
        {figure: float64 array}), one row without keys."""
        arrays = {
            c: np.asarray(totals[c], dtype=np.float64) if c in figures else totals[c]
            for c in ("run_index", "phase", *keys, *figures, "first_seq")
            if c in totals
        }
        return per_step_arrays({0: self.steps}, 1, arrays, figures, keys)[0]


def _arrays(table):
    """{column: numpy array} of an Arrow table of a view: numbers as numpy (an integer column holding a null as
    float64 NaN, as DuckDB's fetchdf gives it), text as objects (None: null)."""
    out = {}
    for name in table.column_names:
        column = table.column(name)
        text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        out[name] = objects_of(column) if text else values_of(column)
    return out


def _fetch(trace, query):
    """The rows of `query` over `trace` as {column: numpy array}; a DECIMAL or HUGEINT sum cast to DOUBLE by DuckDB,
    as its fetchdf converts it."""
    found = trace.db.sql(query)
    wide = ("decimal", "hugeint", "uhugeint")
    cast = [f'CAST("{c}" AS DOUBLE) AS "{c}"' if t.id in wide else f'"{c}"' for c, t in zip(found.columns, found.types)]
    return _arrays(trace.arrow(f"SELECT {', '.join(cast)} FROM ({query})"))


def _where(arrays, mask):
    return {c: a[mask] for c, a in arrays.items()}


_RANK_RUN = re.compile(r"^(?P<job>.*)/rank=(?P<rank>[0-9]+)(?P<copy>#[0-9]+)?$")


def _rank_of(name, rank):
    """(rank, job) of a run of a Trace (its rank, reports.sql.engine.Trace.ranks, and its name): a run named like a
    rank of a distributed trace by reports.loading.load.run_name ("a/rank=1", "a/rank=1#2" for a second copy) is a
    rank of the job "a" ("a#2"); any other run (None, None)."""
    found = _RANK_RUN.match(name) if rank is not None else None
    if found is None or int(found["rank"]) != int(rank):
        return None, None
    return int(rank), found["job"] + (found["copy"] or "")


def figures(trace):
    """[Figures] of every run of `trace` (a reports.sql.engine.Trace), in run order."""
    views = {}
    for view in Figures.VIEWS:
        order = "run_index, first_seq" + ("" if view == "compare_dtypes" else ", phase")
        views[view] = _fetch(trace, f"SELECT * FROM {view} ORDER BY {order}")
    counts = {int(r["run_index"]): r for r in trace.run_rows}
    steps, mfu, categories = trace.phase_steps(), mfu_pct(trace), _categories(trace)
    out = []
    for i, run in enumerate(trace.runs):
        found = counts.get(i)
        fb, traced = (int(found["fb_steps"]), int(found["steps_traced"])) if found is not None else (0, 0)
        mine = {}
        for v, arrays in views.items():
            mine[v] = _where(arrays, np.asarray(arrays["run_index"]) == i)
            mine[v]["run_index"] = np.zeros(len(mine[v]["run_index"]), dtype=np.int32)
        mem = categories if isinstance(categories, str) else categories.get(run, {})
        rank, job = _rank_of(run, trace.ranks[i])
        out.append(Figures(run, mine, steps[i], max(1, fb or traced), mfu.get(run, np.nan), mem, rank, job))
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


_FIGURES = ("ops", "flops", "bytes_allocated", "duration_ns")
_NAMES = {
    "ops": "ops_per_step",
    "flops": "flops_per_step",
    "bytes_allocated": "bytes_allocated_per_step",
    "duration_ns": "traced_us_per_step",
}


def table_of(run, by, depth=None):
    """One run's RunTable (reports.compare.Figures): the "total" row first, then each key per step, its peak."""
    totals = keyed(run.views[f"compare_by_{by}"], by, depth)
    phases = run.views["compare_by_phase"]
    _, total = run.per_step(phases, _FIGURES)
    found, table = run.per_step(totals, _FIGURES, keys=("key",))
    keys = [k for (k,) in found]
    peaks = {}
    for key, peak in zip(totals["key"], np.asarray(totals["peak_live_bytes"], dtype=np.float64)):
        peaks.setdefault(key, []).append(peak)
    out = {_NAMES[c]: np.concatenate([total[c], table[c]]) for c in _FIGURES}
    out["traced_us_per_step"] = out["traced_us_per_step"] / 1000.0
    out["peak_live_bytes"] = np.array([largest(phases["peak_live_bytes"]), *(largest(peaks[k]) for k in keys)])
    return RunTable([TOTAL, *keys], out, run.train_steps)


def of_sources(items, found):
    """[Figures] of `items` in their order: a reports.compare.Figures as given, a baseline file's run (reports.baseline),
    and every run of a trace path, taken in order from `found` (the Figures of every run of the traces among `items`,
    reports.compare.figures): one for a trace of one process, one per rank for a distributed trace (`rank=R`
    directories: reports.loading.load.runs_with_ranks). A baseline's run named like a traced run is renamed
    "<name> (baseline)". A rank's Figures take the rank and, as job, the item's position (two copies of one
    distributed trace are two jobs). ReportError for a traced run of no ops: its figures would all read as falls
    of 100%."""
    found, kept = iter(found), []  # (Figures, read from a baseline file?)
    for n, item in enumerate(items):
        if isinstance(item, Figures):
            kept.append((item, False))
        elif is_baseline(item):
            kept.append((Figures(**load_baseline(item)), True))
        else:
            for path, rank in runs_with_ranks([item]):
                run = next(found)
                run.rank, run.job = (None, None) if rank is None else (rank, n)
                if not _has_ops(run):
                    raise ReportError(
                        f"{path}: the trace has no ops (nothing ran inside `with Tracer(...)`); nothing to compare"
                    )
                kept.append((run, False))
    traced = {r.name for r, b in kept if not b}
    for r, b in kept:
        if b and r.name in traced:
            r.name = f"{r.name} (baseline)"
    return [r for r, _ in kept]


def _is_frame(rows):
    pd = sys.modules.get("pandas")  # a DataFrame comes only from pandas, then imported
    return pd is not None and isinstance(rows, pd.DataFrame)


def runs_of_sources(df_or_paths, by="phase"):
    """[Figures] of every run `df_or_paths` holds: paths of traces and baseline files, a Trace, a DataFrame from
    reports.load or an Arrow table of rows with a `run` column. A baseline's run named like another run is renamed
    "<name> (baseline)"."""
    rows = df_or_paths
    if isinstance(rows, (str, os.PathLike)):
        rows = [rows]
    if isinstance(rows, (list, tuple)):
        from reports.sql.engine import Trace

        rows = [r if isinstance(r, Figures) else os.fspath(r) for r in rows]
        paths = [p for p in rows if not isinstance(p, Figures) and not is_baseline(p)]
        trace = Trace(paths, columns=columns(by)) if paths else None
        try:
            found = figures(trace) if trace is not None else []
        finally:
            if trace is not None:
                trace.close()
        return of_sources(rows, found)
    if _is_frame(rows):
        require(rows, (*_REQUIRED, by), "compare")
        runs_of(rows)  # a frame from reports.load, or a one-line error
    elif not isinstance(rows, pa.Table) and not hasattr(rows, "per_step"):
        raise ReportError(f"compare: expected a DataFrame from reports.load or trace paths, got {type(rows).__name__}")
    if hasattr(rows, "per_step"):  # a Trace, left open
        return figures(rows)
    trace = memory_trace(rows, "compare", (*_REQUIRED, by), columns(by), grains=True)  # grains: the memory model's
    try:
        found = figures(trace)
    finally:
        trace.close()
    # a run of the metadata with no row here (a frame filtered to one rank of a distributed trace) is no run to
    # compare: as a baseline of zeros it gave every figure of the others a change of +inf%. Rows of no run at all
    # keep every run (the empty table, typed as a full one)
    return [r for r in found if _has_ops(r)] or found


def _has_ops(run):
    """Whether the Figures `run` holds an op (compare_by_phase has a row)."""
    return bool(len(next(iter(run.views["compare_by_phase"].values()), ())))


def compare(df_or_paths, by="phase", baseline=None, depth=None):
    """Runs side by side by phase, op or module, with signed changes against the baseline run.

    df_or_paths  a DataFrame from reports.load holding several runs (or an Arrow table of their
                 rows with a `run` column), paths of traces and of baseline files (reports.baseline),
                 a reports.sql.engine.Trace, or a list of reports.compare.Figures
    by           "phase", "op" or "module"
    baseline     the run the changes are against (its name); default the first run. When it is a rank
                 of a distributed trace, each run is compared with that trace's run of its rank
                 (reports.compare.baselines_of) and that trace's runs are baselines
    depth        by module: keep the first `depth` names of each module path (a module and its submodules)
    See the module docstring for the columns. The figures are compare.sql's views, run over the
    frame's rows (reports.sql.frame) or over the traces' files; the table is `optrace compare`'s
    (side_by_side_runs), made a DataFrame."""
    check_by(by)
    check_depth(depth)
    runs = runs_of_sources(df_or_paths, by)
    return frame_of(side_by_side_runs(runs, by, baseline, depth), by)


def side_by_side_runs(runs, by, baseline=None, depth=None):
    """The compare table ({column: numpy array}, reports.compare_table.side_by_side) of [Figures], each run against
    its baseline (reports.compare.baselines_of)."""
    names = [r.name for r in runs]
    pairs = baselines_of(runs, baseline)
    tables = {r.name: table_of(r, by, depth) for r in runs}
    return side_by_side(tables, names, pairs, {r.name: r.mfu for r in runs}, by)


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
