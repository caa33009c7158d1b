"""The rows of a part before it is written: column buffers of flat integer arrays (RowBuffer), the row's layout
(ROW_FIELDS) and the string tables of the dictionary columns (Names), and the Arrow table they become
(RowBuffer.table), which tracer.store.writer.PartWriter writes.

The dispatch hook appends plain integers to `array.array` buffers (no Python object
per row or per tensor survives the hook, so the garbage collector has nothing to
scan); at flush time numpy turns them into Arrow columns in bulk. Each list column's
values have a buffer of their own (input sizes, output strides, ...), so a list
column is its values and its offsets, with no value picked out of a shared buffer.
"""

import functools
import json
import struct
import sys
from array import array

import numpy as np
import pyarrow as pa

from tracer.schema import ARROW_SCHEMA, CAUSAL_NONE, FLOP_KINDS, GRAD_MODES, METADATA_KEY, NO_VALUE, PHASES
from tracer.store.arrow_arrays import from_numpy, strings


class Names:
    """Strings interned to small ints: the dictionary of one dictionary-encoded column."""

    def __init__(self, fixed=()):
        self.ids = {name: i for i, name in enumerate(fixed)}
        self.names = list(fixed)
        self._strings = None  # strings(names) as of the last `dictionary` (names only grow: stale when shorter)

    def id(self, name):
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i

    def dictionary(self, indices):
        """The column of `indices` (int32, or cast to it) into these names."""
        if self._strings is None or len(self._strings) != len(self.names):
            self._strings = _dictionary(tuple(self.names))
        return pa.DictionaryArray.from_arrays(from_numpy(indices.astype(np.int32, copy=False)), self._strings)


@functools.lru_cache(maxsize=64)
def _dictionary(names):
    """strings(names), made once per process for each list of names: every trace has the same fixed names (phases,
    FLOP kinds, grad modes) and traces of one program mostly the same ops, modules and devices, in the same order.
    An Arrow array is immutable, so one serves every part that has these names."""
    return strings(names)


def _np(buffer, dtype):
    return np.frombuffer(buffer, dtype=dtype) if len(buffer) else np.zeros(0, dtype)


def _bounds(counts):
    """List offsets from per-list lengths, as int32: [2, 0, 3] -> [0, 2, 2, 5]."""
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def _offsets(counts):
    """Arrow list offsets from per-list lengths: [2, 0, 3] -> [0, 2, 2, 5]."""
    return from_numpy(_bounds(counts))


def _lists(counts, values):
    return pa.ListArray.from_arrays(_offsets(counts), values)


# The integers of one row, in RowBuffer.ints. Row order is seq order, so seq itself
# is not stored: a part's rows are numbered from the part's first seq.
# flops: -1 means one FLOP per output element, counted here from the output shapes.
# inplace_bytes: bytes of the inputs the op wrote into (0 unless inplace); out_bytes: of
# those, the out= arguments, which are written but not read. start: perf_counter_ns at the
# op's start (the writer adds clock_offset_ns). causal, busy_ns, comm_bytes and group_size
# use the schema's sentinels (CAUSAL_NONE, NO_VALUE) for null. bound: flops_bound (0 or 1);
# groups: how many group sizes the row appended to RowBuffer.groups, NO_VALUE for null. grad_mode: a
# tracer.schema.GradMode value.
ROW_FIELDS = (
    "step", "op", "phase", "module", "device", "kind", "inplace", "causal",
    "flops", "bytes_allocated", "live_bytes", "inplace_bytes", "out_bytes", "duration_ns",
    "inputs", "outputs", "freed",
    "recompute", "start", "busy_ns", "layout", "comm_bytes", "group_size", "process_group",
    "bound", "groups", "grad_mode",
)  # fmt: skip
ROW_WIDTH = len(ROW_FIELDS)
FIELD = {name: i for i, name in enumerate(ROW_FIELDS)}  # field name -> position in a row
PER_OUTPUT_ELEMENT = -1
_COLUMN_ORDER = tuple(ARROW_SCHEMA.names)  # the table's columns in schema order (iterating the schema makes 36 Fields)
TENSOR_WIDTH = 4  # per tensor in RowBuffer.tensors: ndim, dtype id, storage id, storage bytes
# A part is written when its rows reach `Tracer(flush_rows=)` or the integers of its buffers (RowBuffer.values: a
# row's ROW_WIDTH, TENSOR_WIDTH and the sizes and strides of each of its tensors, the storage ids it freed, its group
# sizes) reach flush_rows * ROW_VALUES: at 8 bytes an integer, the buffers hold at most flush_rows KiB, plus the row
# that passed it. A row of a few tensors of up to 4 dimensions takes 30 to 130 integers (an addmm of 2-d tensors
# 58), a row of 1,000 one-dimensional inputs and outputs about 12,000.
ROW_VALUES = 128


def extend(buffer, *values):
    """Append `values` to an `array('q')` buffer: what `buffer.extend(values)` does, packed in one call
    (array's own extend parses each item on its own: about 0.1 us an item). The compiled collector's
    `extend` does the same in C++ (tracer/native/_collector.cpp)."""
    buffer.frombytes(_struct(len(values)).pack(*values))


@functools.cache
def _struct(n):
    return struct.Struct(f"{n}q")


class _Side:
    """The inputs or the outputs of a part's rows, read from their buffers (RowBuffer.sides) for `table`."""

    def __init__(self, buffers, counts, itemsize):
        tensors = _np(buffers[0], np.int64).reshape(-1, TENSOR_WIDTH)
        self.ndim, self.dtype, self.sid, self.storage_bytes = np.ascontiguousarray(tensors.T)  # each contiguous
        self.sizes, self.strides = _np(buffers[1], np.int64), _np(buffers[2], np.int64)
        self.counts = counts  # tensors per row
        bounds = _bounds(counts)  # each row's first tensor, and past the last row's last
        self.offsets = from_numpy(bounds)  # the Arrow list offsets of every list column of this side, made once
        self._starts, self._ends = bounds[:-1], bounds[1:]
        self.row_of = np.repeat(np.arange(len(counts)), counts)
        dims = _bounds(self.ndim)  # each tensor's first size (and stride)
        self._dims = from_numpy(dims)  # the Arrow list offsets of its sizes and strides
        # numel of every tensor: the product of its sizes (1 for a 0-d tensor)
        self.numel = np.ones(len(tensors), np.int64)
        has_dims = self.ndim > 0
        if has_dims.any():
            self.numel[has_dims] = np.multiply.reduceat(self.sizes, dims[:-1][has_dims])
        self.nbytes = self.numel * itemsize[self.dtype]

    def per_row(self, values):
        """The sum of `values` (one per tensor of this side) over each row's tensors."""
        total = np.zeros(len(values) + 1, np.int64)
        np.cumsum(values, out=total[1:])
        return total[self._ends] - total[self._starts]

    def columns(self, names):
        """(shapes, dtypes, strides, storage ids): this side's list columns (the outputs' storage bytes: `per_tensor`)."""
        offsets, lists = self._dims, self.offsets
        return (
            pa.ListArray.from_arrays(lists, pa.ListArray.from_arrays(offsets, from_numpy(self.sizes))),
            pa.ListArray.from_arrays(lists, names["dtype"].dictionary(self.dtype)),
            pa.ListArray.from_arrays(lists, pa.ListArray.from_arrays(offsets, from_numpy(self.strides))),
            self.per_tensor(self.sid),
        )

    def per_tensor(self, values):
        """A list column of `values`, one per tensor of this side, each row's list its tensors'."""
        return pa.ListArray.from_arrays(self.offsets, from_numpy(values))


class RowBuffer:
    """The rows of one part as flat integer arrays, with no Python object per row.

    ints        ROW_WIDTH integers per row (ROW_FIELDS).
    in_tensors, out_tensors
                per tensor of each row, its inputs / its outputs: ndim, dtype id, storage id,
                storage bytes (TENSOR_WIDTH integers).
    in_sizes, in_strides, out_sizes, out_strides
                per tensor of that side: its sizes / its strides (ndim integers).
    freed       the storage ids each row freed, `freed` of them per row.
    groups      the group sizes of each row with some (`groups` of them per row; NO_VALUE: none).
    `sides`: ((in_tensors, in_sizes, in_strides), (out_tensors, out_sizes, out_strides)), what the
    collectors append a tensor to (tracer/native/_collector.cpp takes the same tuple).
    """

    FLAT = (
        "ints",
        "in_tensors",
        "in_sizes",
        "in_strides",
        "out_tensors",
        "out_sizes",
        "out_strides",
        "freed",
        "groups",
    )

    def __init__(self, first_seq=0):
        self.first_seq = first_seq
        for name in self.FLAT:
            setattr(self, name, array("q"))
        self.sides = (
            (self.in_tensors, self.in_sizes, self.in_strides),
            (self.out_tensors, self.out_sizes, self.out_strides),
        )
        self.arrays = tuple(getattr(self, name) for name in self.FLAT)

    def __len__(self):
        return len(self.ints) // ROW_WIDTH

    def values(self):
        """The integers its buffers hold, all of them (8 bytes each): what the flush bounds (ROW_VALUES). The
        compiled hook counts the same arrays (tracer/native/_dispatch.cpp `after_row`)."""
        return sum(map(len, self.arrays))

    def nbytes(self):
        """The bytes it takes in memory: its arrays (their spare room included) and the objects that hold them."""
        holders = (self, self.__dict__, self.arrays, self.sides, *self.sides)
        return sum(map(sys.getsizeof, holders)) + sum(map(sys.getsizeof, self.arrays))

    def rollback(self):
        """Drop a half-appended row (its tensors, frees or group sizes were appended, its ints were not)."""
        rows = _np(self.ints, np.int64).reshape(-1, ROW_WIDTH)
        for side, count in zip(self.sides, ("inputs", "outputs")):
            tensors = int(rows[:, ROW_FIELDS.index(count)].sum())
            values = int(_np(side[0], np.int64)[0 : TENSOR_WIDTH * tensors : TENSOR_WIDTH].sum())
            del side[0][TENSOR_WIDTH * tensors :], side[1][values:], side[2][values:]
        freed = int(rows[:, ROW_FIELDS.index("freed")].sum())
        groups = int(np.maximum(rows[:, ROW_FIELDS.index("groups")], 0).sum())
        del self.freed[freed:], self.groups[groups:]

    def compacted(self):
        """A copy whose arrays hold no spare room (the collectors grow them by doubling, from 1,024 integers)."""
        copy = type(self)(self.first_seq)
        for mine, its in zip(self.arrays, copy.arrays):
            its.frombytes(memoryview(mine).cast("B"))
        return copy

    @classmethod
    def concatenate(cls, buffers):
        """One RowBuffer of the rows of `buffers`, consecutive parts in order."""
        merged = cls(buffers[0].first_seq)
        for rows in buffers:
            for name in cls.FLAT:
                getattr(merged, name).extend(getattr(rows, name))
        return merged

    def set_step(self, first_row, step):
        """Give the rows from `first_row` on the step number `step` (a step boundary decided late)."""
        rows = range(first_row * ROW_WIDTH + FIELD["step"], len(self.ints), ROW_WIDTH)
        self.ints[rows.start :: ROW_WIDTH] = array("q", [step]) * len(rows)

    def table(self, names, itemsize, metadata, clock_offset_ns=0):
        """The rows as a pyarrow Table with the trace schema and `metadata` attached.

        `itemsize` maps dtype ids to bytes per element. Derived here, in bulk: numel
        and bytes of every tensor, bytes read and written, which outputs alias an
        input (views), and the FLOPs of ops counted per output element."""
        rows = _np(self.ints, np.int64).reshape(-1, ROW_WIDTH)
        n = len(rows)
        col = dict(zip(ROW_FIELDS, np.ascontiguousarray(rows.T)))  # each field's column contiguous, in one copy
        table_itemsize = np.array([itemsize[i] for i in range(len(names["dtype"].names))] or [0], np.int64)
        ins = _Side(self.sides[0], col["inputs"], table_itemsize)
        outs = _Side(self.sides[1], col["outputs"], table_itemsize)
        # an output aliases an input when its storage is one of the same row's input storages
        input_keys = np.sort(ins.row_of * (1 << 40) + ins.sid)
        out_keys = outs.row_of * (1 << 40) + outs.sid
        at = np.minimum(np.searchsorted(input_keys, out_keys), max(len(input_keys) - 1, 0))
        aliased = input_keys[at] == out_keys if len(input_keys) else np.zeros(len(out_keys), bool)

        bytes_read = ins.per_row(ins.nbytes) - col["out_bytes"]
        bytes_written = outs.per_row(np.where(aliased, 0, outs.nbytes)) + col["inplace_bytes"]
        out_elements = outs.per_row(outs.numel)
        n_aliased = outs.per_row(aliased.astype(np.int64))
        inplace = col["inplace"].astype(bool)
        is_view = (col["outputs"] > 0) & (n_aliased == col["outputs"]) & ~inplace
        flops = np.where(col["flops"] == PER_OUTPUT_ELEMENT, out_elements, col["flops"])
        output_storage_bytes = outs.per_tensor(outs.storage_bytes)
        ins, outs = ins.columns(names), outs.columns(names)
        causal = col["causal"]

        def nullable(values):
            return from_numpy(values, mask=values == NO_VALUE)

        columns = {
            "seq": from_numpy(np.arange(self.first_seq, self.first_seq + n, dtype=np.int64)),
            "step": from_numpy(col["step"]),
            "op": names["op"].dictionary(col["op"]),
            "phase": names["phase"].dictionary(col["phase"]),
            "module": names["module"].dictionary(col["module"]),
            "input_shapes": ins[0],
            "input_dtypes": ins[1],
            "input_strides": ins[2],
            "output_shapes": outs[0],
            "output_dtypes": outs[1],
            "output_strides": outs[2],
            "device": names["device"].dictionary(col["device"]),
            "input_storage_ids": ins[3],
            "output_storage_ids": outs[3],
            "freed_storage_ids": _lists(col["freed"], from_numpy(_np(self.freed, np.int64))),
            "is_view": from_numpy(is_view),
            "inplace": from_numpy(inplace),
            "flops": from_numpy(flops),
            "flop_kind": names["kind"].dictionary(col["kind"]),
            "causal": from_numpy(causal == 1, mask=causal == CAUSAL_NONE),
            "bytes_allocated": from_numpy(col["bytes_allocated"]),
            "live_bytes": from_numpy(col["live_bytes"]),
            "bytes_read": from_numpy(bytes_read),
            "bytes_written": from_numpy(bytes_written),
            "duration_ns": from_numpy(col["duration_ns"]),
            "recompute": from_numpy(col["recompute"].astype(bool)),
            "output_storage_bytes": output_storage_bytes,
            "start_ns": from_numpy(col["start"] + clock_offset_ns),
            "busy_ns": nullable(col["busy_ns"]),
            "layout": names["layout"].dictionary(col["layout"]),
            "comm_bytes": nullable(col["comm_bytes"]),
            "group_size": nullable(col["group_size"]),
            "process_group": names["process_group"].dictionary(col["process_group"]),
            "flops_bound": from_numpy(col["bound"].astype(bool)),
            "group_sizes": pa.ListArray.from_arrays(
                _offsets(np.maximum(col["groups"], 0)),
                from_numpy(_np(self.groups, np.int64)),
                mask=from_numpy(col["groups"] == NO_VALUE),
            ),
            "grad_mode": names["grad_mode"].dictionary(col["grad_mode"]),
        }
        blob = json.dumps(metadata, default=str, separators=(",", ":")).encode()
        schema = ARROW_SCHEMA.with_metadata({METADATA_KEY: blob})
        return pa.Table.from_arrays([columns[name] for name in _COLUMN_ORDER], schema=schema)


def new_names():
    """The string tables of one trace: fixed for phase, kind and grad mode, growing for the rest."""
    return {
        "op": Names(),
        "phase": Names(PHASES),
        "module": Names(),
        "device": Names(),
        "kind": Names(FLOP_KINDS),
        "dtype": Names(),
        "layout": Names([""]),
        "process_group": Names([""]),
        "grad_mode": Names(GRAD_MODES),
    }
