"""A roofline of every op: is each op kind limited by the device's FLOP/s or by its memory bandwidth?

Figures are per training step (reports/steps.py `per_step`: each phase's total over the
steps it ran in, summed over phases), so they sit beside the breakdown's; k identical
steps give exactly the figures of one.

    ops_per_step          ops of the kind in a step
    flops_per_step        analytic FLOPs (2 per multiply-add)
    bytes_per_step        bytes_read + bytes_written: ALGORITHMIC bytes, the tensors an
                          op reads and writes, each once. Not DRAM traffic: caches,
                          fusion and recomputation inside a kernel change what
                          really moves. Views (is_view) count 0: they move nothing.
    arithmetic_intensity  flops / bytes (FLOPs per byte)
    time_s_per_step       the ops' time: busy_ns (GPU time with the idle gap before the
                          op removed, tracer.recording.timing), else duration_ns
    time_pct              the share of the step's op time
    achieved_flops_per_s  flops / time; achieved_bytes_per_s: bytes / time
    attainable_flops_per_s min(peak FLOP/s, intensity x bandwidth): the roof above the op
    bound                 "compute" when intensity >= the ridge point (peak / bandwidth),
                          "memory" below it (every op that moves bytes and does no
                          FLOPs: copies, fills, views that copy), "other" when the op
                          moves nothing (views, metadata) or a roof is unknown
    efficiency            achieved / attainable: achieved FLOP/s over peak when
                          compute-bound, achieved bytes/s over bandwidth when
                          memory-bound (the same ratio when flops > 0; defined for
                          zero-FLOP copies too)

Roofs: the peak FLOP/s of reports.peaks for the device and the op's dtype (dense
datasheet figure, or a CPU's ideal) and the peak bandwidth (datasheet HBM/GDDR figure,
or on a CPU the triad `tracer.memory_bandwidth` recorded); `peak_flops=` and
`bandwidth=` override both. Traced op times are what the op took under the tracer
(tracing slows the program between ops, not inside them), so per-op rates are fair;
on CUDA use timing="events" (the default), not "sync".

`roofline_split(df)` gives the step's op time split into compute-bound, memory-bound
and other ops, with `roof_time_s`, the time the ops would take at their roof: memory-
bound time far above its roof time is what fusing those ops could buy back.

Each table is a view of reports/sql/views.sql (roofline_op, roofline_shape, roofline_module, roofline_groups) run
by the one engine: over the trace's files for `optrace report` (a reports.sql.engine.Trace), over the rows of a
DataFrame or pyarrow Table for the library (reports.sql.frame); this module adds the roofs (device tables) and
divides the per-phase totals into per-step figures (reports.sql.engine.Trace.per_step).
"""

import numpy as np
import pandas as pd

from reports._util import empty_frame
from reports.errors import ReportError
from reports.flops.peaks import normalize_dtype, peak_bandwidth, peak_flops
from reports.sql.frame import trace_of
from reports.sql.tables import fetch
from tracer.schema import PHASES

__all__ = ["BOUNDS", "roofline", "roofline_split", "roofline_with_split"]

BOUNDS = ("compute", "memory", "other")
_BY = {"op": ["op", "dtype"], "shape": ["op", "dtype", "input_shapes"], "module": ["module", "dtype"]}
# the columns the tables read of a frame (input_shapes too by shape; reports.sql.frame adds "run")
_COLUMNS = (
    "step",
    "phase",
    "op",
    "module",
    "flops",
    "bytes_read",
    "bytes_written",
    "duration_ns",
    "busy_ns",
    "input_dtypes",
    "output_dtypes",
    "is_view",
)
_SUMS = ["ops", "flops", "bytes", "time_ns"]
ROOFLINE_COLUMNS = {
    "ops_per_step": "float64",
    "flops_per_step": "float64",
    "bytes_per_step": "float64",
    "arithmetic_intensity": "float64",
    "time_s_per_step": "float64",
    "time_pct": "float64",
    "achieved_flops_per_s": "float64",
    "achieved_bytes_per_s": "float64",
    "peak_flops_per_s": "float64",
    "peak_bytes_per_s": "float64",
    "ridge_flops_per_byte": "float64",
    "attainable_flops_per_s": "float64",
    "bound": object,
    "efficiency": "float64",
}
SPLIT_COLUMNS = {
    "bound": object,
    "ops": "float64",
    "time_s": "float64",
    "time_pct": "float64",
    "flops": "float64",
    "bytes": "float64",
    "roof_time_s": "float64",
}


def run_roofs(meta, dtypes, peak_override, bandwidth_override):
    """({dtype: peak FLOP/s or NaN}, bandwidth bytes/s or NaN) for one run."""
    device = meta.get("device") or {}
    peaks = {}
    for dtype in dtypes:
        value = peak_flops(device, normalize_dtype(dtype), peak_override)[0] if dtype else None
        peaks[dtype] = np.nan if value is None else value
    bandwidth = peak_bandwidth(device, bandwidth_override, meta.get("bandwidth"))[0]
    return peaks, np.nan if bandwidth is None else bandwidth


def _bound(flops, nbytes, peak, bandwidth):
    """BOUNDS per element: arrays of FLOPs, bytes, peak FLOP/s, bandwidth."""
    return np.asarray(BOUNDS, dtype=object)[_bound_codes(flops, nbytes, peak, bandwidth)]


def _bound_codes(flops, nbytes, peak, bandwidth):
    """The index in BOUNDS of each element's bound."""
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = flops / nbytes
        ridge = peak / bandwidth
    nothing = (flops == 0) & (nbytes == 0)
    memory = ~nothing & np.isfinite(bandwidth) & ((flops == 0) | (intensity < ridge))
    compute = ~nothing & ~memory & np.isfinite(bandwidth) & np.isfinite(peak) & (nbytes > 0)
    compute |= ~nothing & (nbytes == 0) & np.isfinite(peak)  # FLOPs on no bytes (0-d scalars): compute
    return np.where(compute, 0, np.where(memory, 1, 2))


def _check(value, what):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ReportError(f"roofline: {what} must be a number > 0, got {value!r}")


def _check_by(by, peak_flops, bandwidth):
    if by not in _BY:
        raise ReportError(f"roofline: by must be one of {', '.join(map(repr, _BY))}, got {by!r}")
    _check(peak_flops, "peak_flops")
    _check(bandwidth, "bandwidth")


def _needs(by):
    return _COLUMNS + (("input_shapes",) if by == "shape" else ())


def roofline(df, by="op", peak_flops=None, bandwidth=None):
    """One row per op kind (by="op": op and dtype; "shape": also the input shapes) or per
    innermost module (by="module"), most time first, with the columns of the module docstring.

    A group's roof is that of the dtype carrying most of its FLOPs (most bytes when it
    has none). Figures are per step (`*_per_step`); `time_pct` is the share of the step's
    op time. `df`: a DataFrame reports.load gave, a pyarrow Table of trace columns, or a
    reports.sql.engine.Trace."""
    _check_by(by, peak_flops, bandwidth)
    with trace_of(df, "roofline", _needs(by)) as trace:
        return _tables(trace, by, peak_flops, bandwidth, split=False)[0]


def roofline_split(df, peak_flops=None, bandwidth=None):
    """Per step, the op time of compute-bound, memory-bound and other ops (one row each per run).

    ops, time_s, flops, bytes are per step (each phase over its own steps); time_pct is
    the share of the step's op time; roof_time_s is the time those ops would take at
    their roof, max(flops / peak, bytes / bandwidth) summed over ops (NaN for "other")."""
    _check(peak_flops, "peak_flops")
    _check(bandwidth, "bandwidth")
    with trace_of(df, "roofline_split", _COLUMNS) as trace:
        return _tables(trace, None, peak_flops, bandwidth, split=True)[1]


def roofline_with_split(df, by="op", peak_flops=None, bandwidth=None):
    """(roofline(df, by, ...), roofline_split(df, ...)) from one Trace (the report's: `optrace report` passes its
    reports.sql.engine.Trace)."""
    _check_by(by, peak_flops, bandwidth)
    with trace_of(df, "roofline", _needs(by)) as trace:
        return _tables(trace, by, peak_flops, bandwidth, split=True)


def _tables(trace, by, peak_flops, bandwidth, split):
    """(the roofline by `by` or None when `by` is None, the split by bound or None unless `split`) of every run."""
    keys = _BY[by] if by else None
    per = _per_step(trace, by) if by else None
    frames, splits = [], []
    steps = trace.phase_steps()
    for i, (run, meta) in enumerate(trace.runs.items()):
        groups = (
            trace.sql(
                "SELECT phase, dtype, flops, bytes, ops, CAST(time_ns AS DOUBLE) AS time_ns "
                f"FROM roofline_groups WHERE run_index = {i}"
            )
            if split
            else None
        )
        t = None
        if by:
            t = per[i].rename(columns={"ops": "ops_per_step", "flops": "flops_per_step", "bytes": "bytes_per_step"})
            t["time_s_per_step"] = t.pop("time_ns") / 1e9
            total = float(t["time_s_per_step"].sum())  # in order of first appearance, as reports.steps adds
            t = t.sort_values("time_s_per_step", ascending=False, kind="stable").reset_index(drop=True)
        if not len(t if t is not None else groups):  # a run without rows
            frames.append(pd.DataFrame(columns=[*keys, *ROOFLINE_COLUMNS]) if by else None)
            splits.append(pd.DataFrame({"run": run, "bound": list(BOUNDS)}))
            continue
        dtypes = set(t["dtype"]) if by else set()
        dtypes |= set(groups["dtype"]) if split else set()
        peaks, bw = run_roofs(meta, sorted(dtypes), peak_flops, bandwidth)  # every dtype the tables read
        if split:
            splits.append(split_of_groups(groups, steps[i], peaks, bw))
            splits[-1].insert(0, "run", run)
        if by:
            t["time_pct"] = 100 * t["time_s_per_step"] / total if total > 0 else np.nan
            add_roof_columns(t, np.array([peaks.get(d, np.nan) for d in t["dtype"]], dtype=float), bw)
            t.insert(0, "run", run)
            frames.append(t)
    dtypes = {**dict.fromkeys(keys or (), object), **ROOFLINE_COLUMNS}
    return (
        _combined(trace, frames, [*keys, *ROOFLINE_COLUMNS], dtypes) if by else None,
        _combined(trace, splits, list(SPLIT_COLUMNS), SPLIT_COLUMNS) if split else None,
    )


def _per_step(trace, by):
    """{run_index: per-step ops, FLOPs, bytes and time_ns of each group of `by`, in order of first appearance}."""
    totals = fetch(trace, f"roofline_{by}", "first_seq", _SUMS)
    if by == "shape":  # the shapes as text: a null cell and no shapes both read "", one group
        totals["input_shapes"] = [_shapes(s) for s in totals["input_shapes"]]
        cells = ["run_index", *_BY[by], "phase"]
        if totals.duplicated(cells).any():
            totals = totals.groupby(cells, sort=False, as_index=False).agg(
                {**dict.fromkeys(_SUMS, "sum"), "first_seq": "min"}
            )
    return trace.per_step(totals, _SUMS, keys=_BY[by])


def _shapes(shapes):
    return "" if shapes is None else ", ".join("[" + ", ".join(str(int(d)) for d in s) + "]" for s in shapes)


def _combined(trace, frames, columns, dtypes):
    """One frame per run as one table: a `run` column first when there are several runs."""
    cols = (["run"] if trace.several else []) + columns
    types = {"run": object, **dtypes}
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_frame({c: types[c] for c in cols})
    return pd.concat(frames, ignore_index=True).reindex(columns=cols).astype({c: types[c] for c in cols})


def add_roof_columns(t, peak, bw):
    """Add to a roofline table `t` (flops_per_step, bytes_per_step, time_s_per_step) the columns
    that follow from them and the roofs: `peak` FLOP/s per row, `bw` bytes/s."""
    flops, nbytes = t["flops_per_step"].to_numpy(float), t["bytes_per_step"].to_numpy(float)
    seconds = t["time_s_per_step"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t["arithmetic_intensity"] = np.where(nbytes > 0, flops / nbytes, np.nan)
        t["achieved_flops_per_s"] = np.where(seconds > 0, flops / seconds, np.nan)
        t["achieved_bytes_per_s"] = np.where(seconds > 0, nbytes / seconds, np.nan)
        t["peak_flops_per_s"] = peak
        t["peak_bytes_per_s"] = bw
        t["ridge_flops_per_byte"] = peak / bw
        t["attainable_flops_per_s"] = np.minimum(peak, np.where(nbytes > 0, flops / nbytes * bw, np.inf))
        bound = _bound(flops, nbytes, peak, bw)
        t["bound"] = bound
        t["efficiency"] = np.where(
            bound == "compute",
            t["achieved_flops_per_s"] / peak,
            np.where(bound == "memory", t["achieved_bytes_per_s"] / bw, np.nan),
        )


def split_of_groups(groups, steps, peaks, bw):
    """One run's split by bound from its op groups (views.sql's roofline_groups): `groups` has phase, dtype, flops,
    bytes (per op: every op of a group has one bound and one roof), ops and time_ns (integer sums); `steps` {phase:
    steps it ran in}; `peaks` {dtype: FLOP/s} and `bw` the run's roofs. The float64 arrays are added here in one
    order (phase order, dtype, FLOPs, bytes), whatever order the groups came in."""
    order = {p: i for i, p in enumerate(PHASES)}
    g = groups.assign(_order=groups["phase"].map(lambda p: order.get(p, len(order))))
    g = g.sort_values(["_order", "phase", "dtype", "flops", "bytes"], kind="stable")
    w = 1.0 / g["phase"].map(steps).to_numpy(dtype=np.float64)
    flops, nbytes = g["flops"].to_numpy(dtype=np.float64), g["bytes"].to_numpy(dtype=np.float64)
    ops = g["ops"].to_numpy(dtype=np.float64) * w
    time = g["time_ns"].to_numpy(dtype=np.float64) / 1e9 * w
    peak = np.array([peaks.get(d, np.nan) for d in g["dtype"]], dtype=float)
    bound = _bound_codes(flops, nbytes, peak, bw)
    with np.errstate(divide="ignore", invalid="ignore"):
        roof = np.fmax(np.where(flops > 0, flops / peak, 0.0), nbytes / bw) * ops
    total = float(time.sum())
    out = []
    for code, name in enumerate(BOUNDS):
        pick = bound == code
        seconds = float(time[pick].sum())
        out.append(
            {
                "bound": name,
                "ops": float(ops[pick].sum()),
                "time_s": seconds,
                "time_pct": 100 * seconds / total if total > 0 else np.nan,
                "flops": float((flops * ops)[pick].sum()),
                "bytes": float((nbytes * ops)[pick].sum()),
                "roof_time_s": float(roof[pick].sum()) if name != "other" else np.nan,
            }
        )
    return pd.DataFrame(out)
