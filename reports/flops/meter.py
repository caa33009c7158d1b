"""The per-step table of a metered run (tracer.metering.meter): step time, tokens/s, MFU and HFU of every step.

A `Meter` traces one step per signature (input shapes and dtypes, modules run) and times
every step; the run metadata's `meter` holds the traced steps' FLOPs and every step's time.
MFU here is reports.mfu's definition applied to each step: model FLOPs (no recomputation)
/ the step's wall time / the dense peak for the dtype carrying most matmul FLOPs. A traced
step's time is traced time, so it has no MFU. A step whose signature was never traced has
no FLOPs (NaN), unless the Meter estimated them (past its `max_traces` cap, or at close): the
nearest traced signature's FLOPs scaled by the ratio of input elements, optimizer FLOPs
unscaled, flagged `flops_estimated` and counted in the report.
"""

import os
import sys

import numpy as np

from reports.errors import ReportError
from tracer.schema import read_metadata

__all__ = ["COLUMNS", "meter", "meter_summary"]

_OUT = {
    "run": object,
    "step": "int64",
    "traced": bool,
    "flops_from_step": "Int64",
    "flops_estimated": bool,
    "step_time_s": "float64",
    "tokens": "float64",
    "tokens_per_s": "float64",
    "model_flops": "float64",
    "hardware_flops": "float64",
    "recompute_flops": "float64",
    "dtype": object,
    "peak_flops_per_s": "float64",
    "mfu": "float64",
    "hfu": "float64",
}
COLUMNS = tuple(_OUT)


def _runs(source):
    """{run: metadata} of a loaded DataFrame (reports.load), of a trace path (its metadata only), or given as such
    (a reports.sql.engine.Trace's `runs`)."""
    if isinstance(source, dict):
        return source
    pd = sys.modules.get("pandas")  # no DataFrame without pandas imported
    if pd is not None and isinstance(source, pd.DataFrame):
        runs = source.attrs.get("runs")
        if not runs:
            raise ReportError("meter: expected a DataFrame returned by reports.load or a trace path")
        return runs
    if not isinstance(source, (str, os.PathLike)):
        raise ReportError(f"meter: expected a trace path or a DataFrame from reports.load, got {type(source).__name__}")
    try:
        meta = read_metadata(source)
    except OSError as exc:  # a part that is no regular file (tracer.schema.NotRegular), or one that cannot be read
        raise ReportError(f"meter: {exc}") from None
    if not meta:
        raise ReportError(f"meter: {os.fspath(source)!r} holds no optrace trace")
    from reports.loading.load import escaped  # a trace path: read as reports.load names its run

    name = escaped(meta.get("run_name") or os.path.basename(os.path.normpath(os.fspath(source))))
    if "ranks" in meta:
        return {f"{name}/rank={r}": m for r, m in meta["ranks"].items()}
    return {name: meta}


def _rows(run, table):
    """{column: values} of one run's metered steps (the columns of COLUMNS; flops_from_step a list of ints and
    Nones)."""
    steps, traces = table.get("steps") or {}, table.get("traces") or []
    n = len(steps.get("step") or [])
    trace = np.asarray(steps.get("trace") or [], dtype=np.int64)
    known = trace >= 0

    def per_trace(key):
        values = np.asarray([np.nan if t.get(key) is None else float(t[key]) for t in traces] + [np.nan])
        return values[np.where(known, trace, len(traces))]  # the last entry: FLOPs unknown

    traced = np.asarray(steps.get("traced") or [], dtype=bool)
    seconds = np.asarray(steps.get("step_time_s") or [], dtype=np.float64)
    timed = np.where(traced, np.nan, seconds)  # traced time is not step time
    tokens = np.asarray([np.nan if t is None else t for t in steps.get("tokens") or []], dtype=np.float64)
    scale = np.asarray([np.nan if v is None else v for v in steps.get("scale") or [None] * n], dtype=np.float64)
    estimated = ~np.isnan(scale)
    factor = np.where(estimated, scale, 1.0)
    optimizer = np.where(estimated, np.nan_to_num(per_trace("optimizer_flops")), 0.0)  # not scaled with the batch
    model = np.round(per_trace("model_flops") * factor)  # as the Meter rounds its figures
    hardware = np.round((per_trace("hardware_flops") - optimizer) * factor + optimizer)
    peak = per_trace("peak_flops_per_s")
    with np.errstate(divide="ignore", invalid="ignore"):
        frame = {
            "run": [run] * n,
            "step": steps.get("step") or [],
            "traced": traced,
            "flops_from_step": [traces[t]["first_step"] if t >= 0 else None for t in trace],
            "flops_estimated": estimated,
            "step_time_s": seconds,
            "tokens": tokens,
            "tokens_per_s": tokens / timed,
            "model_flops": model,
            "hardware_flops": hardware,
            "recompute_flops": np.round(per_trace("recompute_flops") * factor),
            "dtype": [traces[t].get("dtype") if t >= 0 else None for t in trace],
            "peak_flops_per_s": peak,
            "mfu": model / timed / peak,
            "hfu": hardware / timed / peak,
        }
    return frame


def meter(source):
    """One row per metered step of every run: step, traced, flops_from_step (the first step of the
    trace its FLOPs come from), flops_estimated (scaled from that trace, see the module docstring),
    step_time_s, tokens, tokens_per_s, model_flops, hardware_flops, recompute_flops, dtype,
    peak_flops_per_s, mfu, hfu. `source`: a trace path, a DataFrame from
    reports.load, or its `attrs["runs"]` ({run name: metadata}). Empty (typed) for a trace without a Meter table."""
    import pandas as pd

    frames = [_rows(run, meta["meter"]) for run, meta in _runs(source).items() if isinstance(meta.get("meter"), dict)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _OUT.items()})
    frames = [pd.DataFrame({**f, "flops_from_step": pd.array(f["flops_from_step"], dtype="Int64")}) for f in frames]
    return pd.concat(frames, ignore_index=True).astype(_OUT)


def meter_summary(source):
    """The meter section of the report (`optrace report`, `--json`): None without a Meter table, else
    {steps, traced_steps, unknown_flops_steps, estimated_flops_steps, metered_steps, step_time_s, tokens_per_s,
    mfu, hfu, errors} with each figure's median, min and max over the metered steps that have it; `errors`:
    the meter's own bookkeeping failures over the runs (a step ended on another thread, a trace not read back),
    so a run whose steps all failed still has its section."""
    runs = _runs(source)
    tables = [meta["meter"] for meta in runs.values() if isinstance(meta.get("meter"), dict)]
    if not tables:
        return None
    errors = sum(int(t.get("errors") or 0) for t in tables)
    parts = [_rows(run, meta["meter"]) for run, meta in runs.items() if isinstance(meta.get("meter"), dict)]
    table = {
        c: np.concatenate([np.asarray(p[c]) for p in parts])
        for c in ("step", "traced", "flops_estimated", "model_flops", "step_time_s", "tokens_per_s", "mfu", "hfu")
    }
    traced = table["traced"].astype(bool)

    def spread(column):
        values = table[column].astype(np.float64)[~traced]
        values = values[~np.isnan(values)]
        if not len(values):
            return None
        return {"median": float(np.median(values)), "min": float(values.min()), "max": float(values.max())}

    return {
        "steps": len(traced),
        "traced_steps": [int(s) for s in table["step"][traced].tolist()],
        "unknown_flops_steps": int(np.isnan(table["model_flops"].astype(np.float64)).sum()),
        "estimated_flops_steps": int(table["flops_estimated"].astype(bool).sum()),
        "metered_steps": int((~traced).sum()),
        "step_time_s": spread("step_time_s"),
        "tokens_per_s": spread("tokens_per_s"),
        "mfu": spread("mfu"),
        "hfu": spread("hfu"),
        "errors": errors,
    }
