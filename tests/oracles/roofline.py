"""The pandas implementation of reports.roofline, roofline_split and roofline_with_split, kept as a test oracle of
views.sql's roofline_op, roofline_shape, roofline_module and roofline_groups as reports.time.roofline runs them
(tests/reports/sql/test_library_views.py): the rows grouped and summed per run in pandas, the per-step figures by
reports.steps.per_step. The roofs and the split's arithmetic (run_roofs, add_roof_columns, split_of_groups) are
reports.time.roofline's own: what is checked here is the grouping, the sums and the order.
"""

import numpy as np
import pandas as pd

from reports.loading.columns import cell_objects
from reports.loading.load import require, runs_of
from reports.steps import per_step, row_divisor, step_phases, summable
from reports.tables import combine, row_dtype_codes, several_runs, split_runs
from reports.time import roofline as library
from reports.time.roofline import BOUNDS, ROOFLINE_COLUMNS, SPLIT_COLUMNS, add_roof_columns, run_roofs, split_of_groups

__all__ = ["roofline", "roofline_split", "roofline_with_split"]

_BY = {"op": ["op", "dtype"], "shape": ["op", "dtype", "input_shapes"], "module": ["module"]}
_COLUMNS = ("run", *library._COLUMNS)


def _rows(rows, shapes=False):
    """The columns the roofline needs, one row per op: dtype, bytes, time in seconds (and the
    input shapes as text when grouping by them)."""
    time_s = rows["busy_ns"].to_numpy(dtype="float64", na_value=np.nan, copy=True)  # numpy throughout: few temporaries
    unbusy = np.isnan(time_s)
    time_s[unbusy] = rows["duration_ns"].to_numpy()[unbusy]
    time_ns = time_s.astype(np.int64)  # integer ns: per-step sums exact before the one division
    time_s /= 1e9
    nbytes = rows["bytes_read"].to_numpy(np.int64) + rows["bytes_written"].to_numpy(np.int64)
    moves_none = rows["is_view"].to_numpy(dtype=bool, copy=True)
    if "flop_kind" in rows:  # a collective moves none under the device's roofs
        moves_none |= (rows["flop_kind"] == "collective").to_numpy()
    nbytes[moves_none] = 0
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


def roofline(df, by="op", peak_flops=None, bandwidth=None):
    """One row per op kind (by="op": op and dtype; "shape": also the input shapes) or per
    innermost module (by="module"), most time first, with the columns of the module docstring.

    A group's roof is that of the dtype carrying most of its FLOPs (most bytes when it
    has none). Figures are per step (`*_per_step`); `time_pct` is the share of the step's
    op time."""
    library._check_by(by, peak_flops, bandwidth)
    require(df, _COLUMNS + (("input_shapes",) if by == "shape" else ()), "roofline")
    return _roofline_table(df, _prepared(df, peak_flops, bandwidth, by == "shape"), by)


def roofline_split(df, peak_flops=None, bandwidth=None):
    """Per step, the op time of compute-bound, memory-bound and other ops (one row each per run).

    ops, time_s, flops, bytes are per step (each phase over its own steps); time_pct is
    the share of the step's op time; roof_time_s is the time those ops would take at
    their roof, max(flops / peak, bytes / bandwidth) summed over ops (NaN for "other")."""
    library._check(peak_flops, "peak_flops")
    library._check(bandwidth, "bandwidth")
    require(df, _COLUMNS, "roofline_split")
    return _split_table(df, _prepared(df, peak_flops, bandwidth, False))


def roofline_with_split(df, by="op", peak_flops=None, bandwidth=None):
    """(roofline(df, by, ...), roofline_split(df, ...)), with the rows prepared once."""
    library._check_by(by, peak_flops, bandwidth)
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
        frames.append((run, pd.DataFrame(split_of_groups(groups.reset_index(), steps, peaks, bw))))
    return combine(frames, list(SPLIT_COLUMNS), SPLIT_COLUMNS, several_runs(df))
