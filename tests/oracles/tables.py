"""The pandas implementations of reports.by_op, by_phase, by_dtype, by_step and by_module, kept as test oracles.

The library runs these tables as SQL views (reports/sql/views.sql) over the user's frame (reports.sql.frame); these
are the same tables written again in pandas over the loaded rows, an independent computation the views are checked
against (tests/reports/sql/test_sql.py).
"""

import numpy as np
import pandas as pd

from reports._util import pct
from reports.errors import ReportError
from reports.loading.load import require
from reports.steps import fits_int64
from reports.tables import MODULE_COLUMNS, MODULE_DTYPES, combine, module_rows, row_dtypes, several_runs, split_runs
from tracer.schema import PHASES

__all__ = ["by_dtype", "by_module", "by_op", "by_phase", "by_step"]

_BASE = ["run", "flops", "bytes_allocated", "duration_ns"]


_SUMMED = ("flops", "bytes_allocated", "bytes_read", "bytes_written", "duration_ns")


def summable_rows(rows, columns=_SUMMED):
    """`rows` with every integer column whose int64 sum could wrap turned float64 (no copy when none can)."""
    wide = {c: rows[c].astype(np.float64) for c in columns if c in rows.columns and not fits_int64(rows[c].to_numpy())}
    return rows.assign(**wide) if wide else rows


def _sum_table(df, key, what, extra_cols=(), order=None):
    """Group each run by `key` and sum the usual columns."""
    require(df, _BASE + ["bytes_read", "bytes_written", key, *extra_cols], what)
    columns = [
        key,
        "ops",
        "flops",
        "flops_pct",
        "bytes_allocated",
        "bytes_read",
        "bytes_written",
        "duration_us",
        "duration_pct",
    ]
    dtypes = {
        key: object,
        "ops": "int64",
        "flops": "int64",
        "flops_pct": "float64",
        "bytes_allocated": "int64",
        "bytes_read": "int64",
        "bytes_written": "int64",
        "duration_us": "float64",
        "duration_pct": "float64",
    }
    frames = []
    for run, rows in split_runs(df):
        rows = summable_rows(rows)
        g = rows.groupby(key, observed=True, sort=False)
        t = pd.DataFrame(
            {
                "ops": g.size(),
                "flops": g["flops"].sum(),
                "bytes_allocated": g["bytes_allocated"].sum(),
                "bytes_read": g["bytes_read"].sum(),
                "bytes_written": g["bytes_written"].sum(),
                "duration_us": g["duration_ns"].sum() / 1000.0,
            }
        )
        t.index = t.index.astype(object)
        t = t.rename_axis(key).reset_index()
        t["flops_pct"] = pct(t["flops"], rows["flops"].sum())
        t["duration_pct"] = pct(t["duration_us"], rows["duration_ns"].sum() / 1000.0)
        if order is not None:
            t = t.sort_values(key, key=lambda s: s.map(order), kind="stable")
        frames.append((run, t))
    return frames, columns, dtypes


# the tables ---------------------------------------------------------------------------------


def by_op(df):
    """FLOPs, bytes and time per aten op, most FLOPs first (then most time)."""
    frames, columns, dtypes = _sum_table(df, "op", "by_op", extra_cols=["flop_kind"])
    out = []
    for (run, t), (_, rows) in zip(frames, split_runs(df)):
        kinds = rows.groupby("op", observed=True)["flop_kind"].first().astype(object)
        t.insert(1, "flop_kind", t["op"].map(kinds))
        out.append((run, t.sort_values(["flops", "duration_us"], ascending=False, kind="stable")))
    return combine(out, ["op", "flop_kind", *columns[1:]], {**dtypes, "flop_kind": object}, several_runs(df))


def by_phase(df):
    """FLOPs, bytes and time per phase (forward, backward, optimizer, other), in that order."""
    order = {p: i for i, p in enumerate(PHASES)}
    frames, columns, dtypes = _sum_table(df, "phase", "by_phase", order=lambda p: order.get(p, len(order)))
    return combine(frames, columns, dtypes, several_runs(df))


def by_dtype(df):
    """FLOPs, matmul FLOPs, bytes and time per dtype.

    An op's dtype is the dtype of its first tensor input (of its first output for
    ops without tensor inputs, "" for ops with neither): a matmul under bf16
    autocast is "bfloat16", the cast that feeds it "float32"."""
    require(df, _BASE + ["input_dtypes", "output_dtypes", "flop_kind"], "by_dtype")
    tagged = df.assign(dtype=row_dtypes(df))
    tagged = tagged.assign(matmul_flops=tagged["flops"].where(tagged["flop_kind"].astype(object) == "matmul", 0))
    frames, columns, dtypes = _sum_table(tagged, "dtype", "by_dtype")
    out = []
    for (run, t), (_, rows) in zip(frames, split_runs(tagged)):
        rows = summable_rows(rows, ("matmul_flops",))
        t.insert(4, "matmul_flops", t["dtype"].map(rows.groupby("dtype")["matmul_flops"].sum()))
        out.append((run, t.sort_values("flops", ascending=False, kind="stable")))
    columns = columns[:4] + ["matmul_flops"] + columns[4:]
    return combine(out, columns, {**dtypes, "matmul_flops": "int64"}, several_runs(df))


def by_step(df):
    """Per training step: ops, FLOPs (all and per phase), bytes allocated, peak live bytes, time.

    The step advances when an optimizer step ends (or on Tracer.step())."""
    require(df, _BASE + ["step", "phase", "live_bytes"], "by_step")
    columns = [
        "step",
        "ops",
        "flops",
        *(f"flops_{p}" for p in PHASES),
        "bytes_allocated",
        "live_bytes_peak",
        "duration_us",
    ]
    dtypes = {c: "int64" for c in columns}
    dtypes["duration_us"] = "float64"
    frames = []
    for run, rows in split_runs(df):
        rows = summable_rows(rows)
        g = rows.groupby("step", sort=True)
        t = pd.DataFrame(
            {
                "ops": g.size(),
                "flops": g["flops"].sum(),
                "bytes_allocated": g["bytes_allocated"].sum(),
                "live_bytes_peak": g["live_bytes"].max(),
                "duration_us": g["duration_ns"].sum() / 1000.0,
            }
        )
        per_phase = rows.pivot_table(index="step", columns="phase", values="flops", aggfunc="sum", observed=True)
        for p in PHASES:
            t[f"flops_{p}"] = per_phase[p] if p in per_phase.columns else 0
        frames.append((run, t.fillna(0).rename_axis("step").reset_index()))
    return combine(frames, columns, dtypes, several_runs(df))


def by_module(df, phase=None):
    """FLOPs, bytes and time per module, as a tree: each module's own ops and its subtree.

    `flops`, `bytes_allocated`, `duration_us`, `ops` count the ops whose innermost
    module is this one; the `subtree_` columns add every descendant, so the root
    module's subtree is everything that ran inside the model. `depth` is 0 for the
    root; modules that ran no op themselves (a ModuleList such as "blocks") still
    appear, with zero own counts. Rows come in tree order (depth first, children in
    the order they first ran). Ops outside any module (the optimizer, the loss when
    it is computed outside the model) form one row with module "" and depth 0, last.
    `subtree_flops_pct` is the subtree's share of all the run's FLOPs (in percent).

    `phase`: None for all ops, or a phase name (or a list of them) to keep."""
    require(df, _BASE + ["module", "seq"] + (["phase"] if phase is not None else []), "by_module")
    if phase is not None:
        phases = [phase] if isinstance(phase, str) else list(phase)
        bad = [p for p in phases if p not in PHASES]
        if bad:
            raise ReportError(f"by_module: unknown phase(s) {bad}; phases are {list(PHASES)}")
        df = df[df["phase"].isin(phases)]
    runs_meta = df.attrs.get("runs") or {}
    frames = []
    for run, rows in split_runs(df):
        root = (runs_meta.get(run) or {}).get("root_module")
        rows = summable_rows(rows)
        g = rows.groupby(rows["module"], observed=True, sort=False)  # on the codes of a categorical: no string per row
        own = pd.DataFrame(
            {
                "ops": g.size(),
                "flops": g["flops"].sum(),
                "bytes_allocated": g["bytes_allocated"].sum(),
                "duration_us": g["duration_ns"].sum() / 1000.0,
                "first_seq": g["seq"].min(),
            }
        )
        own.index = own.index.astype(object)
        frames.append((run, module_rows(own, root, rows["flops"].sum())))
    return combine(frames, MODULE_COLUMNS, MODULE_DTYPES, several_runs(df))
