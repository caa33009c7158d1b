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
"""

import numpy as np
import pandas as pd

from reports.errors import ReportError
from reports.flops.peaks import normalize_dtype, peak_bandwidth, peak_flops
from reports.loading.columns import cell_objects
from reports.loading.load import require, runs_of
from reports.steps import per_step, row_divisor, step_phases, summable
from reports.tables import combine, row_dtype_codes, several_runs, split_runs
from tracer.schema import PHASES

__all__ = ["BOUNDS", "roofline", "roofline_split", "roofline_with_split"]

BOUNDS = ("compute", "memory", "other")
_BY = {"op": ["op", "dtype"], "shape": ["op", "dtype", "input_shapes"], "module": ["module"]}
_COLUMNS = (
    "run",
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


def _rows(rows, shapes=False):
    """The columns the roofline needs, one row per op: dtype, bytes, time in seconds (and the
    input shapes as text when grouping by them)."""
    time_s = rows["busy_ns"].to_numpy(dtype="float64", na_value=np.nan, copy=True)  # numpy throughout: few temporaries
    unbusy = np.isnan(time_s)
    time_s[unbusy] = rows["duration_ns"].to_numpy()[unbusy]
    time_ns = time_s.astype(np.int64)  # integer ns: per-step sums exact before the one division
    time_s /= 1e9
    nbytes = rows["bytes_read"].to_numpy(np.int64) + rows["bytes_written"].to_numpy(np.int64)
    nbytes[rows["is_view"].to_numpy(dtype=bool)] = 0
    per_step = 1.0 / row_divisor(rows).to_numpy()
    table = pd.DataFrame(
        {
            "op": rows["op"].astype("category"),  # categorical keys: group-bys on codes, not strings
            "module": rows["module"].astype("category"),
            "dtype": pd.Categorical.from_codes(*row_dtype_codes(rows)),
            "flops": summable(rows["flops"].to_numpy(np.int64)),  # float64 where an int64 sum could wrap
            "bytes": nbytes,
            "time_s": time_s,
            "time_ns": time_ns,
            "per_step": per_step,
        },
        index=rows.index,
        copy=False,
    )
    if shapes:
        table.insert(2, "input_shapes", [_shapes(s) for s in cell_objects(rows, "input_shapes")])
    return table


def _shapes(shapes):
    return "" if shapes is None else ", ".join("[" + ", ".join(str(int(d)) for d in s) + "]" for s in shapes)


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


def _prepared(df, peak_flops, bandwidth, shapes):
    """Per run: (run, its row table from _rows, {dtype: peak FLOP/s}, bandwidth, its step_phases for
    per_step); (run, None, None, None, None) for a run with no rows. Both tables are built from this, so a report that shows both prepares once."""
    runs = runs_of(df)
    out = []
    for run, rows in split_runs(df):
        if not len(rows):
            out.append((run, None, None, None, None))
            continue
        r = _rows(rows, shapes=shapes)
        peaks, bw = run_roofs(runs[run], r["dtype"].cat.categories, peak_flops, bandwidth)
        out.append((run, r, peaks, bw, step_phases(rows)))
    return out


def _check_by(by, peak_flops, bandwidth):
    if by not in _BY:
        raise ReportError(f"roofline: by must be one of {', '.join(map(repr, _BY))}, got {by!r}")
    _check(peak_flops, "peak_flops")
    _check(bandwidth, "bandwidth")


def roofline(df, by="op", peak_flops=None, bandwidth=None):
    """One row per op kind (by="op": op and dtype; "shape": also the input shapes) or per
    innermost module (by="module"), most time first, with the columns of the module docstring.

    A group's roof is that of the dtype carrying most of its FLOPs (most bytes when it
    has none). Figures are per step (`*_per_step`); `time_pct` is the share of the step's
    op time."""
    _check_by(by, peak_flops, bandwidth)
    require(df, _COLUMNS + (("input_shapes",) if by == "shape" else ()), "roofline")
    return _roofline_table(df, _prepared(df, peak_flops, bandwidth, by == "shape"), by)


def roofline_split(df, peak_flops=None, bandwidth=None):
    """Per step, the op time of compute-bound, memory-bound and other ops (one row each per run).

    ops, time_s, flops, bytes are per step (each phase over its own steps); time_pct is
    the share of the step's op time; roof_time_s is the time those ops would take at
    their roof, max(flops / peak, bytes / bandwidth) summed over ops (NaN for "other")."""
    _check(peak_flops, "peak_flops")
    _check(bandwidth, "bandwidth")
    require(df, _COLUMNS, "roofline_split")
    return _split_table(df, _prepared(df, peak_flops, bandwidth, False))


def roofline_with_split(df, by="op", peak_flops=None, bandwidth=None):
    """(roofline(df, by, ...), roofline_split(df, ...)), with the rows prepared once."""
    _check_by(by, peak_flops, bandwidth)
    require(df, _COLUMNS + (("input_shapes",) if by == "shape" else ()), "roofline")
    prepared = _prepared(df, peak_flops, bandwidth, by == "shape")
    return _roofline_table(df, prepared, by), _split_table(df, prepared)


def _roofline_table(df, prepared, by):
    keys = _BY[by]
    frames = []
    for run, r, peaks, bw, phases in prepared:
        if r is None:
            frames.append((run, pd.DataFrame(columns=keys + list(ROOFLINE_COLUMNS))))
            continue
        g = r.groupby(keys, sort=False, observed=True)
        t = g.size().reset_index()[keys]  # the groups, in order of first appearance: ngroup's numbering
        group = pd.Series(g.ngroup().to_numpy(), index=r.index)
        for name, values in (
            ("ops_per_step", pd.Series(1, index=r.index)),
            ("flops_per_step", r["flops"]),
            ("bytes_per_step", r["bytes"]),
            ("time_s_per_step", r["time_ns"]),
        ):
            t[name] = per_step(r, values=values, by=group, phases=phases).reindex(range(len(t))).to_numpy()
        t["time_s_per_step"] /= 1e9
        weight = r["flops"].where(r["flops"] > 0, 0) * 1e3 + r["bytes"] * 1e-9  # FLOPs first, bytes break ties
        heaviest = weight.groupby(
            [r[k] for k in keys], sort=False, observed=True
        ).idxmax()  # in the groups' order, as t
        dtype = r.loc[heaviest.to_numpy(), "dtype"].to_numpy()
        if by == "module":
            t.insert(1, "dtype", dtype)
        step_time = t["time_s_per_step"].sum()
        t["time_pct"] = 100 * t["time_s_per_step"] / step_time if step_time > 0 else np.nan
        add_roof_columns(t, np.array([peaks.get(d, np.nan) for d in dtype], dtype=float), bw)
        t = t.sort_values("time_s_per_step", ascending=False, kind="stable")
        frames.append((run, t))
    columns = keys + (["dtype"] if by == "module" else []) + list(ROOFLINE_COLUMNS)
    dtypes = {**{k: object for k in columns if k not in ROOFLINE_COLUMNS}, **ROOFLINE_COLUMNS}
    return combine(frames, columns, dtypes, several_runs(df))


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
    """One run's split by bound from its op groups: `groups` has phase, dtype, flops, bytes (per op: every op of a
    group has one bound and one roof), ops and time_ns (integer sums); `steps` {phase: steps it ran in}; `peaks`
    {dtype: FLOP/s} and `bw` the run's roofs. Both engines build the same groups and add the same float64 arrays
    here in one order (phase order, dtype, FLOPs, bytes), so their figures agree to the last bit."""
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


def _split_table(df, prepared):
    frames = []
    for run, r, peaks, bw, phases in prepared:
        if r is None:
            frames.append((run, pd.DataFrame({"bound": list(BOUNDS)})))
            continue
        codes, names, counts = phases
        groups = (
            pd.DataFrame(
                {
                    "phase": np.asarray(names, dtype=object)[codes],
                    "dtype": r["dtype"].astype(object).to_numpy(),
                    "flops": df.loc[r.index, "flops"].to_numpy(np.int64),
                    "bytes": r["bytes"].to_numpy(),
                    "time_ns": r["time_ns"].to_numpy(),
                }
            )
            .groupby(["phase", "dtype", "flops", "bytes"], sort=False)
            .agg(ops=("time_ns", "size"), time_ns=("time_ns", "sum"))
        )
        steps = {str(names[c]): int(counts[c]) for c in range(len(names))}
        frames.append((run, split_of_groups(groups.reset_index(), steps, peaks, bw)))
    return combine(frames, list(SPLIT_COLUMNS), SPLIT_COLUMNS, several_runs(df))
