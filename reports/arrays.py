"""Arrow arrays as numpy arrays and back, read from and built on their buffers, without importing pandas.

pyarrow asks its pandas shim about the value in hand, and the shim imports pandas (about 0.3-0.5 s, once per
process), in `Array.to_numpy`, `pyarrow.array`, `pyarrow.scalar` (so `fill_null(0)` and compute functions given a
Python number) and `Schema.empty_table`. The memory path of `optrace report` (reports.memory.sql_categories) reads
and builds only flat arrays of fixed-width numbers and lists of names, whose Arrow layout is their bytes: the arrays
made here hold the values those calls give. (tracer.store.arrow_arrays does the same for the part writer, which
reports may not import: tests/test_structure.py.)
"""

import numpy as np
import pyarrow as pa

__all__ = ["arrow_of", "empty_table", "numpy_of", "objects_of", "strings"]

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
}
_ARROW = {np.dtype(v): k for k, v in _NUMPY.items()}


def _chunk(array, null):
    kind = _NUMPY.get(array.type)
    if kind is None:
        raise TypeError(f"numpy_of: a fixed-width number type expected, got {array.type}")
    if not len(array):
        return np.zeros(0, dtype=kind)
    validity, data = array.buffers()[:2]
    values = np.frombuffer(data, dtype=kind)[array.offset : array.offset + len(array)]
    if not array.null_count:
        return values
    if null is None:
        raise ValueError(f"numpy_of: {array.null_count} null(s) where no value stands for them")
    bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
    return np.where(bits[array.offset : array.offset + len(array)].astype(bool), values, null)


def numpy_of(data, null=None):
    """What `data.to_numpy()` gives of an Array or ChunkedArray of fixed-width numbers (read-only; a view of the
    buffer of a single chunk), `null` where an item is null (None: none may be)."""
    if isinstance(data, pa.ChunkedArray):
        chunks = [_chunk(c, null) for c in data.chunks]
        if len(chunks) == 1:
            return chunks[0]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=_NUMPY[data.type])
    return _chunk(data, null)


def objects_of(data):
    """What `data.to_numpy(zero_copy_only=False)` gives of an Array of strings: an object array (None: null)."""
    values = np.empty(len(data), dtype=object)
    values[:] = data.to_pylist()
    return values


def arrow_of(values):
    """What `pyarrow.array(values)` makes of a 1-d numpy array of fixed-width numbers (no nulls)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(_ARROW[values.dtype], len(values), [None, pa.py_buffer(values)])


def strings(names):
    """What `pyarrow.array(names, pa.string())` makes of a sequence of str."""
    encoded = [str(name).encode() for name in names]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum(np.fromiter((len(e) for e in encoded), np.int64, len(encoded)), out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def empty_table(schema):
    """`schema.empty_table()`: a table of no rows."""
    return pa.Table.from_batches([], schema=schema)
