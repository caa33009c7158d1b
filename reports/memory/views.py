"""Views and copies: which ops shared storage for free and which materialised data.

Lecture 2: "views are free, copying takes both (additional) memory and compute".
Under the tracer:

  view  the row's is_view flag: every output shares an input's storage and
        nothing is written (x[0], x.t(), x.view(), x.permute(), x.expand(),
        the aten._unsafe_view that follows a reshape's copy): 0 bytes.
  copy  an op whose only job is to move data into new memory or into another
        tensor (COPY_OPS in reports._util, and any aten.*_copy op):
          aten.clone     x.contiguous() of a non-contiguous x, x.clone(), and
                         x.reshape() of a non-contiguous x (clone, then _unsafe_view)
          aten._to_copy  x.to(dtype), x.to(copy=True), x.float(), autocast casts
          aten.copy_     y.copy_(x), y[...] = x: writes into an existing tensor,
                         so it allocates nothing but still moves bytes
          aten.cat, aten.stack, aten.repeat: assemble a new tensor from copies
x.contiguous() of an already contiguous x is no op at all: it does not reach the
tracer.
"""

import numpy as np
import pandas as pd
import pyarrow as pa

from reports._util import COPY_OPS, empty_frame, is_copy
from reports.loading.columns import cell_lists, first_items
from reports.loading.load import require, runs_of
from reports.sql import tables
from reports.sql.frame import trace_of

__all__ = ["COPY_OPS", "copies", "is_copy", "views"]


_KIND_NAMES = np.array(["", "view", "copy"], dtype=object)


def _kind_codes(rows):
    """0 (neither), 1 (view) or 2 (copy) for each row: an index into _KIND_NAMES."""
    ops = rows["op"]
    copy_ops = {op for op in pd.unique(ops) if is_copy(op)}
    view = rows["is_view"].to_numpy(dtype=bool)
    copy = ops.isin(copy_ops).to_numpy() & ~view
    return np.where(view, 1, np.where(copy, 2, 0)).astype(np.int8)


def _kinds(rows):
    """'view', 'copy' or '' for each row."""
    return _KIND_NAMES[_kind_codes(rows)]


def _casts(rows):
    """For each row: does its first output have another dtype than its first input (a dtype conversion)?"""
    ins = first_items(cell_lists(rows, "input_dtypes", kind=None))
    outs = first_items(cell_lists(rows, "output_dtypes", kind=None))
    return (ins != "") & (outs != "") & (ins != outs)


_VIEW_COLUMNS = ("op", "is_view", "bytes_allocated", "bytes_written")


def views(df):
    """View ops against copying ops: one row per (run, kind, op), views first, then copies by bytes.

    Columns: kind ("view" or "copy"), op, ops (how many calls), bytes_allocated
    (new memory: 0 for views), bytes_written (data moved), allocated_pct
    (share of all the bytes the run's ops allocated). views.sql's view `views`, run over the frame's rows."""
    if not isinstance(df, pa.Table):
        require(df, _VIEW_COLUMNS, "views")
        runs_of(df)  # a frame from reports.load, or a one-line error
    with trace_of(df, "views", _VIEW_COLUMNS, ["flop_kind", "phase"]) as trace:
        return tables.views(trace)


_COPIES = {
    "run": "object",
    "module": "object",
    "phase": "object",
    "op": "object",
    "ops": "int64",
    "casts": "int64",
    "bytes_allocated": "int64",
    "bytes_written": "int64",
}
_COPY_COLUMNS = (
    "op",
    "module",
    "phase",
    "is_view",
    "input_dtypes",
    "output_dtypes",
    "bytes_allocated",
    "bytes_written",
)


def copies(df):
    """Which ops materialised copies, where, and what they cost: one row per (run, module, phase, op).

    Columns: ops (calls), casts (calls that also changed the dtype: x.to(bf16),
    autocast), bytes_allocated (new memory the copies took), bytes_written (data
    moved, including copy_ into existing tensors). Most bytes first."""
    require(df, _COPY_COLUMNS, "copies")
    frames = []
    for name in runs_of(df):
        rows = df[df["run"] == name]
        rows = rows[_kinds(rows) == "copy"]
        if not len(rows):
            continue
        table = (
            pd.DataFrame(
                {
                    "module": rows["module"].astype(object).to_numpy(),
                    "phase": rows["phase"].astype(object).to_numpy(),
                    "op": rows["op"].astype(object).to_numpy(),
                    "casts": _casts(rows).astype(np.int64),
                    "bytes_allocated": rows["bytes_allocated"].to_numpy(),
                    "bytes_written": rows["bytes_written"].to_numpy(),
                }
            )
            .groupby(["module", "phase", "op"], sort=False)
            .agg(
                ops=("op", "size"),
                casts=("casts", "sum"),
                bytes_allocated=("bytes_allocated", "sum"),
                bytes_written=("bytes_written", "sum"),
            )
            .reset_index()
            .sort_values(["bytes_allocated", "bytes_written", "ops"], ascending=False, kind="stable")
        )
        table.insert(0, "run", name)
        frames.append(table)
    if not frames:
        return empty_frame(_COPIES)
    return pd.concat(frames, ignore_index=True)[list(_COPIES)].astype(_COPIES)
