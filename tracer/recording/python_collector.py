"""The Python collector: what the compiled one (tracer/native/_collector.cpp) does in one call, for the ops it leaves to
Python (tensor subclasses, sparse and nested tensors, collectives) or everywhere without it (OPTRACE_COLLECTOR=python)."""

import torch

from tracer.flops.layouts import STRIDED, describe, register_subclass
from tracer.recording.dispatch import _tensors
from tracer.store.writer import extend

Tensor = torch.Tensor
_storage_key = torch._C._storage_id  # a tensor's storage, as its UntypedStorage's _cdata, with no storage object made


class PythonCollector:
    """Reads an op's tensors into a part's buffers (RowBuffer.sides).

    storages   the trace's tracer.recording.storage.StorageTable.
    dtype_ids  torch.dtype -> dtype name id (the Tracer's, shared with the compiled collector).
    new_dtype  new_dtype(dtype): the id of a dtype seen for the first time.
    layouts    the writer's names of odd layouts (tracer.store.row_buffer.Names)."""

    def __init__(self, storages, dtype_ids, new_dtype, layouts):
        self._storages, self._dtype_ids, self._new_dtype, self._layouts = storages, dtype_ids, new_dtype, layouts

    def collect(self, info, args, kwargs, out, sides):
        """(inputs, outputs, registered bytes after the inputs, layout id) of one op, with each tensor's
        ndim, dtype id, storage id and storage bytes appended to its side's buffers, and its sizes and
        strides to theirs (`sides`: RowBuffer.sides)."""
        storages = self._storages
        known = storages._by_cdata.get
        size_of = storages.size.__getitem__
        dtype_of = self._dtype_ids.get
        collective = info.collective
        if collective is not None:
            ins, outs = collective.tensors(args, kwargs, out)
        else:
            ins = _tensors(args, kwargs)
            if isinstance(out, Tensor):
                outs = (out,)
            elif isinstance(out, (list, tuple)):
                outs = [o for o in out if isinstance(o, Tensor)]
            elif out is None and info.written_positions:  # returns nothing: its outputs are what it wrote
                outs = [t for t, _ in info.written(args, kwargs)]
            else:
                outs = ()
        registered = storages.registered_bytes
        layout = 0
        for side, group in enumerate((ins, outs)):
            if side:  # storages first seen as outputs were made by this op; inputs existed before
                registered = storages.registered_bytes
            tensors, sizes, strides = sides[side]
            for t in group:
                if t.layout is not STRIDED:  # sparse, jagged: tracer.flops.layouts
                    layout = self._odd_tensor(t, layout, sides[side])
                    continue
                try:
                    shape = t.shape
                except RuntimeError:  # a strided nested tensor has no sizes
                    layout = self._odd_tensor(t, layout, sides[side])
                    continue
                sid = known(_storage_key(t))
                if sid is None:
                    sid = self._register(t)
                dtype = dtype_of(t.dtype)
                if dtype is None:
                    dtype = self._new_dtype(t.dtype)
                extend(tensors, len(shape), dtype, sid, size_of(sid))
                extend(sizes, *shape)
                extend(strides, *t.stride())
        return ins, outs, registered, layout

    def _register(self, t):
        """The id of a tensor's storage, seen for the first time."""
        st = t.untyped_storage()
        return self._storages.register(st) if type(t) is Tensor else register_subclass(self._storages, t, st)

    def _odd_tensor(self, t, layout, side):
        """Append a sparse or nested tensor's record to its `side` (RowBuffer.sides); the row's layout id (its
        first odd layout)."""
        name, sizes, strides, sid = describe(t, self._storages)
        dtype = self._dtype_ids.get(t.dtype)
        if dtype is None:
            dtype = self._new_dtype(t.dtype)
        size = self._storages.size.get(sid, 0)
        extend(side[0], len(sizes), dtype, sid, size)
        extend(side[1], *sizes)
        extend(side[2], *strides)
        return layout or self._layouts.id(name)
