"""A loaded trace's columns without a Python object per row.

`reports.load(path, lists="arrow")` keeps the nested list columns (shapes, strides,
dtypes, storage ids) as Arrow arrays inside the DataFrame (pandas' ArrowDtype)
instead of one numpy array per cell: a million rows of them take tens of MB instead
of GBs, and the reports read them here as flat numpy arrays (`flat`) without
building a Python list per row. Rows a table really iterates still come out as
Python lists. The default `lists="objects"` is pandas' own conversion, the
reference every fast path is tested against.
"""

import numpy as np
import pandas as pd
import pyarrow as pa

from reports._util import packet
from reports.errors import ReportError

__all__ = ["LIST_MODES", "SharedRuns", "flat", "list_array", "packets", "to_pandas"]

LIST_MODES = ("objects", "arrow")


class SharedRuns(dict):
    """`df.attrs["runs"]`: {run name: metadata}, shared by every frame derived from the loaded one.

    pandas deep-copies `attrs` into the result of every operation; a long run's
    metadata (thousands of storage ids) made that most of a report's time. The
    reports only read it, so a derived frame shares this dict instead of a copy."""

    def __deepcopy__(self, memo):
        return self


def _arrow_list_dtype(typ):
    return pd.ArrowDtype(typ) if pa.types.is_list(typ) or pa.types.is_large_list(typ) else None


def to_pandas(table, lists="objects"):
    """`table` as a DataFrame: list columns as Python objects ("objects") or as Arrow arrays ("arrow")."""
    if lists not in LIST_MODES:
        raise ReportError(f"load: lists must be one of {list(LIST_MODES)}, got {lists!r}")
    if lists == "objects":
        return table.to_pandas()
    return table.to_pandas(types_mapper=_arrow_list_dtype)


def list_array(column, kind=pa.int64()):
    """A column of lists (Arrow-backed or objects) as one pyarrow ListArray of `kind` items."""
    if isinstance(column.dtype, pd.ArrowDtype):
        arr = column.array.__arrow_array__()
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        if arr.offset:  # a slice: give it offsets from 0, as the reports expect
            arr = pa.concat_arrays([arr])
        if arr.type != pa.list_(kind):
            arr = arr.cast(pa.list_(kind))
        return arr
    return pa.array(column.to_numpy(dtype=object), type=pa.list_(kind))


def flat(column, kind=pa.int64()):
    """(offsets, values) of a list column: row i's items are values[offsets[i]:offsets[i + 1]]; null rows are empty."""
    arr = list_array(column, kind)
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0]) if len(arr) else arr.values.slice(0, 0)
    offsets = offsets - offsets[0]
    if pa.types.is_integer(kind):
        values = values.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    else:
        values = values.to_numpy(zero_copy_only=False)
    return offsets, values


def packets(column):
    """The overload packet ('aten.mm') of every row's op, as an object Series, computed once per distinct op."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        names = np.asarray([packet(op) for op in column.cat.categories], dtype=object)
        codes = column.cat.codes.to_numpy()
        out = np.where(codes >= 0, names[np.maximum(codes, 0)] if len(names) else None, None)
        return pd.Series(out, index=column.index, dtype=object)
    return column.astype(object).map(packet)
