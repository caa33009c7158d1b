"""Memory: the peak, live bytes over time, and what the live bytes are.

Every function takes the DataFrame `reports.load` returns (one run or several)
and returns a DataFrame with a `run` column. How each storage's size, lifetime and
category (CATEGORIES: parameters, unsharded_parameters, gradients, optimizer_state,
communication_buffers, activations, inputs, temporaries) are worked out is in
reports.memory.lifetimes.
"""

import numpy as np
import pandas as pd

from reports._util import empty_frame
from reports.errors import ReportError
from reports.loading.load import require
from reports.memory.frame_rows import runs_in_order, take
from reports.memory.lifetimes import CATEGORIES, DTYPE_BYTES, Storages
from reports.memory.live import AT, categories_at, live_columns
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
    """(a `Storages`, the run's rows) for each run of `df` that has rows, after checking the columns."""
    require(df, STORAGE_COLUMNS, what)
    for name, meta, rows in runs_in_order(df):
        if len(rows):
            yield Storages(name, meta, rows), rows


def _table(run, rows):
    """`storages`' rows of one run (`rows`: the run's frame): Storages.table() with run, phase, module and op."""
    found = run.table()
    alloc, free_seq = found["_alloc_row"], pd.array(found["free_seq"], dtype="Int64")
    free_seq[found["_free_row"] < 0] = pd.NA
    has, at = alloc >= 0, np.maximum(alloc, 0)
    return pd.DataFrame(
        {
            "run": run.name,
            **{c: found[c] for c in ("storage_id", "nbytes", "dtype", "category", "allocated", "alloc_seq")},
            "free_seq": free_seq,
            "step": found["step"],
            **{c: np.where(has, take(rows[c], at), "") for c in ("phase", "module", "op")},
        }
    )


def storages(df):
    """One row per storage of each run: its size, dtype, lifetime and memory category.

    Columns: run, storage_id (-1: bytes live at the start that no row names),
    nbytes, dtype, category (see CATEGORIES), allocated (an op of the trace
    allocated it; False for what existed before: parameters, buffers, the batch,
    torch.tensor constants), alloc_seq (the op after which it counts as live: the
    op that allocated it or first used it; -1: registered when the trace began),
    free_seq (the op whose freed_storage_ids lists it; <NA>: alive at the end),
    and the step, phase, module and op at alloc_seq ("" and -1 before the trace)."""
    frames = [_table(run, rows) for run, rows in _each_run(df, "storages")]
    if not frames:
        return empty_frame(_STORAGE_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_STORAGE_DTYPES)


def _live_by_category(run):
    """[rows, categories] int64: bytes live per category after each row of a run."""
    return np.stack([column() for column in live_columns(run)], axis=1)


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
    for run, rows in _each_run(df, "timeline"):
        live = _live_by_category(run)
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


def peak(df):
    """The highest `live_bytes` of each run and the op after which it was reached (the first, on a tie): views.sql's
    view `peak`, run over the frame's rows."""
    with trace_of(df, "peak", ("seq", "step", "op", "phase", "module", "live_bytes")) as trace:
        return tables.peak(trace)


CATEGORY_DTYPES = {"run": "object", "category": "object", "bytes": "int64", "seq": "int64", "live_pct": "float64"}


def by_category(df, at="peak"):
    """Bytes live per category (see CATEGORIES) in each run, one row per (run, category).

    at   "peak": after the op with the run's highest live_bytes (default);
         "end": after the last op; an int: after the op with that seq;
         "max": each category at its own highest (activations peak when the
         backward begins, gradients when it ends: these are not simultaneous).
    Columns: run, category, bytes, seq (where measured), live_pct (share of
    live_bytes at that seq)."""
    if not (at in AT or (isinstance(at, (int, np.integer)) and not isinstance(at, bool))):
        raise ReportError(f"by_category: at must be one of {list(AT)} or an op's seq (int), got {at!r}")
    frames = [pd.DataFrame(categories_at(run, at)) for run, _ in _each_run(df, "by_category")]
    if not frames:
        return empty_frame(CATEGORY_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(CATEGORY_DTYPES)


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
    for run, rows in _each_run(df, "by_dtype"):
        if not run.n:
            continue
        table = _table(run, rows)
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
