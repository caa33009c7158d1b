"""A loaded trace's columns without a Python object per row.

`reports.load(path, lists="arrow")` keeps the nested list columns (shapes, strides,
dtypes, storage ids) as Arrow arrays inside the DataFrame (pandas' ArrowDtype)
instead of one numpy array per cell: a million rows of them take tens of MB instead
of GBs, and the reports read them here as flat numpy arrays (`flat`) without
building a Python list per row. Rows a table really iterates still come out as
Python lists. The default `lists="objects"` is pandas' own conversion, the
reference every fast path is tested against.

`optrace report` reads no frame of the trace: reports/sql runs its tables in DuckDB, and the
storage-lifetime model reads numpy arrays of the rows (reports.memory.run_rows).
"""

import os
import weakref

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import lean_memory, packet  # lean_memory: the CLI's, kept importable here
from reports.errors import ReportError

__all__ = [
    "LIST_MODES",
    "SharedRuns",
    "cell_lists",
    "cell_objects",
    "concat_frames",
    "first_codes",
    "first_items",
    "flat",
    "has_column",
    "lean_memory",
    "list_array",
    "packets",
    "read_table",
    "to_pandas",
]

LIST_MODES = ("objects", "arrow")


class SharedRuns(dict):
    """`df.attrs["runs"]`: {run name: metadata}, shared by every frame derived from the loaded one.

    pandas deep-copies `attrs` into the result of every operation; a long run's
    metadata (thousands of storage ids) made that most of a report's time. The
    reports only read it, so a derived frame shares this dict instead of a copy."""

    def __deepcopy__(self, memo):
        return self


def has_column(rows, name):
    """`name` is a column of `rows`."""
    return name in rows.columns


def cell_lists(rows, name, positions=None, kind=pa.int64()):
    """The list cells of column `name` at row positions `positions` (None: every row), as one ListArray of `kind`
    items (kind=None: items as stored, possibly a ChunkedArray)."""
    if positions is not None and isinstance(rows[name].dtype, pd.ArrowDtype):
        arr = _take(rows[name], positions)
        return arr if kind is None or arr.type == pa.list_(kind) else arr.cast(pa.list_(kind))
    return list_array(rows[name] if positions is None else rows[name].iloc[positions], kind)


def cell_objects(rows, name, positions=None):
    """The cells of column `name` at row positions `positions` (None: every row), one Python object (list or array) per row."""
    if positions is not None and isinstance(rows[name].dtype, pd.ArrowDtype):
        return _take(rows[name], positions).to_pylist()
    return (rows[name] if positions is None else rows[name].iloc[positions]).to_numpy(dtype=object)


def _take(column, positions):
    """The cells at row positions `positions` of an Arrow-backed list column, as one Array, taken chunk by
    chunk (dictionary items decoded per chunk: no dictionary unification over the whole column)."""
    data = column.array.__arrow_array__()
    chunks = data.chunks if isinstance(data, pa.ChunkedArray) else [data]
    kind = data.type
    if pa.types.is_dictionary(kind.value_type):  # decoded per chunk
        kind = pa.list_(kind.value_type.value_type)
    bounds = np.cumsum([0] + [len(c) for c in chunks])
    pieces, back = _by_piece(
        bounds, np.asarray(positions, dtype=np.int64), lambda i, local: chunks[i].take(pa.array(local)).cast(kind)
    )
    return pa.concat_arrays(pieces).take(back) if pieces else pa.array([], type=kind)


def _by_piece(bounds, positions, take):
    """([take(i, positions within piece i)] for each piece i (rows bounds[i] to bounds[i + 1]) holding some of
    `positions`, the Arrow permutation that puts their concatenation back in the order of `positions`)."""
    piece = np.searchsorted(bounds, positions, side="right") - 1
    taken, order = [], []
    for i in np.unique(piece).tolist():
        mine = np.flatnonzero(piece == i)
        taken.append(take(i, positions[mine] - bounds[i]))
        order.append(mine)
    return taken, pa.array(np.argsort(np.concatenate(order), kind="stable") if order else np.zeros(0, dtype=np.int64))


class _Parts:
    """A trace's columns read part by part, for `to_pandas` to convert once and free column by column."""

    def __init__(self, table):
        self._table = table

    @property
    def column_names(self):
        return self._table.column_names

    @property
    def table(self):
        """The Table itself (for the checks before conversion)."""
        return self._table

    def take(self):
        table, self._table = self._table, None
        return table


def read_table(path, columns, lists="objects", footers=None):
    """The trace's `columns` as a pyarrow Table ("objects"), or as parts `to_pandas` frees as it goes
    (`footers`: the parts' footers already read, as `reports.loading.integrity.footer` keeps them)."""
    import pyarrow.parquet as pq

    from tracer.schema import part_paths

    parts = part_paths(path)
    nested = any(entry.is_dir() for entry in os.scandir(path))
    if lists == "objects":  # the listed parts (a merged part's leftovers left out), or the directory's files
        return pq.read_table(parts if parts and not nested else path, columns=columns)
    if not parts or nested:  # hive rank=R directories and the like: let pyarrow's dataset reader find the files
        return _Parts(pq.read_table(path, columns=columns))
    table = pa.concat_tables(_read_parts(parts, columns, footers))
    if len(parts) > 64 and table.num_rows < 1024 * len(
        parts
    ):  # many small parts: one chunk per column, not one per part
        table = table.combine_chunks()
    return _Parts(table)


def _read_parts(parts, columns, footers):
    """Each part's `columns` as Tables, small parts joined 256 at a time. Many small parts cost what the
    reader does per file: the per-file Python of ParquetFile (its column paths) is done once per schema,
    and small parts are read on a few threads (the decoding releases the GIL), in order."""
    import pyarrow.parquet as pq

    try:
        from pyarrow._parquet import ParquetReader
    except ImportError:  # a pyarrow without it: the public reader
        ParquetReader = None
    known = {}  # the first part's Parquet schema and the leaf column indices of `columns` in it

    def leaves(info):
        if "schema" in known and info.schema.equals(known["schema"]):
            return known["leaves"]
        paths = [info.schema.column(j).path for j in range(info.num_columns)]
        found = [j for name in columns for j, leaf in enumerate(paths) if leaf == name or leaf.startswith(name + ".")]
        known.setdefault("schema", info.schema)
        known.setdefault("leaves", found)
        return found

    def read(part):
        info = footers.get(part) if footers is not None else None  # kept by the load, or read again here
        if ParquetReader is None:
            return pq.ParquetFile(part, metadata=info).read(columns=columns)
        reader = ParquetReader()
        reader.open(part, metadata=info)
        info = reader.metadata
        return reader.read_all(column_indices=leaves(info), use_threads=info.num_rows >= 1024)

    rows = getattr(footers, "rows", {})
    small = len(parts) > 64 and sum(rows.get(p, 1024) for p in parts) < 1024 * len(parts)
    tables = []
    if not small:
        return [read(part) for part in parts]
    from concurrent.futures import ThreadPoolExecutor

    def read_batch(batch):  # a task per 32 parts, not per part: a Future costs about 0.1 ms
        return pa.concat_tables([read(part) for part in batch])

    if parts:
        read(parts[0])  # the schema's leaves, learned before the threads start
    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        for i in range(0, len(parts), 256):  # 10,000 one-row Tables (each with its schema) would take 500 MB
            batches = [parts[j : min(j + 32, i + 256)] for j in range(i, min(i + 256, len(parts)), 32)]
            table = pa.concat_tables(list(pool.map(read_batch, batches)))
            tables.append(table.combine_chunks())
    return tables


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
        if column.num_chunks > 1 and column.type == pa.list_(pa.int64()) or column.num_chunks > 64:
            column = pa.chunked_array([column.combine_chunks()])  # one buffer: `flat` reads its values without a copy;
            # a trace of many small parts: one chunk, not one per part, for every report to walk
        data[name] = column.to_pandas(types_mapper=_arrow_list_dtype)
        del column
    return pd.DataFrame(data, copy=False)


def concat_frames(frames, lists="objects"):
    """One frame of several runs' frames; with lists other than "objects", column by column, each
    run's column freed once copied, so several big runs never take twice their size."""
    if len(frames) == 1:
        return frames[0]
    if lists == "objects":
        return pd.concat(frames, ignore_index=True)
    data = {name: pd.concat([f.pop(name) for f in frames], ignore_index=True) for name in list(frames[0].columns)}
    return pd.DataFrame(data, copy=False)


def list_array(column, kind=pa.int64()):
    """A column of lists (Arrow-backed or objects) as one pyarrow ListArray of `kind` items (kind=None: the
    Arrow data as stored, chunks and dictionary items kept; objects as pyarrow infers them)."""
    if isinstance(column.dtype, pd.ArrowDtype):
        arr = column.array.__arrow_array__()
        if kind is None:
            return arr
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        if arr.offset:  # a slice: give it offsets from 0, as the reports expect
            arr = pa.concat_arrays([arr])
        if arr.type != pa.list_(kind):
            arr = arr.cast(pa.list_(kind))
        return arr
    return pa.array(column.to_numpy(dtype=object), type=None if kind is None else pa.list_(kind))


def _chunks(column, kind):
    """The pyarrow ListArray chunks (of `kind` items) behind a list column (or a ListArray)."""
    if isinstance(column, pa.Array):
        return [column if column.type == pa.list_(kind) else column.cast(pa.list_(kind))]
    if isinstance(column.dtype, pd.ArrowDtype):
        arr = column.array.__arrow_array__()
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        return [c if c.type == pa.list_(kind) else c.cast(pa.list_(kind)) for c in chunks]
    return [pa.array(column.to_numpy(dtype=object), type=pa.list_(kind))]


def first_items(lists):
    """The first item of each list of a ListArray (or ChunkedArray) of strings or dictionary-encoded strings, ''
    for an empty or null list, as numpy objects: codes in Arrow, one Python string per distinct item."""
    codes, words = first_codes(lists)
    return np.array(words, dtype=object)[codes]


def _recode(dictionary, words, index):
    """For each entry of an Arrow dictionary, its index in `words` (extended in place), and a last entry 0 for a null."""
    recode = []
    for w in dictionary.to_pylist():
        w = "" if w is None else w
        if w not in index:
            index[w] = len(words)
            words.append(w)
        recode.append(index[w])
    return np.array(recode + [0], dtype=np.int64)


def first_codes(lists, words=None):
    """(codes, words): the first item of each list is words[code] ('' for an empty or null list).

    `words` (a list starting with '') is extended in place when given, so that codes of several calls share it."""
    chunks = lists.chunks if isinstance(lists, pa.ChunkedArray) else [lists]
    words = [""] if words is None else words
    index = {w: i for i, w in enumerate(words)}
    codes = []
    for chunk in chunks:
        code = np.zeros(len(chunk), dtype=np.int64)
        codes.append(code)
        if pa.types.is_null(chunk.type):  # no list at all (an empty column of objects)
            continue
        if pa.types.is_dictionary(chunk.type.value_type):  # the stored form: first items read from the offsets
            starts = chunk.offsets.to_numpy()
            has = starts[1:] > starts[:-1]
            if chunk.null_count:
                has &= chunk.is_valid().to_numpy(zero_copy_only=False)
            items = chunk.values
            recode = _recode(items.dictionary, words, index)
            indices = items.indices.fill_null(len(recode) - 1) if items.indices.null_count else items.indices
            code[has] = recode[indices.to_numpy()[starts[:-1][has]]]
            continue
        first = pc.list_slice(chunk, 0, 1)
        items = pc.list_flatten(first)
        if not pa.types.is_dictionary(items.type):
            items = pc.dictionary_encode(items)
        recode = _recode(items.dictionary, words, index)
        code[pc.list_parent_indices(first).to_numpy()] = recode[items.indices.fill_null(len(recode) - 1).to_numpy()]
    return (np.concatenate(codes) if codes else np.zeros(0, dtype=np.int64)), words


_FLAT_CACHE = []  # [(weak ref to the Arrow data, kind, (offsets, values))]: the last few `flat` results


def flat(column, kind=pa.int64()):
    """(offsets, values) of a list column: row i's items are values[offsets[i]:offsets[i + 1]]; null rows are empty.

    Integer values come as int64 with -1 for a null item; other values as objects. The arrays are
    read-only: the last few results for Arrow-backed columns are kept, and several reports of one
    frame (roles, storage lifetimes) share them."""
    data = column.array.__arrow_array__() if isinstance(getattr(column, "dtype", None), pd.ArrowDtype) else None
    for cached, cached_kind, result in _FLAT_CACHE:
        if data is not None and cached() is data and cached_kind == kind:
            return result
    chunks = [c for c in _chunks(column, kind) if len(c)]
    bounds = [c.offsets.to_numpy().astype(np.int64) for c in chunks]
    integer = pa.types.is_integer(kind)
    if len(chunks) == 1 and integer and chunks[0].values.type == pa.int64():
        items = chunks[0].values.slice(bounds[0][0], bounds[0][-1] - bounds[0][0])
        if not items.null_count:  # the Arrow buffer itself, read-only: no copy of the values
            offsets = bounds[0] - bounds[0][0] if bounds[0][0] else bounds[0]  # a fresh int64 copy either way
            offsets.flags.writeable = False
            return _remember(data, kind, (offsets, items.to_numpy()))
    total = sum(int(b[-1] - b[0]) for b in bounds)
    offsets = np.zeros(sum(len(c) for c in chunks) + 1, dtype=np.int64)
    values = np.empty(total, dtype=np.int64 if integer else object)
    row = base = 0
    for chunk, b in zip(chunks, bounds):  # chunk by chunk, straight into the preallocated arrays
        items = chunk.values.slice(b[0], b[-1] - b[0])
        if integer and items.null_count:
            items = items.fill_null(-1)
        n = int(b[-1] - b[0])
        values[base : base + n] = items.to_numpy(zero_copy_only=False)
        offsets[row + 1 : row + 1 + len(chunk)] = b[1:] - b[0] + base
        row, base = row + len(chunk), base + n
    offsets.flags.writeable = values.flags.writeable = False
    return _remember(data, kind, (offsets, values))


def _remember(data, kind, result):
    """Keep `flat`'s result for the Arrow data it came from (the last four, each only while its frame lives), and return it."""
    if data is not None:
        _FLAT_CACHE.insert(0, (weakref.ref(data, _forget), kind, result))
        del _FLAT_CACHE[4:]
    return result


def _forget(ref):
    """The frame holding a cached column is gone: drop its `flat` result (its values may view that column's buffer)."""
    _FLAT_CACHE[:] = [entry for entry in _FLAT_CACHE if entry[0] is not ref]


def packets(column):
    """The overload packet ('aten.mm') of every row's op, computed once per distinct op (a categorical
    Series for a categorical column: no string per row)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        names = [packet(op) for op in column.cat.categories]
        unique = list(dict.fromkeys(names))
        recode = np.asarray([unique.index(n) for n in names] or [0], dtype=np.int64)
        codes = column.cat.codes.to_numpy()
        codes = np.where(codes >= 0, recode[np.maximum(codes, 0)], -1)
        return pd.Series(pd.Categorical.from_codes(codes, categories=unique), index=column.index)
    return column.astype(object).map(packet)
