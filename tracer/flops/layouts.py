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
  elementwise op counts one per stored element; matmuls on nested tensors (matmul, bmm,
  linear, ...) count the sum over components, 2 * k per output element of each (a jagged
  [B, j, k] @ [k, n] is a [sum j, k] @ [k, n]; a strided nested one reads each component's
  sizes); other formulas on strided nested tensors (softmax, norms) count the sum of the
  formula over components, so the CPU path of jagged attention counts each sequence at its
  length; a nested linear's `linear_backward` counts each gradient it makes as a dense
  linear's backward does (2 * M * N * K for dL/dx and dL/dW, M * N for dL/db), and a nested
  matmul's `matmul_backward` (the backward of jagged attention's CPU path) each gradient as
  a product the size of the forward's (2 * k per output element of every component); views and
  copies count 0 ("none"); anything else counts 0 with kind "unknown".
  NB: a jagged matmul whose contraction is the ragged dimension needs the lengths; where
  they cannot be read (meta, fake offsets) it counts 0 with kind "unknown".
- A traceable wrapper subclass (`__tensor_flatten__`) owns no memory of its own: its
  storage counts 0 bytes, and its inner tensors' storages are registered instead.
"""

from math import prod

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from tracer.flops.formulas import FlopCount
from tracer.flops.grouped import concrete_ints

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
    try:
        values = _values(t)
        sid = storages.id_of(values.untyped_storage())
        for index in _index_tensors(t):
            storages.id_of(index.untyped_storage())
    except Exception:  # no storage to be had (mkldnn): an id of its own, holding no bytes
        sid = storages.opaque()
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


def _component_shapes(t):
    """Shapes of a nested tensor's components (without the batch dimension), or None when its
    lengths cannot be read (a jagged tensor's offsets on meta or fake tensors)."""
    if t.layout is STRIDED:  # strided nested: its sizes are a concrete [components, ndim] tensor
        return [tuple(s) for s in t._nested_tensor_size().tolist()]
    lengths = getattr(t, "_lengths", None)
    if lengths is None:
        offsets = concrete_ints(t._offsets)
        lengths = None if offsets is None else [b - a for a, b in zip(offsets, offsets[1:])]
    else:
        lengths = concrete_ints(lengths)
    if lengths is None:
        return None
    ragged = t._ragged_idx
    dims = [None if i == ragged else int(s) for i, s in enumerate(t.shape)]
    return [tuple(n if d is None else d for d in dims[1:]) for n in lengths]


def _nested_matmul(info, ins, outs):
    """A matmul-kind op on nested tensors: 2 * k per output element of every component, where
    k is the contraction length of the multiplied operand (the first input; the second for
    addmm-style ops, whose first is the bias)."""
    a = ins[1] if info.name.split(".")[1].startswith(("addmm", "baddbmm", "addbmm", "_addmm")) else ins[0]
    return FlopCount(_contraction_flops(a, outs[0]))


def _contraction_flops(a, out):
    """2 * k per element of every component of the nested product out = a @ b, k being a's last dimension."""
    if out.layout is STRIDED:  # strided nested output: its components' sizes are concrete
        numels = [prod(shape) for shape in _component_shapes(out)]
    else:
        numels = [out._values.numel()]  # jagged: the ragged dimension is stored in full
    if not a.is_nested:
        return 2 * sum(numels) * a.shape[-1]
    if a.layout is STRIDED:
        return 2 * sum(n * shape[-1] for n, shape in zip(numels, _component_shapes(a)))
    if a._ragged_idx == a.dim() - 1:  # the contraction is the ragged dimension: lengths needed
        shapes, out_shapes = _component_shapes(a), _component_shapes(out) if out.is_nested else None
        if shapes is None or out_shapes is None:
            raise ValueError("lengths unknown")
        return 2 * sum(prod(o) * s[-1] for o, s in zip(out_shapes, shapes))
    return 2 * sum(numels) * int(a.shape[-1])


def _nested_matmul_backward(args):
    """matmul_backward(grad, self, other, mask) of out = self @ other on nested tensors: each gradient asked for
    is one product as large as the forward's, 2 * k per element of out ([.., m, k] @ [.., k, n]): dL/dself =
    dL/dout @ other^T and dL/dother = self^T @ dL/dout, 2 * m * k * n per component each, as the dense
    backward's two bmm count."""
    grad, a, _, mask = args[:4]
    return FlopCount((bool(mask[0]) + bool(mask[1])) * _contraction_flops(a, grad))


def _nested_linear_backward(args):
    """linear_backward(input, grad_output, weight, output_mask) of y = x @ W.T + b on a nested x: each gradient
    asked for, over the M rows y stores (W [N, K]): dL/dx = dL/dy @ W and dL/dW = dL/dy.T @ x, 2·M·N·K each, as
    a dense linear's backward matmuls count; dL/db sums dL/dy, M·N adds, as its sum does."""
    _, grad_output, weight, mask = args[:4]
    n, k = weight.shape
    m = stored_elements(grad_output) // n
    return FlopCount((bool(mask[0]) + bool(mask[1])) * 2 * m * n * k + bool(mask[2]) * m * n)


def odd_flops(info, args, kwargs, out, ins, outs):
    """(FlopCount, kind) of an op with a sparse or nested argument; (0, 'unknown') when no formula fits."""
    kind = info.rule.kind
    odd = [t for t in (*ins, *outs) if t.layout is not STRIDED or t.is_nested]
    sparse = [t for t in odd if t.layout in _INDEX_GETTERS]
    func_name = info.name.split(".")[1]
    if kind == "none":  # views, copies, fills: no arithmetic on any layout
        return FlopCount(0), kind
    try:
        if func_name == "linear_backward" and not sparse:  # a nested linear's own backward (dense ones decompose)
            return _nested_linear_backward(args), "matmul"
        if func_name == "matmul_backward" and not sparse:  # a nested matmul's own backward (dense ones decompose)
            return _nested_matmul_backward(args), "matmul"
        if kind == "matmul" and sparse and func_name in _SPARSE_MM:
            a, b = [t for t in ins if t.dim() == 2][-2:]
            if a.layout in _INDEX_GETTERS:  # [m, k] sparse @ [k, n] -> one multiply-add per stored value and column
                return FlopCount(2 * stored_elements(a) * b.shape[1]), kind
            return FlopCount(2 * stored_elements(b) * a.shape[0]), kind  # [m, k] @ [k, n] sparse
        if kind == "elementwise":
            return FlopCount(max(stored_elements(t) for t in odd)), kind
        if kind == "matmul" and not sparse and outs and outs[0].is_nested:
            return _nested_matmul(info, ins, outs), kind
        if not sparse and info.rule.formula is not None:  # nested: the formula per component, summed
            return _per_component(info.rule.formula, args, kwargs, out), kind
    except Exception:
        pass
    return FlopCount(0), "unknown"


def _per_component(formula, args, kwargs, out):
    """Sum of a formula of shapes over the components of strided nested arguments (softmax,
    norms: a jagged tensor is first made strided nested by the ops that need it)."""
    nested = [t for t in (*args, out) if isinstance(t, torch.Tensor) and t.is_nested]
    if any(t.layout is not STRIDED for t in nested):
        raise ValueError("jagged: per-component formulas need strided nested tensors")
    shapes = {id(t): _component_shapes(t) for t in nested}
    components = len(next(iter(shapes.values())))

    def shape(x, i):
        if isinstance(x, torch.Tensor):
            return shapes[id(x)][i] if id(x) in shapes else tuple(x.shape)
        if isinstance(x, (list, tuple)):
            return type(x)(shape(v, i) for v in x)
        return x

    return FlopCount(
        sum(
            int(formula(*shape(args, i), out_shape=shape(out, i), **{k: shape(v, i) for k, v in kwargs.items()}))
            for i in range(components)
        )
    )
