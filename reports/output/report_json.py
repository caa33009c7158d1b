"""The sections of `optrace report` as JSON-ready objects: the keys `report --json` adds to the summary
(reports.output.cli.summary), each the same table the text report prints, with raw numbers.

Numbers are plain JSON numbers, never humanised; a value that cannot be known is null; an infinite
value is the string "inf" or "-inf" (JSON has no infinity), so null never hides one. See docs/cli.md's
table of `--json` keys."""

import math
import sys

from reports.errors import ReportError
from reports.output.table import first_row, values
from reports.output.text import json_number

__all__ = ["json_value", "records", "sections", "strict"]


def json_value(value):
    """A JSON-ready value: numpy scalars to Python, NaN/NA to None, +-inf to "inf"/"-inf", strings as they are."""
    if value is None or isinstance(value, (str, bool)):
        return value
    pd = sys.modules.get("pandas")  # pandas' NA and NaT come only from a DataFrame: no pandas, none of them
    if pd is not None:
        try:
            if pd.isna(value):
                return None
        except (TypeError, ValueError):
            pass
    value = json_number(value)
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def strict(obj):
    """`obj` (dicts, lists, numbers) with every NaN turned to None and every infinity to "inf"/"-inf":
    what json.dumps(allow_nan=False) accepts."""
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return json_value(obj)
    return obj


def records(frame, columns=None):
    """A table's rows (a pyarrow Table or a DataFrame) as a list of {column: json_value}."""
    if hasattr(frame, "column_names"):
        columns = list(frame.column_names if columns is None else columns)
        return [{c: json_value(v) for c, v in row.items()} for row in frame.select(columns).to_pylist()]
    columns = list(frame.columns if columns is None else columns)
    return [{c: json_value(v) for c, v in zip(columns, row)} for row in frame[columns].itertuples(index=False)]


def _breakdown(src, accounts):
    try:
        table = src.breakdown(accounts)
    except ReportError as exc:  # traced without model= or tokens=
        return {"available": False, "reason": str(exc)}
    columns = [
        "phase",
        "flops",
        "expected_flops",
        "ratio",
        "weight_matmul_flops",
        "attention_flops",
        "external_weight_flops",
        "other_flops",
    ]
    return {
        "available": True,
        "unit": "FLOPs per step",
        "n_kind": str(first_row(table)["n_kind"]),
        "rows": records(table, [c for c in columns if c in table.column_names]),
        "explain": [str(line) for line in src.explain(accounts)],
    }


def _mfu(src, peak_tflops, step_time_s):
    rate = src.mfu(step_time_s, peak_tflops * 1e12 if peak_tflops is not None else None)
    keys = (
        "mfu",
        "hfu",
        "mfu_of_achievable",
        "achieved_flops_per_s",
        "step_time_s",
        "peak_flops_per_s",
        "peak_source",
        "dtype",
        "model_flops_per_step",
        "hardware_flops_per_step",
    )
    out = {k: json_value(rate[k]) for k in keys if k in rate}
    above = [k for k in ("mfu", "hfu") if _above_one(rate.get(k))]  # from the numbers: json_value makes inf "inf"
    out["above_100_pct"] = above  # outside the model: a step time or peak that cannot be right
    return out


def _above_one(value):
    """Whether a figure is a number above 1 (inf included; None, NA and NaN are not)."""
    try:
        return value is not None and float(value) > 1
    except (TypeError, ValueError):
        return False


def _top_ops(src, top):
    return {"unit": "per step", "rows": records(src.top_ops(top))}


def _top_modules(src, top, depth):
    from reports.output.headline import top_modules

    mods = top_modules(src, depth, top)
    return {
        "unit": "totals over all traced steps, children rolled up",
        "depth": depth,  # modules down to this depth (0: the root; --depth)
        "rows": records(mods, ["module", "depth", "subtree_flops", "subtree_flops_pct"]),
    }


def _roofline(src, top):
    table, split = src.roofline_with_split()
    table = table.slice(0, top)
    if not any(b != "other" for b in values(table, "bound")):
        return {
            "available": False,
            "reason": "no roof: record Tracer.set_bandwidth(tracer.memory_bandwidth()) on a CPU",
        }
    columns = [
        "op",
        "dtype",
        "ops_per_step",
        "flops_per_step",
        "bytes_per_step",
        "arithmetic_intensity",
        "time_s_per_step",
        "achieved_flops_per_s",
        "attainable_flops_per_s",
        "bound",
        "efficiency",
    ]
    rows = records(table, columns)
    for row in rows:
        row["above_roof"] = isinstance(row["efficiency"], (int, float)) and row["efficiency"] > 1
    return {
        "available": True,
        "unit": "per step; time_s_per_step from busy_ns; bytes are algorithmic",
        "peak_flops_per_s": json_value(_largest(values(table, "peak_flops_per_s"))),
        "peak_bytes_per_s": json_value(values(table, "peak_bytes_per_s")[0]),
        "rows": rows,
        "above_roof_note": "efficiency > 1 is outside the roofline's model: the bandwidth roof is a DRAM triad, "
        "and small tensors stay in cache",
        "split": records(split, ["bound", "ops", "time_s", "time_pct", "roof_time_s"]),
        "split_unit": "per step",
    }


def _largest(numbers):
    """The largest of `numbers` that is known (a Series' max: NaN and None skipped), NaN when none is."""
    known = [v for v in numbers if v is not None and v == v]
    return max(known) if known else math.nan


def _memory(src):
    top = src.peak()
    return {
        "peak": {
            "peak_live_bytes": json_value(top["peak_live_bytes"]),
            "seq": json_value(top["seq"]),
            "step": json_value(top["step"]),
            "op": top["op"],
            "phase": top["phase"],
            "module": top["module"],
        },
        "categories": {str(r["category"]): json_value(r["bytes"]) for r in src.categories().to_pylist()},
    }


def _views(src, top):
    from reports.output.report_text import copies, kinds

    v = src.views()
    return {
        "unit": "totals over all traced steps",
        "kinds": records(kinds(v)),
        "copies": [{c: json_value(r[c]) for c in ("op", "ops", "bytes_allocated")} for r in copies(v, top)],
    }


def sections(meta, accounts, peak_tflops, step_time_s, top, src, depth=2):
    """The keys `report --json` adds to the summary: every section of the text report. `src`: where the
    tables come from (reports.output.source.Source: the SQL engine or the frame)."""
    return {
        "error": meta.get("error"),  # the exception the traced code raised, or null
        "breakdown": _breakdown(src, accounts),
        "mfu_details": _mfu(src, peak_tflops, step_time_s),
        "top_ops": _top_ops(src, top),
        "top_modules": _top_modules(src, top, depth),
        "roofline": _roofline(src, top),
        "memory": _memory(src),
        "views": _views(src, top),
    }
