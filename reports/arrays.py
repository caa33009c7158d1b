"""Arrow arrays as numpy arrays and back, read from and built on their buffers, without importing pandas.

pyarrow asks its pandas shim about the value in hand, and the shim imports pandas (about 0.3-0.5 s, once per
process), in `Array.to_numpy`, `pyarrow.array`, `pyarrow.scalar` (so `fill_null(0)` and compute functions given a
Python number), `Schema.empty_table` and `ChunkedArray.combine_chunks` of no chunks. `optrace report` and `report --json` read and build only flat arrays of
fixed-width numbers and bools and of strings, whose Arrow layout is their bytes (a bitmap for bools and nulls): the
arrays made here hold the values those calls give, and every conversion on their path is one of these.

    numpy_of(a, null)      numbers or bools of an Array or ChunkedArray (`null` for a null item)
    values_of(a)           what a.to_numpy(zero_copy_only=False) gives (nulls: NaN for numbers, None for objects)
    objects_of(a)          strings as an object array
    arrow_of(v, mask)      a numpy array of numbers or bools as an Array (null where `mask`)
    array_of(values, t)    Python values as an Array of type t (None a null); strings(names) of str
    scalar(value, t)       a Scalar for a compute function's argument
    empty_table(schema)    a Table of no rows
    whole(c)               a ChunkedArray as one Array (combine_chunks)
    list_lengths(a, null)  a list column's cell lengths (pc.list_value_length), read from its offsets
    list_values(a)         a list column's items (pc.list_flatten) as numbers, read from its offsets
    nulls_of(a)            whether each item is null (pc.is_null), read from the validity bitmap

(tracer.store.arrow_arrays does the same for the part writer, which reports may not import: tests/test_structure.py.)
"""

import numpy as np
import pyarrow as pa

__all__ = [
    "array_of",
    "arrow_of",
    "empty_table",
    "list_lengths",
    "list_values",
    "nulls_of",
    "numpy_of",
    "objects_of",
    "scalar",
    "strings",
    "values_of",
    "whole",
]

_NUMPY = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
    pa.bool_(): np.bool_,
}
_ARROW = {np.dtype(v): k for k, v in _NUMPY.items()}


def _bits(buffer, offset, length):
    """`length` bits of a bitmap from bit `offset` (Arrow's order: least significant bit first) as bools."""
    return np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), count=offset + length, bitorder="little")[offset:].view(
        bool
    )


def _chunk(array, null):
    kind = _NUMPY.get(array.type)
    if kind is None:
        raise TypeError(f"numpy_of: a fixed-width number or bool type expected, got {array.type}")
    if not len(array):
        return np.zeros(0, dtype=kind)
    validity, data = array.buffers()[:2]
    if kind is np.bool_:
        values = _bits(data, array.offset, len(array))
    else:
        values = np.frombuffer(data, dtype=kind)[array.offset : array.offset + len(array)]
    if not array.null_count:
        return values
    if null is None:
        raise ValueError(f"numpy_of: {array.null_count} null(s) where no value stands for them")
    return np.where(_bits(validity, array.offset, len(array)), values, np.asarray(null, dtype=kind))


def numpy_of(data, null=None):
    """What `data.to_numpy()` gives of an Array or ChunkedArray of fixed-width numbers or bools (read-only; a view
    of the buffer of a single chunk of numbers), `null` where an item is null (None: none may be)."""
    if isinstance(data, pa.ChunkedArray):
        chunks = [_chunk(c, null) for c in data.chunks]
        if len(chunks) == 1:
            return chunks[0]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=_NUMPY[data.type])
    return _chunk(data, null)


def values_of(data):
    """What `data.to_numpy(zero_copy_only=False)` gives of an Array or ChunkedArray of numbers, bools or strings:
    with nulls, integers as float64 and floats with NaN for them, bools and strings as objects with None."""
    kind = _NUMPY.get(data.type)
    if kind is None or kind is np.bool_ and data.null_count:
        return objects_of(data)
    if not data.null_count:
        return numpy_of(data)
    if np.dtype(kind).kind == "f":
        return numpy_of(data, null=np.nan)
    values = numpy_of(data, null=0).astype(np.float64)
    values[numpy_of(data.is_null())] = np.nan
    return values


def objects_of(data):
    """What `data.to_numpy(zero_copy_only=False)` gives of an Array of strings: an object array (None: null)."""
    values = np.empty(len(data), dtype=object)
    values[:] = data.to_pylist()
    return values


def arrow_of(values, mask=None):
    """What `pyarrow.array(values, mask=mask)` makes of a 1-d numpy array of fixed-width numbers or bools: null
    where `mask` (a bool array) is True."""
    values = np.ascontiguousarray(values)
    data = np.packbits(values, bitorder="little") if values.dtype == bool else values
    validity = None if mask is None else pa.py_buffer(np.packbits(~np.asarray(mask, dtype=bool), bitorder="little"))
    nulls = 0 if mask is None else int(np.count_nonzero(mask))
    return pa.Array.from_buffers(_ARROW[values.dtype], len(values), [validity, pa.py_buffer(data)], null_count=nulls)


def strings(names):
    """What `pyarrow.array(names, pa.string())` makes of a sequence of str (None: null)."""
    encoded = [b"" if name is None else str(name).encode() for name in names]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum(np.fromiter((len(e) for e in encoded), np.int64, len(encoded)), out=offsets[1:])
    missing = np.fromiter((name is None for name in names), bool, len(encoded))
    validity = pa.py_buffer(np.packbits(~missing, bitorder="little")) if missing.any() else None
    return pa.Array.from_buffers(
        pa.string(),
        len(encoded),
        [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
        null_count=int(missing.sum()),
    )


def array_of(values, kind):
    """What `pyarrow.array(values, kind)` makes of a sequence of Python numbers, bools or str (kind a pyarrow type):
    None a null, a float NaN a NaN."""
    if pa.types.is_string(kind):
        return strings(values)
    missing = np.fromiter((v is None for v in values), bool, len(values))
    data = np.asarray([0 if v is None else v for v in values], dtype=_NUMPY[kind])
    return arrow_of(data, mask=missing if missing.any() else None)


def scalar(value, kind):
    """What `pyarrow.scalar(value, kind)` makes of a number, bool or str (kind a pyarrow type): a compute function's
    argument (a Python value there is converted as pyarrow.scalar converts it)."""
    if pa.types.is_string(kind):
        return strings([value])[0]
    return arrow_of(np.asarray([value], dtype=_NUMPY[kind]))[0]


def empty_table(schema):
    """`schema.empty_table()`: a table of no rows."""
    return pa.Table.from_batches([], schema=schema)


def whole(data):
    """`data.combine_chunks()` of a ChunkedArray: its one chunk as it is, or the chunks in one Array (an empty Array
    of its type when it has none, which combine_chunks makes through pyarrow.array)."""
    if data.num_chunks == 1:
        return data.chunk(0)
    return data.combine_chunks() if data.num_chunks else pa.nulls(0, data.type)


def _chunks_of(data, each, empty):
    """each(chunk) of an Array, or of every chunk of a ChunkedArray joined (`empty` when it has none)."""
    if not isinstance(data, pa.ChunkedArray):
        return each(data)
    found = [each(c) for c in data.chunks]
    return found[0] if len(found) == 1 else np.concatenate(found) if found else empty


def nulls_of(data):
    """What `data.is_null()` gives of an Array or ChunkedArray, as a bool array, from its validity bitmap."""

    def each(chunk):
        if not chunk.null_count:
            return np.zeros(len(chunk), dtype=bool)
        if pa.types.is_null(chunk.type):
            return np.ones(len(chunk), dtype=bool)
        return ~_bits(chunk.buffers()[0], chunk.offset, len(chunk))

    return _chunks_of(data, each, np.zeros(0, dtype=bool))


def list_lengths(data, null=None):
    """What numpy_of(pc.list_value_length(data), null) gives of a list Array or ChunkedArray (int32, int64 for
    large lists): each cell's item count, the difference of its offsets (`null` for a null cell; None: none may be)."""

    def each(chunk):
        offsets = numpy_of(chunk.offsets)
        lengths = offsets[1:] - offsets[:-1]
        if not chunk.null_count:
            return lengths
        if null is None:
            raise ValueError(f"list_lengths: {chunk.null_count} null cell(s) where no value stands for them")
        return np.where(nulls_of(chunk), np.asarray(null, dtype=lengths.dtype), lengths)

    return _chunks_of(data, each, np.zeros(0, dtype=np.int32))


def list_values(data):
    """What numpy_of(pc.list_flatten(data)) gives of a list Array or ChunkedArray of fixed-width numbers: the items
    of its cells in order (no item may be null), a view of the items between its first and last offsets where no
    cell is null."""

    def each(chunk):
        if chunk.null_count:  # a null cell's items (a slot Arrow lets hold some) are left out, as list_flatten does
            import pyarrow.compute as pc

            return numpy_of(pc.list_flatten(chunk))
        offsets = numpy_of(chunk.offsets)
        start, end = int(offsets[0]), int(offsets[-1])
        return numpy_of(chunk.values.slice(start, end - start))

    return _chunks_of(data, each, np.zeros(0, dtype=_NUMPY.get(data.type.value_type, np.int64)))
