"""A loaded trace's columns without a Python object per row.

`reports.load(path, lists="arrow")` keeps the nested list columns (shapes, strides,
dtypes, storage ids) as Arrow arrays inside the DataFrame (pandas' ArrowDtype)
instead of one numpy array per cell: a million rows of them take tens of MB instead
of GBs, and the reports read them here as flat numpy arrays (`flat`) without
building a Python list per row. Rows a table really iterates still come out as
Python lists. The default `lists="objects"` is pandas' own conversion, the
reference every fast path is tested against.

`lists="deferred"` (what `optrace report` uses) also leaves the shape and stride
columns (DEFERRED) out of the frame: the few rows a report needs them for (storages
first seen as inputs, ops with several new outputs, fused attention backward) are
read from the files by `cell_lists` / `cell_objects` when asked. The frame's row
labels locate its rows in the files, so keep the index a deferred frame was loaded with.
"""

import numpy as np
import pandas as pd
import pyarrow as pa

from reports._util import packet
from reports.errors import ReportError

__all__ = [
    "DEFERRED", "LIST_MODES", "Deferred", "SharedRuns", "cell_lists", "cell_objects", "flat", "has_column",
    "lean_memory", "list_array", "packets", "read_table", "to_pandas",
]  # fmt: skip

LIST_MODES = ("objects", "arrow", "deferred")
DEFERRED = ("input_shapes", "input_strides", "output_shapes", "output_strides")


class SharedRuns(dict):
    """`df.attrs["runs"]`: {run name: metadata}, shared by every frame derived from the loaded one.

    pandas deep-copies `attrs` into the result of every operation; a long run's
    metadata (thousands of storage ids) made that most of a report's time. The
    reports only read it, so a derived frame shares this dict instead of a copy."""

    def __deepcopy__(self, memo):
        return self


class Deferred:
    """`df.attrs["deferred"]` of a frame loaded with lists="deferred": the columns left in the
    files, and for each run its trace path and the row label of its first row."""

    def __init__(self, columns, runs):
        self.columns, self.runs = tuple(columns), dict(runs)  # runs: {run name: (path, first label)}

    def __deepcopy__(self, memo):
        return self

    def read(self, rows, name, positions):
        """Column `name` at row positions `positions` of `rows` (a frame derived from the loaded one), as Arrow."""
        import pyarrow.parquet as pq

        labels = rows.index.to_numpy()[positions]
        runs = rows["run"].to_numpy()[positions]
        pieces, order = [], []
        for run in dict.fromkeys(runs.tolist()):
            path, start = self.runs[run]
            mine = np.flatnonzero(runs == run)
            column = pq.read_table(path, columns=[name]).column(name)
            pieces.append(column.take(pa.array(labels[mine] - start)).combine_chunks())
            order.append(mine)
        if not pieces:
            return pa.array([], type=pa.list_(pa.list_(pa.int64())))
        joined = pa.concat_arrays(pieces)
        return joined.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))


def _deferred(rows, name):
    found = rows.attrs.get("deferred")
    return found if isinstance(found, Deferred) and name in found.columns and name not in rows.columns else None


def has_column(rows, name):
    """`name` is a column of `rows`, in the frame or left in the files (lists="deferred")."""
    return name in rows.columns or _deferred(rows, name) is not None


def cell_lists(rows, name, positions, kind):
    """The list cells of column `name` at row positions `positions`, as one pyarrow ListArray of `kind` items."""
    deferred = _deferred(rows, name)
    if deferred is None:
        return list_array(rows[name].iloc[positions], kind)
    arr = deferred.read(rows, name, positions)
    return arr if arr.type == pa.list_(kind) else arr.cast(pa.list_(kind))


def cell_objects(rows, name, positions):
    """The cells of column `name` at row positions `positions`, one Python object (list or array) per row."""
    deferred = _deferred(rows, name)
    if deferred is None:
        return rows[name].iloc[positions].to_numpy(dtype=object)
    return deferred.read(rows, name, positions).to_pylist()


def lean_memory():
    """Make Arrow hand freed memory back to the system at once, for this process (the CLI calls this).

    mimalloc, Arrow's default pool, and the C library's malloc both keep freed pages: a
    million-row trace read part by part left about its own size of RSS behind. jemalloc
    with no decay returns them; the C library's pool is the fallback."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(0)
    except (NotImplementedError, pa.ArrowNotImplementedError):  # a pyarrow built without jemalloc
        pa.set_memory_pool(pa.system_memory_pool())


class _Parts:
    """A trace's columns read part by part, for `to_pandas` to convert once and free column by column."""

    def __init__(self, table):
        self._table = table

    @property
    def column_names(self):
        return self._table.column_names

    def take(self):
        table, self._table = self._table, None
        return table


def read_table(path, columns, lists="objects"):
    """The trace's `columns` as a pyarrow Table ("objects"), or as parts `to_pandas` frees as it goes."""
    import os

    import pyarrow.parquet as pq

    from tracer.schema import part_paths

    if lists == "objects":
        return pq.read_table(path, columns=columns)
    parts = part_paths(path)
    nested = any(entry.is_dir() for entry in os.scandir(path))
    if not parts or nested:  # hive rank=R directories and the like: let pyarrow's dataset reader find the files
        return _Parts(pq.read_table(path, columns=columns))
    return _Parts(pa.concat_tables([pq.read_table(part, columns=columns) for part in parts]))


def _arrow_list_dtype(typ):
    return pd.ArrowDtype(typ) if pa.types.is_list(typ) or pa.types.is_large_list(typ) else None


def to_pandas(table, lists="objects"):
    """`table` as a DataFrame: list columns as Python objects ("objects") or as Arrow arrays ("arrow")."""
    if lists not in LIST_MODES:
        raise ReportError(f"load: lists must be one of {list(LIST_MODES)}, got {lists!r}")
    if not isinstance(table, _Parts):
        return table.to_pandas() if lists == "objects" else table.to_pandas(types_mapper=_arrow_list_dtype)
    table = table.take()  # column by column, each Arrow column freed once converted: no second copy of the trace
    data = {}
    for name in table.column_names:
        column = table.column(name)
        table = table.drop_columns([name])
        data[name] = column.to_pandas(types_mapper=_arrow_list_dtype)
        del column
    return pd.DataFrame(data, copy=False)


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
