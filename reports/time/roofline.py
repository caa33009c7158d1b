"""A roofline of every op: is each op kind limited by the device's FLOP/s or by its memory bandwidth?

Figures are per training step (reports.steps.per_step: each phase's total over the
steps it ran in, summed over phases), so they sit beside the breakdown's; k identical
steps give exactly the figures of one.

    ops_per_step          ops of the kind in a step
    flops_per_step        analytic FLOPs (2 per multiply-add)
    bytes_per_step        bytes_read + bytes_written: ALGORITHMIC bytes, the tensors an
                          op reads and writes, each once. Not DRAM traffic: caches,
                          fusion and recomputation inside a kernel change what
                          really moves. Views (is_view) count 0: they move nothing;
                          collectives count 0 too: their time is the network's and the
                          wait for other ranks, under no roof of the device (their
                          traffic: reports.collectives), so they are "other".
    arithmetic_intensity  flops / bytes (FLOPs per byte)
    time_s_per_step       the ops' time: busy_ns (GPU time with the idle gap before the
                          op removed, tracer.recording.timing), else duration_ns
    time_pct              the share of the step's op time
    achieved_flops_per_s  flops / time; achieved_bytes_per_s: bytes / time
    attainable_flops_per_s min(peak FLOP/s, intensity x bandwidth): the roof above the op
    bound                 "compute" when intensity >= the ridge point (peak / bandwidth),
                          "memory" below it (every op that moves bytes and does no
                          FLOPs: copies, fills, views that copy), "other" when the op
                          moves nothing (views, metadata, collectives) or a roof is unknown
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
divides the per-phase totals into per-step figures (reports.sql.engine.Trace.per_step_arrow), on Arrow and numpy:
`roofline_tables` gives the report its pyarrow Tables without pandas, the library's functions the same tables as
DataFrames.
"""

import sys

import numpy as np
import pyarrow as pa

from reports.arrays import array_of, arrow_of, strings, values_of
from reports.errors import ReportError
from reports.flops.peaks import normalize_dtype, peak_bandwidth, peak_flops
from reports.flops.rows import to_frame
from reports.loading.load import runs_of
from reports.sql.frame import trace_of
from reports.sql.tables import fetch_arrow
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
_OPTIONAL = ("flop_kind",)  # a collective's bytes count 0 (views.sql roofline_rows); a frame without it has none
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


def _runs_known(df, peak_flops, bandwidth, what):
    """ReportError for rows without the run metadata their roofs come from (a DataFrame reports.load did not give,
    reports.loading.load.runs_of's; a pyarrow Table, which has none), unless both roofs are given: NaN roofs would
    read as every op "other"."""
    if peak_flops is not None and bandwidth is not None:
        return
    if isinstance(df, pa.Table):
        raise ReportError(f"{what}: a pyarrow Table holds no run metadata: give peak_flops= and bandwidth=")
    pd = sys.modules.get("pandas")  # a DataFrame's own library, loaded (none without it)
    if pd is not None and isinstance(df, pd.DataFrame):
        runs_of(df)


def roofline(df, by="op", peak_flops=None, bandwidth=None):
    """One row per op kind (by="op": op and dtype; "shape": also the input shapes) or per
    innermost module (by="module"), most time first, with the columns of the module docstring.

    A group's roof is that of the dtype carrying most of its FLOPs (most bytes when it
    has none). Figures are per step (`*_per_step`); `time_pct` is the share of the step's
    op time. `df`: a DataFrame reports.load gave, a pyarrow Table of trace columns, or a
    reports.sql.engine.Trace."""
    _check_by(by, peak_flops, bandwidth)
    _runs_known(df, peak_flops, bandwidth, "roofline")
    with trace_of(df, "roofline", _needs(by), _OPTIONAL) as trace:
        return to_frame(_tables(trace, by, peak_flops, bandwidth, split=False)[0])


def roofline_split(df, peak_flops=None, bandwidth=None):
    """Per step, the op time of compute-bound, memory-bound and other ops (one row each per run).

    ops, time_s, flops, bytes are per step (each phase over its own steps); time_pct is
    the share of the step's op time; roof_time_s is the time those ops would take at
    their roof, max(flops / peak, bytes / bandwidth) summed over ops (NaN for "other")."""
    _check(peak_flops, "peak_flops")
    _check(bandwidth, "bandwidth")
    _runs_known(df, peak_flops, bandwidth, "roofline_split")
    with trace_of(df, "roofline_split", _COLUMNS, _OPTIONAL) as trace:
        return to_frame(_tables(trace, None, peak_flops, bandwidth, split=True)[1])


def roofline_with_split(df, by="op", peak_flops=None, bandwidth=None):
    """(roofline(df, by, ...), roofline_split(df, ...)) from one Trace."""
    return tuple(to_frame(table) for table in roofline_tables(df, by, peak_flops, bandwidth))


def roofline_tables(df, by="op", peak_flops=None, bandwidth=None):
    """roofline_with_split's tables as pyarrow Tables (`optrace report` passes its reports.sql.engine.Trace)."""
    _check_by(by, peak_flops, bandwidth)
    _runs_known(df, peak_flops, bandwidth, "roofline")
    with trace_of(df, "roofline", _needs(by), _OPTIONAL) as trace:
        return _tables(trace, by, peak_flops, bandwidth, split=True)


def _tables(trace, by, peak_flops, bandwidth, split):
    """(the roofline by `by` or None when `by` is None, the split by bound or None unless `split`) of every run, as
    pyarrow Tables."""
    keys = _BY[by] if by else None
    per = trace.per_step_arrow(_totals(trace, by), _SUMS, keys=keys) if by else None
    tables, splits = [], []
    steps = trace.phase_steps()
    for i, (run, meta) in enumerate(trace.runs.items()):
        groups = _groups(trace, i) if split else None
        t = None
        if by:
            found, figures = per[i]
            t = {k: np.asarray([key[j] for key in found], dtype=object) for j, k in enumerate(keys)}
            t["ops_per_step"], t["flops_per_step"] = figures["ops"], figures["flops"]
            t["bytes_per_step"], t["time_s_per_step"] = figures["bytes"], figures["time_ns"] / 1e9
            total = float(np.nansum(t["time_s_per_step"]))  # in order of first appearance, as reports.steps adds
            order = np.argsort(-t["time_s_per_step"], kind="stable")  # most time first; ties in their order
            t = {c: v[order] for c, v in t.items()}
        if not len(groups["phase"] if split else t["ops_per_step"]):  # a run without rows (by="module": rows may
            splits.append([{"bound": b} for b in BOUNDS])  # be in no group)
            continue
        dtypes = set(t["dtype"].tolist()) if by else set()
        dtypes |= set(groups["dtype"].tolist()) if split else set()
        peaks, bw = run_roofs(meta, sorted(dtypes), peak_flops, bandwidth)  # every dtype the tables read
        if split:
            splits.append(split_of_groups(groups, steps[i], peaks, bw))
        if by:
            t["time_pct"] = 100 * t["time_s_per_step"] / total if total > 0 else np.full(len(order), np.nan)
            add_roof_columns(t, np.array([peaks.get(d, np.nan) for d in t["dtype"].tolist()], dtype=float), bw)
            tables.append((run, t))
    return (
        _table(trace, tables, {**dict.fromkeys(keys or (), object), **ROOFLINE_COLUMNS}) if by else None,
        _table(trace, [(run, _columns(rows)) for run, rows in zip(trace.runs, splits)], SPLIT_COLUMNS)
        if split
        else None,
    )


def _totals(trace, by):
    """The view of `by`'s per-phase totals, in order of first appearance (by="shape": the shapes as text)."""
    totals = fetch_arrow(trace, f"roofline_{by}", "first_seq", _SUMS)
    if by != "shape":
        return totals
    # the shapes as text: a null cell and no shapes both read "", one group (its sums added, its least first_seq)
    cells, merged = ["run_index", *_BY[by], "phase"], {}
    for row in totals.to_pylist():
        row["input_shapes"] = _shapes(row["input_shapes"])
        found = merged.setdefault(tuple(row[c] for c in cells), row)
        if found is not row:
            found.update({c: found[c] + row[c] for c in _SUMS}, first_seq=min(found["first_seq"], row["first_seq"]))
    kinds = {**{f.name: f.type for f in totals.schema}, "input_shapes": pa.string()}
    names = [*cells, *_SUMS, "first_seq"]
    return pa.table({c: array_of([row[c] for row in merged.values()], kinds[c]) for c in names})


def _shapes(shapes):
    return "" if shapes is None else ", ".join("[" + ", ".join(str(int(d)) for d in s) + "]" for s in shapes)


def _groups(trace, run_index):
    """One run's rows of roofline_groups as numpy arrays: phase, dtype (objects), flops, bytes, ops, time_ns."""
    found = trace.arrow(
        "SELECT phase, dtype, flops, bytes, ops, CAST(time_ns AS DOUBLE) AS time_ns "
        f"FROM roofline_groups WHERE run_index = {run_index}"
    )
    return {c: values_of(found.column(c)) for c in found.column_names}


def _columns(records):
    """[{column: value}] as {column: numpy array}, a column a record lacks NaN in it (SPLIT_COLUMNS' numbers)."""
    return {
        c: np.asarray([r.get(c, np.nan) for r in records], dtype=object if kind is object else np.float64)
        for c, kind in SPLIT_COLUMNS.items()
    }


def _table(trace, runs, types):
    """[(run, {column: numpy array})] as one pyarrow Table of the columns of `types` ({column: "float64" or object,
    strings}), a `run` column first when the trace holds several runs."""
    sizes = [(run, t, len(t["bound"])) for run, t in runs]
    data = {"run": strings([run for run, _, n in sizes for _ in range(n)])} if trace.several else {}
    for c, kind in types.items():
        parts = [t[c] for _, t, _ in sizes]
        if kind == "float64":
            data[c] = arrow_of(np.concatenate([np.zeros(0), *parts]).astype(np.float64))
        else:
            data[c] = strings([v for part in parts for v in part.tolist()])
    return pa.table(data)


def add_roof_columns(t, peak, bw):
    """Add to a roofline table `t` (flops_per_step, bytes_per_step, time_s_per_step: a DataFrame or a dict of numpy
    arrays) the columns that follow from them and the roofs: `peak` FLOP/s per row, `bw` bytes/s."""
    flops, nbytes = np.asarray(t["flops_per_step"], dtype=float), np.asarray(t["bytes_per_step"], dtype=float)
    seconds = np.asarray(t["time_s_per_step"], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t["arithmetic_intensity"] = np.where(nbytes > 0, flops / nbytes, np.nan)
        achieved_flops, achieved_bytes = (
            np.where(seconds > 0, flops / seconds, np.nan),
            np.where(seconds > 0, nbytes / seconds, np.nan),
        )
        t["achieved_flops_per_s"], t["achieved_bytes_per_s"] = achieved_flops, achieved_bytes
        t["peak_flops_per_s"] = peak
        t["peak_bytes_per_s"] = np.full(len(flops), bw, dtype=float)
        t["ridge_flops_per_byte"] = peak / bw
        t["attainable_flops_per_s"] = np.minimum(peak, np.where(nbytes > 0, flops / nbytes * bw, np.inf))
        bound = _bound(flops, nbytes, peak, bw)
        t["bound"] = bound
        t["efficiency"] = np.where(
            bound == "compute",
            achieved_flops / peak,
            np.where(bound == "memory", achieved_bytes / bw, np.nan),
        )


def split_of_groups(groups, steps, peaks, bw):
    """One run's split by bound from its op groups (views.sql's roofline_groups): `groups` has columns phase, dtype,
    flops, bytes (per op: every op of a group has one bound and one roof), ops and time_ns (integer sums), as arrays
    or Series; `steps` {phase: steps it ran in}; `peaks` {dtype: FLOP/s} and `bw` the run's roofs. The float64 arrays
    are added here in one order (phase order, dtype with a null last, FLOPs, bytes), whatever order the groups came
    in. Returns the three rows of BOUNDS as [{column: value}]."""
    order = {p: i for i, p in enumerate(PHASES)}
    phase, dtype = np.asarray(groups["phase"], dtype=object), np.asarray(groups["dtype"], dtype=object)
    keys = zip(
        phase.tolist(), dtype.tolist(), np.asarray(groups["flops"]).tolist(), np.asarray(groups["bytes"]).tolist()
    )
    rank = [  # sorted stably by phase order, phase, dtype (a missing one last), FLOPs and bytes
        k
        for _, k in sorted(
            ((order.get(p, len(order)), p, not isinstance(d, str), d if isinstance(d, str) else "", f, b), k)
            for k, (p, d, f, b) in enumerate(keys)
        )
    ]
    phase, dtype = phase[rank], dtype[rank]
    flops, nbytes = (np.asarray(groups[c], dtype=np.float64)[rank] for c in ("flops", "bytes"))
    w = 1.0 / np.array([steps.get(p, np.nan) for p in phase.tolist()], dtype=np.float64)
    ops = np.asarray(groups["ops"], dtype=np.float64)[rank] * w
    time = np.asarray(groups["time_ns"], dtype=np.float64)[rank] / 1e9 * w
    peak = np.array([peaks.get(d, np.nan) for d in dtype.tolist()], dtype=float)
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
    return out
