"""reports.compare's table over numpy arrays: one run's figures by key (RunTable, from the rows of compare.sql's
views), the runs side by side with signed changes against each run's baseline (side_by_side: {column: array}), and that
table as compare()'s DataFrame (frame_of) or as rows of Python values (rows_of, `optrace compare --json`).

A table of side_by_side holds the columns of reports.compare's docstring in order, each a numpy array: the key and
`run` objects (str), `steps` int64, every other column float64 (`peak_live_bytes` NaN where unknown: compare()'s
DataFrame holds it as Int64 and NA).
"""

import math

import numpy as np

from reports.errors import ReportError

__all__ = [
    "BY",
    "CHANGES",
    "TOTAL",
    "RunTable",
    "at_depth",
    "baselines_of",
    "check_baseline",
    "column_types",
    "frame_of",
    "keyed",
    "largest",
    "rows_of",
    "side_by_side",
    "signed_change",
]

BY = ("phase", "op", "module")
TOTAL = "total"
SUMS = ("ops", "flops", "bytes_allocated", "traced_us")
CHANGES = ("ops", "flops", "bytes_allocated", "peak_live_bytes", "traced_us")


def column_types(by):
    """The table's columns with the dtypes of compare()'s DataFrame."""
    return {
        by: "object",
        "run": "object",
        "steps": "int64",
        **{f"{m}_per_step": "float64" for m in SUMS},
        "peak_live_bytes": "Int64",
        "mfu_pct": "float64",
        **{f"{m}_change_pct": "float64" for m in CHANGES},
        "change_pct": "float64",
    }


class RunTable:
    """One run's figures by key: `keys` (the "total" row first), `columns` {ops_per_step, flops_per_step,
    bytes_allocated_per_step, traced_us_per_step, peak_live_bytes: float64 array over the keys}, `steps` (the run's
    training steps)."""

    def __init__(self, keys, columns, steps):
        self.keys, self.columns, self.steps = list(keys), columns, int(steps)


def at_depth(module, depth):
    """A module path cut to its first `depth` names ("layers.0.attn" at 2: "layers.0"); '' stays ''."""
    return ".".join(module.split(".")[:depth]) if depth else module


def largest(values):
    """The largest of `values` leaving NaN out (as pandas' max does), NaN when none is known."""
    values = np.asarray(values, dtype=np.float64)
    known = values[~np.isnan(values)]
    return float(known.max()) if len(known) else math.nan


def keyed(totals, by, depth):
    """A compare_by_* view's rows ({column: array}); by module at `depth`: summed per (run_index, module cut to
    `depth`, phase), the peak their largest and first_seq their least, in order of first_seq, then phase."""
    if by != "module" or not depth or not len(totals["key"]):
        return totals
    groups = {}
    for n, (run_index, module, phase) in enumerate(zip(totals["run_index"].tolist(), totals["key"], totals["phase"])):
        groups.setdefault((run_index, at_depth(module, depth), phase), []).append(n)
    rows = []
    for (run_index, key, phase), at in groups.items():
        sums = (math.fsum(np.asarray(totals[c][at], np.float64)) for c in ("flops", "bytes_allocated", "duration_ns"))
        ops, seq = int(sum(totals["ops"][at].tolist())), int(min(totals["first_seq"][at].tolist()))
        rows.append((run_index, key, phase, ops, *sums, largest(totals["peak_live_bytes"][at]), seq))
    rows.sort(key=lambda r: (r[-1], r[2]))  # stable: by first_seq, then phase
    kinds = {
        "run_index": np.int64,
        "key": object,
        "phase": object,
        "ops": np.int64,
        **dict.fromkeys(("flops", "bytes_allocated", "duration_ns", "peak_live_bytes"), np.float64),
        "first_seq": np.int64,
    }
    out = {}
    for n, (name, kind) in enumerate(kinds.items()):
        out[name] = np.empty(len(rows), dtype=object) if kind is object else np.zeros(len(rows), dtype=kind)
        out[name][:] = [r[n] for r in rows]
    return out


def check_baseline(baseline, runs):
    """The baseline run's name: the first run by default."""
    if baseline is None:
        return runs[0]
    if baseline not in runs:
        raise ReportError(f"compare: baseline {baseline!r} is not one of the runs {runs}")
    return baseline


def baselines_of(runs, baseline=None):
    """{run name: the name of the run its changes are against} of [reports.compare.Figures]. The baseline run is
    `baseline` (default the first run). When it is a rank of a distributed trace (Figures.job), each run of that
    trace is a baseline of its own (against itself: no change) and a run of another trace is compared with the
    baseline trace's run of its rank (b/rank=1 against a/rank=1); a run of one process, or of a rank the baseline
    trace lacks, is compared with `baseline`. Else, or when every run is of that trace (its ranks, alone: nothing to
    pair them with), every run is compared with `baseline`."""
    names = [r.name for r in runs]
    first = check_baseline(baseline, names)
    job = runs[names.index(first)].job
    if job is None or all(r.job == job for r in runs):
        return dict.fromkeys(names, first)
    ranks = {r.rank: r.name for r in runs if r.job == job}
    return {r.name: r.name if r.job == job else ranks.get(r.rank, first) if r.rank is not None else first for r in runs}


def _own_keys(table, by):
    """`table` with a key named like the whole-run row (a module named `total`) renamed "total (module)"."""
    if TOTAL not in table.keys[1:]:
        return table
    keys = table.keys[:1] + [f"{TOTAL} ({by})" if k == TOTAL else k for k in table.keys[1:]]
    return RunTable(keys, table.columns, table.steps)


def signed_change(value, base):
    """Signed percent change of `value` against `base` (arrays): +inf for x / 0 (x > 0), 0 for 0 / 0, NaN where
    either is unknown."""
    value, base = np.asarray(value, dtype=np.float64), np.asarray(base, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 100.0 * (value - base) / base
    out = np.where((base == 0) & (value == 0), 0.0, out)
    return np.where(np.isnan(value) | np.isnan(base), np.nan, out)


def _aligned(table, where):
    """`table`'s columns over the keys `where` ({key: position}): NaN for a key it lacks, its sums 0 there."""
    at = np.array([where[k] for k in table.keys], dtype=np.int64)
    out = {}
    for name, values in table.columns.items():
        out[name] = np.full(len(where), np.nan)
        out[name][at] = values
        if name != "peak_live_bytes":
            out[name] = np.where(np.isnan(out[name]), 0.0, out[name])
    return out


def side_by_side(tables, runs, baseline, mfu, by):
    """The compare table ({column: array}) from each run's RunTable `tables` {run: RunTable}, `mfu` {run: MFU in
    percent}: signed changes against `baseline` (a run's name, or {run: its baseline run}:
    reports.compare.baselines_of), change_pct; the total rows first, then the keys by their largest |change_pct|,
    each key's rows in run order."""
    pairs = baseline if isinstance(baseline, dict) else dict.fromkeys(runs, baseline)
    tables = {run: _own_keys(t, by) for run, t in tables.items()}
    keys = list(dict.fromkeys(k for t in tables.values() for k in t.keys))
    where = {k: i for i, k in enumerate(keys)}
    total, n = where[TOTAL], len(keys)
    aligned = {run: _aligned(tables[run], where) for run in dict.fromkeys([*runs, *pairs.values()])}
    parts = []
    for run in runs:
        table, base = dict(aligned[run]), aligned[pairs[run]]
        table["steps"] = np.full(n, tables[run].steps, dtype=np.int64)
        table["mfu_pct"] = np.full(n, np.nan)
        table["mfu_pct"][total] = mfu.get(run, np.nan)
        for m in CHANGES:
            column = m if m == "peak_live_bytes" else f"{m}_per_step"
            table[f"{m}_change_pct"] = signed_change(table[column], base[column])
        change = np.zeros(n)
        for m in ("flops", "bytes_allocated"):
            column = f"{m}_per_step"
            whole = base[column][total]
            if whole:
                moved = (table[column] - base[column]) / whole
                change = np.where(np.abs(moved) > np.abs(change), moved, change)
        table["change_pct"] = 100.0 * change
        table[by] = np.empty(n, dtype=object)
        table[by][:] = keys
        table["run"] = np.empty(n, dtype=object)
        table["run"][:] = [run] * n
        parts.append(table)
    out = {c: np.concatenate([p[c] for p in parts]) for c in column_types(by)}
    score = np.abs(np.stack([p["change_pct"] for p in parts])).max(axis=0)  # per key, its largest over the runs
    key_index, run_index = np.tile(np.arange(n), len(runs)), np.repeat(np.arange(len(runs)), n)
    order = np.lexsort((run_index, key_index, -score[key_index], key_index != total))
    return {c: a[order] for c, a in out.items()}


def frame_of(table, by):
    """The table of side_by_side as compare()'s DataFrame (imports pandas)."""
    import pandas as pd

    types = column_types(by)
    return pd.DataFrame({c: table[c] for c in types}).astype(types)


def _python(column, values):
    if values.dtype == object:
        return values.tolist()
    if column == "peak_live_bytes":  # a count: Int64 in the DataFrame
        return [None if v != v else int(v) for v in values.tolist()]
    return values.tolist()


def rows_of(table):
    """The table's rows as [{column: Python value}] (a NaN stays a float NaN; peak_live_bytes an int or None), as
    the DataFrame of frame_of holds them."""
    names = list(table)
    return [dict(zip(names, row)) for row in zip(*(_python(c, table[c]) for c in names))]
