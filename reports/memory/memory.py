"""Memory: the peak, live bytes over time, and what the live bytes are.

Every function takes the DataFrame `reports.load` returns (one run or several)
and returns a DataFrame with a `run` column. How each storage's size, lifetime and
category (CATEGORIES: parameters, unsharded_parameters, gradients, optimizer_state,
communication_buffers, activations, inputs, temporaries) are worked out is in
reports/memory/lifetimes.py.
"""

import numpy as np
import pandas as pd

from reports._util import empty_frame, pct
from reports.errors import ReportError
from reports.loading.load import require
from reports.memory.lifetimes import CATEGORIES, DTYPE_BYTES, Storages, runs_in_order, take
from reports.sql import tables
from reports.sql.frame import trace_of

__all__ = ["CATEGORIES", "DTYPE_BYTES", "by_category", "by_dtype", "peak", "storages", "timeline"]

STORAGE_COLUMNS = (
    "seq",
    "step",
    "op",
    "phase",
    "module",
    "input_storage_ids",
    "input_shapes",
    "input_strides",
    "input_dtypes",
    "output_storage_ids",
    "output_shapes",
    "output_dtypes",
    "freed_storage_ids",
    "bytes_allocated",
    "live_bytes",
)

_STORAGE_DTYPES = {
    "run": "object",
    "storage_id": "int64",
    "nbytes": "int64",
    "dtype": "object",
    "category": "object",
    "allocated": "bool",
    "alloc_seq": "int64",
    "free_seq": "Int64",
    "step": "int64",
    "phase": "object",
    "module": "object",
    "op": "object",
}


def _each_run(df, what):
    """A `Storages` for each run of `df` that has rows, after checking the columns."""
    require(df, STORAGE_COLUMNS, what)
    for name, meta, rows in runs_in_order(df):
        if len(rows):
            yield Storages(name, meta, rows)


def storages(df):
    """One row per storage of each run: its size, dtype, lifetime and memory category.

    Columns: run, storage_id (-1: bytes live at the start that no row names),
    nbytes, dtype, category (see CATEGORIES), allocated (an op of the trace
    allocated it; False for what existed before: parameters, buffers, the batch,
    torch.tensor constants), alloc_seq (the op after which it counts as live: the
    op that allocated it or first used it; -1: registered when the trace began),
    free_seq (the op whose freed_storage_ids lists it; <NA>: alive at the end),
    and the step, phase, module and op at alloc_seq ("" and -1 before the trace)."""
    frames = [run.table().drop(columns=["_alloc_row", "_free_row"]) for run in _each_run(df, "storages")]
    if not frames:
        return empty_frame(_STORAGE_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_STORAGE_DTYPES)


def _live_columns(run):
    """For each of CATEGORIES, a function giving the int64 bytes of that category live after each row of a run.

    One category at a time, so a million-row run never holds a [rows, categories] matrix."""
    nbytes, alloc, free, cat = run.live_pieces()
    n = run.n
    start, end = alloc + 1, free + 1  # index 0: before the first row
    freed = end > 0
    index = np.concatenate([start, end[freed]])
    weights = np.concatenate([nbytes, -nbytes[freed]]).astype(np.float64)
    which = np.concatenate([cat, cat[freed]])

    def live(c):
        mine = which == c
        delta = np.bincount(index[mine], weights=weights[mine], minlength=n + 1)[: n + 1]
        return np.rint(delta).astype(np.int64).cumsum()[1:]

    return [lambda c=c: live(c) for c in range(len(CATEGORIES))]


def _live_at(run, row):
    """Bytes live per category after one row of a run: what _live_columns gives at that row, without a column per category."""
    nbytes, alloc, free, cat = run.live_pieces()
    alive = (alloc <= row) & (
        (free < 0) | (free > row)
    )  # counted from alloc + 1, gone from free + 1 (see _live_columns)
    values = np.zeros(len(CATEGORIES), dtype=np.int64)
    np.add.at(values, cat[alive], nbytes[alive].astype(np.int64))
    return values


def _live_by_category(run):
    """[rows, categories] int64: bytes live per category after each row of a run."""
    return np.stack([column() for column in _live_columns(run)], axis=1)


_TIMELINE_DTYPES = {
    "run": "object",
    "seq": "int64",
    "step": "int64",
    "phase": "object",
    "live_bytes": "int64",
    **{f"{c}_bytes": "int64" for c in CATEGORIES},
}


def timeline(df):
    """Live bytes after every row, and how they split into CATEGORIES (`<category>_bytes` columns).

    The category columns add up to `live_bytes` on every row (storage -1 of `storages`
    holds what no row names)."""
    frames = []
    for run in _each_run(df, "timeline"):
        live, rows = _live_by_category(run), run.rows
        frame = pd.DataFrame(
            {
                "run": run.name,
                "seq": rows["seq"].to_numpy(dtype=np.int64),
                "step": rows["step"].to_numpy(dtype=np.int64),
                "phase": take(rows["phase"], slice(None)),
                "live_bytes": rows["live_bytes"].to_numpy(dtype=np.int64),
            }
        )
        for i, name in enumerate(CATEGORIES):
            frame[f"{name}_bytes"] = live[:, i]
        frames.append(frame)
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_frame(_TIMELINE_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_TIMELINE_DTYPES)


_PEAK_DTYPES = {
    "run": "object",
    "peak_live_bytes": "int64",
    "seq": "int64",
    "step": "int64",
    "phase": "object",
    "module": "object",
    "op": "object",
}


def peak(df):
    """The highest `live_bytes` of each run and the op after which it was reached (the first, on a tie): views.sql's
    view `peak`, run over the frame's rows."""
    with trace_of(df, "peak", ("seq", "step", "op", "phase", "module", "live_bytes")) as trace:
        return tables.peak(trace)


CATEGORY_DTYPES = {"run": "object", "category": "object", "bytes": "int64", "seq": "int64", "live_pct": "float64"}
_AT = ("peak", "end", "max")


def by_category(df, at="peak"):
    """Bytes live per category (see CATEGORIES) in each run, one row per (run, category).

    at   "peak": after the op with the run's highest live_bytes (default);
         "end": after the last op; an int: after the op with that seq;
         "max": each category at its own highest (activations peak when the
         backward begins, gradients when it ends: these are not simultaneous).
    Columns: run, category, bytes, seq (where measured), live_pct (share of
    live_bytes at that seq)."""
    if not (at in _AT or (isinstance(at, (int, np.integer)) and not isinstance(at, bool))):
        raise ReportError(f"by_category: at must be one of {list(_AT)} or an op's seq (int), got {at!r}")
    frames = [categories_at(run, at) for run in _each_run(df, "by_category")]
    if not frames:
        return empty_frame(CATEGORY_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(CATEGORY_DTYPES)


def categories_at(run, at):
    """by_category's rows of one run (a `Storages`; `at` checked by the caller)."""
    rows, name = run.rows, run.name
    seq = rows["seq"].to_numpy(dtype=np.int64)
    total = run.live
    if at == "max":
        where, values = np.zeros(len(CATEGORIES), dtype=np.int64), np.zeros(len(CATEGORIES), dtype=np.int64)
        for c, column in enumerate(_live_columns(run)):
            live = column()
            where[c] = live.argmax()
            values[c] = live[where[c]]
    else:
        if at == "peak":
            row = int(np.argmax(total))
        elif at == "end":
            row = run.n - 1
        else:
            hits = np.flatnonzero(seq == at)
            if not len(hits):
                raise ReportError(
                    f"by_category: run {name!r} has no op with seq {at} (its seq runs {seq[0]}..{seq[-1]})"
                )
            row = int(hits[0])
        where = np.full(len(CATEGORIES), row)
        values = _live_at(run, row)
    return pd.DataFrame(
        {
            "run": name,
            "category": list(CATEGORIES),
            "bytes": values,
            "seq": seq[where],
            "live_pct": pct(values, total[where]),
        }
    )


_DTYPE_DTYPES = {
    "run": "object",
    "dtype": "object",
    "storages": "int64",
    "bytes_allocated": "int64",
    "peak_live_bytes": "int64",
}


def by_dtype(df):
    """Bytes allocated per dtype: one row per (run, dtype), most bytes first.

    Columns: storages and bytes_allocated (the storages ops of the trace allocated,
    so parameters and inputs are not counted), peak_live_bytes (bytes of that dtype
    live, whoever made them, after the op with the run's highest live_bytes).
    With bf16 autocast the matmul outputs move from float32 to bfloat16 at half the bytes."""
    frames = []
    for run in _each_run(df, "by_dtype"):
        if not run.n:
            continue
        table = run.table()
        top = int(np.argmax(run.live))
        index, nbytes, a, f, _ = run.pieces()  # a storage resized in place counts at its size then
        live = (a <= top) & ((f < 0) | (f > top))
        made = run.arrays()[4]
        frame = pd.DataFrame(
            {
                "run": table["run"],
                "dtype": table["dtype"],
                "storages": made.astype(np.int64),
                "bytes_allocated": np.where(made, table["nbytes"], 0),
                "peak_live_bytes": np.bincount(index[live], weights=nbytes[live], minlength=len(table)).astype(
                    np.int64
                ),
            }
        )
        frame = frame.groupby(["run", "dtype"], sort=False, as_index=False).sum()
        frames.append(frame.sort_values(["bytes_allocated", "peak_live_bytes"], ascending=False, kind="stable"))
    if not frames:
        return empty_frame(_DTYPE_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_DTYPE_DTYPES)
