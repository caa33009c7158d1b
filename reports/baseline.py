"""A trace's compare figures in a small JSON file, so CI compares against a committed file instead of an old trace.

    optrace compare --save-baseline base.json runs/model        # once (reports.compare.save_baseline), commit it
    optrace compare base.json runs/model --fail-if 'flops>+1%'  # in CI

The file holds one run's reports.compare.Figures: the rows of compare.sql's views for that run (totals per key and
phase, integers), the steps each phase ran in, the training steps and MFU. reports.compare computes from them
exactly what it computes from the trace itself, so a baseline file and the trace it was saved from give the same
table, the same words and the same gate. Its keys:

  format        "optrace-compare-baseline"
  version       1
  run           the run's name
  trace         the path the figures were read from
  steps         {phase: steps it ran in}
  train_steps   the run's training steps (the per-step divisor of compare's `steps` column)
  mfu_pct       MFU in percent, or null
  categories_at_peak  {memory category: bytes live at the run's peak} (reports.by_category), or a line saying why
                it is not known
  views         {view: {"columns": [...], "rows": [[...], ...]}}: compare_by_phase, compare_by_op, compare_by_module, compare_recompute,
                compare_dtypes (reports/sql/compare.sql), a row per line
"""

import json
import math
import os

import numpy as np

from reports.errors import ReportError
from tracer.schema import PHASES

__all__ = ["FORMAT", "VERSION", "VIEWS", "is_baseline", "load_baseline", "write_baseline"]

# reports.compare.Figures' views, in the file's order
VIEWS = ("compare_by_phase", "compare_by_op", "compare_by_module", "compare_recompute", "compare_dtypes")
FORMAT = "optrace-compare-baseline"
VERSION = 1


def is_baseline(path):
    """Whether `path` names a baseline file rather than a trace: a file whose name ends in .json."""
    return str(path).endswith(".json") and os.path.isfile(path)


def _value(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) else float(v)
    return v


def _records(view):
    """A view's rows of the run ({column: numpy array}) as the file stores them."""
    cols = [c for c in view if c not in ("run", "run_index")]
    return {"columns": cols, "rows": [[_value(v) for v in row] for row in zip(*(view[c] for c in cols))]}


def _column(values):
    """A numpy array of a view's column as the file stores it: whole numbers int64 (float64, NaN for null, where one
    is null), numbers float64, text objects (None: null)."""
    known = [v for v in values if v is not None]
    if known and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in known):
        if len(known) == len(values) and all(isinstance(v, int) for v in known):
            return np.array(values, dtype=np.int64)
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _dumps(data):
    """`data` as JSON, a view's row per line (a committed baseline diffs line by line)."""
    head = json.dumps({k: v for k, v in data.items() if k != "views"}, indent=1, allow_nan=False)
    views = []
    for name, view in data["views"].items():
        rows = ",\n".join("   " + json.dumps(r, allow_nan=False) for r in view["rows"])
        views.append(
            f'  {json.dumps(name)}: {{"columns": {json.dumps(view["columns"])}, "rows": ['
            + ("\n" + rows if rows else "")
            + "]}"
        )
    return head[:-2] + ',\n "views": {\n' + ",\n".join(views) + "\n }\n}\n"


def _phase_order(phase):
    return (PHASES.index(phase), "") if phase in PHASES else (len(PHASES), str(phase))


def write_baseline(run, path, source):
    """Write `run` (a reports.compare.Figures read from the trace `source`) to `path` (JSON)."""
    data = {
        "format": FORMAT,
        "version": VERSION,
        "run": run.name,
        "trace": os.fspath(source),
        # in PHASES' order (the trace's phase_steps rows come in none): a file saved again from one trace is the same
        "steps": {k: int(run.steps[k]) for k in sorted(run.steps, key=_phase_order)},
        "train_steps": run.train_steps,
        "mfu_pct": _value(run.mfu),
        "categories_at_peak": run.categories,
        "views": {v: _records(run.views[v]) for v in VIEWS},
    }
    with open(path, "w", encoding="utf-8") as f:
        f.write(_dumps(data))


def load_baseline(path):
    """{name, views, steps, train_steps, mfu}: the reports.compare.Figures stored in the baseline file `path`;
    ReportError naming the file and what is wrong when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ReportError(f"compare: {path}: not a baseline file ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReportError(
            f'compare: {path}: not a baseline file (expected JSON with "format": "{FORMAT}", written by '
            "`optrace compare --save-baseline FILE TRACE`)"
        )
    if data.get("version") != VERSION:
        raise ReportError(f"compare: {path}: baseline version {data.get('version')!r}, expected {VERSION}")
    try:
        views = {}
        for view in VIEWS:
            stored = data["views"][view]
            rows, names = stored["rows"], list(stored["columns"])
            if any(len(row) != len(names) for row in rows):
                raise ValueError(f"{view}: a row of other than {len(names)} values ({', '.join(names)})")
            views[view] = {"run_index": np.zeros(len(rows), dtype=np.int32)}
            views[view].update({c: _column([row[n] for row in rows]) for n, c in enumerate(names)})
        mfu = data.get("mfu_pct")
        return {
            "name": str(data["run"]),
            "views": views,
            "steps": {str(k): int(v) for k, v in data["steps"].items()},
            "train_steps": int(data["train_steps"]),
            "mfu": np.nan if mfu is None else float(mfu),
            "categories": data.get("categories_at_peak", "memory by category: not in the baseline file"),
        }
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ReportError(f"compare: {path}: baseline file lacks or garbles {exc}") from None
