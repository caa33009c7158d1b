"""numpy arrays and lists of names as Arrow arrays, built from their buffers, without importing pandas.

`pyarrow.array` asks pyarrow's pandas shim whether its input is a pandas object, and the shim imports pandas (about
0.5 s, once per process) whatever the input. The part writer (tracer.store.row_buffer.RowBuffer.table) only ever converts
flat numpy arrays of int32, int64 and bool and lists of strings, whose Arrow layout is their bytes: the arrays
built here hold the same values, so the Parquet parts written from them are the same bytes.
"""

import numpy as np
import pyarrow as pa

_TYPES = {np.dtype(np.int32): pa.int32(), np.dtype(np.int64): pa.int64()}
_INT64, _ARROW_INT64 = np.dtype(np.int64), pa.int64()


def _bits(flags):
    """A bool array as an Arrow bitmap: least significant bit first, the unused bits of the last byte 0."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def from_numpy(values, mask=None):
    """What `pa.array(values, mask=mask)` makes of a 1-d int32, int64 or bool numpy array; `mask` true where null."""
    if mask is None and values.dtype == _INT64 and values.flags.c_contiguous:  # most columns: two calls
        return pa.Array.from_buffers(_ARROW_INT64, len(values), [None, pa.py_buffer(values)])
    values = np.ascontiguousarray(values)
    if values.dtype == np.bool_:
        typ, data = pa.bool_(), _bits(values)
    else:
        typ, data = _TYPES[values.dtype], pa.py_buffer(values)
    validity = None if mask is None or not mask.any() else _bits(~np.asarray(mask, bool))
    return pa.Array.from_buffers(typ, len(values), [validity, data])


def strings(names):
    """What `pa.array(names, pa.string())` makes of a list of str (a lone surrogate raises UnicodeEncodeError)."""
    encoded = [name.encode() for name in names]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum(np.array([len(e) for e in encoded], np.int64), out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )
