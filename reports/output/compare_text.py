"""`optrace compare`'s output: what changed in words, a table of signed changes, the gate's breaches; --json.

Text, for runs fp32 (the baseline) and bf16:

    optrace compare: bf16 against fp32 (baseline); per step, except peak_live
    What changed in bf16:
      totals: FLOPs/step +0.0%, bytes allocated/step -14.4%, ...
    <table: key, run, ops/step, ±ops, flops/step, ±flops, alloc/step, ±alloc, peak_live, ±peak>
    Gate: 2 checks, 1 breached

Each ± is the signed change against the baseline's value of the same key ("new": the baseline has none). When the
baseline is a distributed trace, each run is compared with its run of the same rank (reports.compare.baselines_of),
and the first line says which run is against which.
"""

import math

from reports.compare_table import rows_of
from reports.output.report_json import json_value, records
from reports.output.text import column_formatters, printable

__all__ = ["COMPARE_COLUMNS", "compare_json", "compare_text"]

# What each column of `compare` holds (reports.compare's docstring, in short): `compare --json` carries it.
COMPARE_COLUMNS = {
    "run": "the run's name",
    "steps": "training steps of the run (the per-step divisor)",
    "ops_per_step": "aten ops per step",
    "flops_per_step": "analytic FLOPs per step (2 per multiply-add)",
    "bytes_allocated_per_step": "bytes of the storages the ops created, per step",
    "traced_us_per_step": "the ops' duration under the tracer per step, microseconds (slowed by tracing: "
    "for ranking, not speed)",
    "peak_live_bytes": "the highest live bytes after any op of the key (not per step)",
    "mfu_pct": "MFU in percent, on the total rows only; null where it cannot be known",
    "ops_change_pct": "signed change of ops_per_step against the baseline's, same key, in percent",
    "flops_change_pct": "signed change of flops_per_step against the baseline's, in percent",
    "bytes_allocated_change_pct": "signed change of bytes_allocated_per_step against the baseline's, in percent",
    "peak_live_bytes_change_pct": "signed change of peak_live_bytes against the baseline's, in percent",
    "traced_us_change_pct": "signed change of traced_us_per_step against the baseline's, in percent",
    "change_pct": "signed change of FLOPs or bytes allocated (whichever moved more) against the baseline, in "
    "percent of the baseline run's total per step; keys are ordered by its size",
}

# the text's columns: (the --json name, its header)
_SHOWN = (
    ("ops_per_step", "ops/step"),
    ("ops_change_pct", "±ops"),
    ("flops_per_step", "flops/step"),
    ("flops_change_pct", "±flops"),
    ("bytes_allocated_per_step", "alloc/step"),
    ("bytes_allocated_change_pct", "±alloc"),
    ("peak_live_bytes", "peak_live"),
    ("peak_live_bytes_change_pct", "±peak"),
)


def _signed(v):
    if v is None or v != v:
        return "N/A"
    if math.isinf(v):
        return "new" if v > 0 else "-inf"
    return f"{v:+.1f}%"


def _arrow(table, by, keys, bases):
    """The rows of `keys` of the compare table ({column: numpy array}) with the text's columns, as a pyarrow Table
    (reports.arrays: no pandas), and their formatters: a change of the rows of a baseline (a run of `bases`) left
    blank."""
    import numpy as np
    import pyarrow as pa

    from reports.arrays import arrow_of, strings

    kept = set(keys)
    at = np.flatnonzero([k in kept for k in table[by]])
    is_base = [r in bases for r in table["run"][at]]
    data = {by: strings(table[by][at]), "run": strings(table["run"][at])}
    for column, _ in _SHOWN:
        values = np.asarray(table[column][at], dtype=np.float64)
        if column.endswith("_change_pct"):  # the baseline's own rows: no change to show
            data[column] = strings(["" if b else _signed(v) for b, v in zip(is_base, values.tolist())])
        else:
            data[column] = arrow_of(values)
    shown = pa.table(data)
    formatters = column_formatters(shown)
    for column, _ in _SHOWN:
        if column.endswith("_change_pct"):
            formatters.pop(column, None)
    return shown, formatters


def _against(runs, pairs):
    """The first line's "X, Y against A" for each baseline A (reports.compare.baselines_of's `pairs`), and the
    baselines."""
    bases = [r for r in runs if pairs[r] == r]
    against = {}
    for r in runs:
        if pairs[r] != r:
            against.setdefault(pairs[r], []).append(printable(r))
    said = "; ".join(f"{', '.join(others)} against {printable(base)}" for base, others in against.items())
    return said, bases


def compare_text(table, runs, baseline, by, words, top, rules=(), breaches=(), baselines=None):
    """The text `optrace compare` prints (a str) of the compare table ({column: numpy array},
    reports.compare_table.side_by_side); `baselines` {run: its baseline run} (reports.compare.baselines_of;
    default every run against `baseline`)."""
    from reports.output.table import render

    pairs = baselines or dict.fromkeys(runs, baseline)
    said, bases = _against(runs, pairs)
    if len(bases) == 1:
        head = f"{said} (baseline)"
    else:  # a distributed trace's ranks, each the baseline of the other traces' run of its rank
        head = f"{said} (baselines by rank: {', '.join(printable(b) for b in bases)})"
    lines = [f"optrace compare: {head}; per step, except peak_live"]
    for run, said in words.items():
        lines.append(f"What changed in {printable(run)}:")
        lines += [f"  {printable(w)}" for w in said]
    keys = list(dict.fromkeys(table[by]))[:top]  # whole keys: a run's row never cut from its pair
    shown, formatters = _arrow(table, by, keys, set(bases))
    header = [by, "run", *(h for _, h in _SHOWN)]
    text = render(shown, formatters, "", header)
    lines.append(text)
    if len(bases) == 1:
        base = printable(bases[0])
        lines.append(
            f"±: signed change against {base}'s value for the same {by} (new: {base} has none); alloc: bytes allocated"
        )
    else:
        lines.append(
            f"±: signed change against the value of the run's baseline (first line) for the same {by} (new: the "
            "baseline has none); alloc: bytes allocated"
        )
    if rules:
        lines.append(f"Gate: {len(rules)} check{'s' if len(rules) != 1 else ''}, {len(breaches)} breached")
        lines += [f"  BREACH {printable(b)}" for b in breaches]
    return "\n".join(lines)


def compare_json(table, runs, by, baseline=None, words=None, rules=(), breaches=(), baselines=None):
    """`compare --json`: one object with the runs, the baseline, each run's baseline ({run: its baseline run},
    reports.compare.baselines_of; a baseline run maps to itself), the column meanings, the rows, the words and the
    gate. `table` the compare table ({column: numpy array}) or compare()'s DataFrame."""
    runs = list(runs)
    baseline = baseline or runs[0]
    out = {
        "by": by,
        "runs": runs,
        "baseline": baseline,
        "baselines": dict(baselines or dict.fromkeys(runs, baseline)),
        "columns": {by: f"the {by} ('total': the whole run)", **COMPARE_COLUMNS},
        "note": 'a change x / 0 is the string "inf"; null is a value that cannot be known (a peak of a key with no op, '
        "MFU without a step time)",
        "rows": records(table)
        if hasattr(table, "columns")
        else [{c: json_value(v) for c, v in row.items()} for row in rows_of(table)],
    }
    if words is not None:
        out["changes"] = words
    out["gate"] = {
        "checks": [r.text for r in rules],
        "breaches": [
            {
                "rule": b.rule,
                "run": b.run,
                "key": b.key,
                "metric": b.metric,
                "value": json_value(b.value),
                "baseline_value": json_value(b.base),
                "change": json_value(b.change),
                "percent": b.percent,
                "message": str(b),
            }
            for b in breaches
        ],
        "passed": not breaches,
    }
    return out
