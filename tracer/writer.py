"""Rows to Parquet: column buffers of flat integer arrays, one part file per flush.

The dispatch hook appends plain integers to `array.array` buffers (no Python
object per row or per tensor survives the hook, so the garbage collector has
nothing to scan); at flush time the buffers become Arrow arrays in bulk.

A part is written under a hidden temporary name and renamed when complete, so a
reader, or a process killed mid-write, never sees a half-written part: pyarrow's
dataset discovery skips names that start with '.'.
"""

import fnmatch
import json
import os
from array import array

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracer.errors import TraceError
from tracer.schema import ARROW_SCHEMA, FLOP_KINDS, METADATA_KEY, PART_GLOB, PHASES, part_name


def prepare_directory(path):
    """Check that `path` can hold a trace and clear an earlier trace there.

    Raises TraceError (before anything runs) when the parent directory is
    missing or not writable, or when `path` is a file or a directory holding
    anything other than an earlier optrace trace."""
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise TraceError(f"cannot write trace {path!r}: directory {parent!r} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TraceError(f"cannot write trace {path!r}: directory {parent!r} is not writable")
    try:
        _clear_or_create(path)
    except OSError as exc:
        raise TraceError(f"cannot write trace {path!r}: {exc.strerror or exc}") from None
    return path


def _clear_or_create(path):
    if os.path.isdir(path):
        names = os.listdir(path)
        other = [n for n in names if not (fnmatch.fnmatch(n, PART_GLOB) or n.startswith(".part-"))]
        if other:
            raise TraceError(
                f"cannot write trace {path!r}: it is a directory holding files that are not optrace parts "
                f"(e.g. {sorted(other)[0]!r}); choose a new path"
            )
        for name in names:
            os.remove(os.path.join(path, name))
    elif os.path.exists(path):
        raise TraceError(f"cannot write trace {path!r}: a file of that name exists; a trace is a directory of parts")
    else:
        os.mkdir(path)


class Names:
    """Strings interned to small ints: the dictionary of one dictionary-encoded column."""

    def __init__(self, fixed=()):
        self.ids = {name: i for i, name in enumerate(fixed)}
        self.names = list(fixed)

    def id(self, name):
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i

    def dictionary(self, indices):
        return pa.DictionaryArray.from_arrays(pa.array(_np(indices, np.int32)), pa.array(self.names, pa.string()))


def _np(buffer, dtype):
    return np.frombuffer(buffer, dtype=dtype) if len(buffer) else np.zeros(0, dtype)


def _offsets(counts):
    """Arrow list offsets from per-list lengths: [2, 0, 3] -> [0, 2, 2, 5]."""
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(_np(counts, np.int32), out=offsets[1:])
    return pa.array(offsets)


class Tensors:
    """Flat buffers for the tensors of many rows (the inputs, or the outputs)."""

    def __init__(self):
        self.count = array("i")  # tensors per row
        self.ndim = array("i")  # per tensor
        self.dims = array("q")  # every size of every tensor, flat
        self.strides = array("q")
        self.dtype = array("i")  # index into the dtype Names
        self.sid = array("q")  # storage id

    def mark(self):
        return len(self.ndim), len(self.dims)

    def rollback(self, mark):
        tensors, dims = mark
        for buf in (self.ndim, self.dtype, self.sid):
            del buf[tensors:]
        del self.dims[dims:], self.strides[dims:]

    def arrays(self, dtypes):
        """Arrow columns: shapes, dtypes, strides, storage ids."""
        rows = _offsets(self.count)
        per_tensor = _offsets(self.ndim)
        shapes = pa.ListArray.from_arrays(rows, pa.ListArray.from_arrays(per_tensor, pa.array(_np(self.dims, np.int64))))
        strides = pa.ListArray.from_arrays(
            rows, pa.ListArray.from_arrays(per_tensor, pa.array(_np(self.strides, np.int64)))
        )
        dtype = pa.ListArray.from_arrays(rows, dtypes.dictionary(self.dtype))
        sids = pa.ListArray.from_arrays(rows, pa.array(_np(self.sid, np.int64)))
        return shapes, dtype, strides, sids


class RowBuffer:
    """Column buffers for the rows of one part, in the schema's terms."""

    INT_COLUMNS = ("seq", "step", "flops", "bytes_allocated", "live_bytes", "bytes_read", "bytes_written", "duration_ns")

    def __init__(self):
        for name in self.INT_COLUMNS:
            setattr(self, name, array("q"))
        self.op = array("i")
        self.phase = array("i")
        self.module = array("i")
        self.device = array("i")
        self.kind = array("i")
        self.flags = array("b")  # bit 0: is_view, bit 1: inplace
        self.causal = array("b")  # -1: not attention
        self.inputs = Tensors()
        self.outputs = Tensors()
        self.freed_count = array("i")
        self.freed = array("q")

    def __len__(self):
        return len(self.seq)

    def table(self, names, metadata):
        """The rows as a pyarrow Table with the trace schema and `metadata` attached."""
        inputs = self.inputs.arrays(names["dtype"])
        outputs = self.outputs.arrays(names["dtype"])
        flags = _np(self.flags, np.int8)
        causal = _np(self.causal, np.int8)
        freed = pa.ListArray.from_arrays(_offsets(self.freed_count), pa.array(_np(self.freed, np.int64)))
        ints = {name: pa.array(_np(getattr(self, name), np.int64)) for name in self.INT_COLUMNS}
        columns = {
            **ints,
            "op": names["op"].dictionary(self.op),
            "phase": names["phase"].dictionary(self.phase),
            "module": names["module"].dictionary(self.module),
            "device": names["device"].dictionary(self.device),
            "input_shapes": inputs[0],
            "input_dtypes": inputs[1],
            "input_strides": inputs[2],
            "input_storage_ids": inputs[3],
            "output_shapes": outputs[0],
            "output_dtypes": outputs[1],
            "output_strides": outputs[2],
            "output_storage_ids": outputs[3],
            "freed_storage_ids": freed,
            "is_view": pa.array((flags & 1).astype(bool)),
            "inplace": pa.array((flags & 2).astype(bool)),
            "flop_kind": names["kind"].dictionary(self.kind),
            "causal": pa.array(causal == 1, mask=causal < 0),
        }
        blob = json.dumps(metadata, default=str).encode()
        schema = ARROW_SCHEMA.with_metadata({METADATA_KEY: blob})
        return pa.Table.from_arrays([columns[field.name] for field in ARROW_SCHEMA], schema=schema)


def new_names():
    """The string tables of one trace: fixed for phase and kind, growing for the rest."""
    return {"op": Names(), "phase": Names(PHASES), "module": Names(), "device": Names(), "kind": Names(FLOP_KINDS), "dtype": Names()}


class PartWriter:
    """Writes RowBuffers as numbered parts of one trace directory."""

    def __init__(self, directory):
        self.directory = directory
        self.names = new_names()
        self.parts = 0
        self.rows = 0

    def write(self, rows, metadata):
        table = rows.table(self.names, metadata)
        name = part_name(self.parts)
        tmp = os.path.join(self.directory, "." + name + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, os.path.join(self.directory, name))
        self.parts += 1
        self.rows += len(rows)
