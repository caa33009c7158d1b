"""Tensors that are not plain strided tensors: sparse, nested, wrapper subclasses.

The dispatch hook reads a strided tensor's shape, strides and storage directly. The
others cannot all answer those questions (a sparse tensor has no storage of its own,
a strided nested tensor no sizes, a jagged one symbolic sizes), so the hook hands them
here. What can be read is recorded; nothing is computed that the program did not ask for:

- sizes: the tensor's shape when it is all integers (sparse), else empty (nested);
  strides: zeros when the layout has none, empty with empty sizes.
- storage: the storage of the stored values (a sparse tensor's values, a nested
  tensor's buffer); the index storages (indices, crow/col indices, offsets) are
  registered too, so live_bytes counts them.
- FLOPs: sparse matmuls count 2 per stored value and output column (2 * nnz * n); an
  elementwise op counts one per stored element; matmuls on nested tensors count their
  formula on the values buffer (a jagged [B, j, k] @ [k, n] is a [sum j, k] @ [k, n]);
  views and copies count 0 ("none"); anything else counts 0 with kind "unknown".
- A traceable wrapper subclass (`__tensor_flatten__`) owns no memory of its own: its
  storage counts 0 bytes, and its inner tensors' storages are registered instead.
"""

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

STRIDED = torch.strided
_INDEX_GETTERS = {
    torch.sparse_coo: ("_indices",),
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}
_SPARSE_MM = frozenset(["mm", "addmm", "_sparse_mm", "_sparse_addmm", "sspaddmm", "hspmm", "smm", "dsmm"])


def layout_name(t):
    """'sparse_coo', 'sparse_csr', 'jagged', 'nested' (strided nested), ..."""
    if t.layout is STRIDED:
        return "nested" if t.is_nested else ""
    return str(t.layout).removeprefix("torch.")


def _values(t):
    """The tensor holding t's stored elements (itself for strided nested tensors)."""
    if t.layout is torch.sparse_coo:
        return t._values()
    if t.layout in _INDEX_GETTERS:
        return t.values()
    values = getattr(t, "_values", None)  # jagged NestedTensor
    return values if isinstance(values, torch.Tensor) else t


def _index_tensors(t):
    found = [getattr(t, name)() for name in _INDEX_GETTERS.get(t.layout, ())]
    offsets = getattr(t, "_offsets", None)
    if isinstance(offsets, torch.Tensor):
        found.append(offsets)
    return found


def stored_elements(t):
    """Elements t actually stores: nnz x dense size for sparse, the buffer for nested."""
    values = _values(t)
    if values is t:  # strided nested: its buffer
        return t.untyped_storage().nbytes() // max(t.element_size(), 1)
    return values.numel()


def describe(t, storages):
    """(layout name, sizes, strides, storage id) of an unusual tensor; registers its storages."""
    name = layout_name(t) or type(t).__name__
    try:
        sizes = tuple(int(s) for s in t.shape)
    except Exception:  # strided nested: no sizes; jagged: symbolic ones
        sizes = ()
    try:
        strides = tuple(int(s) for s in t.stride()) if sizes else ()
    except Exception:
        strides = (0,) * len(sizes)
    sid = -1
    try:
        values = _values(t)
        sid = storages.id_of(values.untyped_storage())
        for index in _index_tensors(t):
            storages.id_of(index.untyped_storage())
    except Exception:  # no storage to be had: the tensor is recorded without one
        pass
    return name, sizes, strides, sid


def register_subclass(storages, t, storage):
    """Register the storage of a tensor subclass; a wrapper's counts 0, its inner tensors' count."""
    if not is_traceable_wrapper_subclass(t):
        return storages.register(storage)
    names, _ = t.__tensor_flatten__()
    for name in names:
        inner = getattr(t, name, None)
        if isinstance(inner, torch.Tensor) and inner.layout is STRIDED and not inner.is_nested:
            storages.id_of(inner.untyped_storage())
    return storages.register(storage, nbytes=0)


def odd_flops(info, args, kwargs, out, ins, outs):
    """(FLOPs, kind) of an op with a sparse or nested argument; (0, 'unknown') when no formula fits."""
    kind = info.rule.kind
    odd = [t for t in (*ins, *outs) if t.layout is not STRIDED or t.is_nested]
    sparse = [t for t in odd if t.layout in _INDEX_GETTERS]
    func_name = info.name.split(".")[1]
    if kind == "none":  # views, copies, fills: no arithmetic on any layout
        return 0, kind
    try:
        if kind == "matmul" and sparse and func_name in _SPARSE_MM:
            a, b = [t for t in ins if t.dim() == 2][-2:]
            if a.layout in _INDEX_GETTERS:  # [m, k] sparse @ [k, n] -> one multiply-add per stored value and column
                return 2 * stored_elements(a) * b.shape[1], kind
            return 2 * stored_elements(b) * a.shape[0], kind  # [m, k] @ [k, n] sparse
        if kind == "elementwise":
            return max(stored_elements(t) for t in odd), kind
        if kind == "matmul" and not sparse:  # nested: the formula on the values buffers
            swap = {id(t): _values(t) for t in odd}

            def plain(x):
                if isinstance(x, torch.Tensor):
                    return swap.get(id(x), x)
                if isinstance(x, (list, tuple)):
                    return type(x)(plain(v) for v in x)
                return x

            return info.rule.count(plain(args), {k: plain(v) for k, v in kwargs.items()}, plain(out)), kind
    except Exception:
        pass
    return 0, "unknown"
