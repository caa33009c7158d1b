"""How each aten op is counted: its registered formula, or a generic kind.

`flop_rule(func)` answers, for one OpOverload, a `FlopRule`: the kind (see
`tracer.schema.FLOP_KINDS`) and a fast `count(args, kwargs, out)` on the real tensors.
It looks in this order: the formula registry (`tracer.flops.registry`), then the tables and
tags below, each with its per-element convention (documented in `tracer.flops.formulas`):
elementwise, foreach, reduction, none (views, copies, fills, factories, random
numbers, metadata) and, for anything else, unknown: 0 FLOPs. It never raises.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

import tracer.flops.composite  # noqa: F401 (registers the formulas of composite ops)
import tracer.flops.pool  # noqa: F401 (registers the formulas of pooling)
from tracer.flops.formulas import NATIVE, FlopCount, _registry
from tracer.flops.grouped import concrete_ints, grouped_mm_count, varlen_attention_count
from tracer.flops.optimizers import FUSED_OPTIMIZERS, passes

__all__ = ["FlopRule", "METADATA_OPS", "flop_rule", "native_count"]


def _overloads(*names) -> frozenset:
    """Every overload of these packets ("size" is aten.size, "prim.device" torch.ops.prim.device)."""
    split = (name.rpartition(".") for name in names)
    packets = [getattr(getattr(torch.ops, ns or "aten"), op, None) for ns, _, op in split]
    return frozenset(getattr(p, o) for p in packets if p is not None for o in p.overloads())


METADATA_OPS = _overloads(
    "size",
    "sym_size",
    "stride",
    "sym_stride",
    "storage_offset",
    "sym_storage_offset",
    "numel",
    "sym_numel",
    "dim",
    "is_contiguous",
    "sym_is_contiguous",
    "is_strides_like_format",
    "is_non_overlapping_and_dense",
    "prim.layout",
    "prim.device",
)

# aten ops that move, copy, fill, allocate or draw random numbers: 0 FLOPs. Looked up before
# the pointwise tag, which clone carries.
_NONE_OPS = frozenset(
    """
    clone copy copy_ _to_copy _copy_from _copy_from_and_resize _unsafe_view cat stack index
    _unsafe_index _unsafe_masked_index index_select gather take embedding masked_select masked_scatter
    masked_scatter_ nonzero roll flip repeat repeat_interleave rot90 one_hot triu tril triu_ tril_
    constant_pad_nd reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d
    replication_pad3d slice_scatter select_scatter diagonal_scatter as_strided_scatter slice_backward
    select_backward diagonal_backward unfold_backward _reshape_copy narrow_copy split_with_sizes_copy
    unbind_copy pixel_shuffle pixel_unshuffle channel_shuffle index_copy index_copy_ index_fill index_fill_
    scatter scatter_ lift lift_fresh lift_fresh_copy detach_ set_ resize resize_ resize_as resize_as_
    _resize_output _resize_output_ _local_scalar_dense item _pin_memory record_stream _foreach_copy_ _amp_update_scale_
    _foreach_zero_ _assert_async _assert_scalar _functional_assert_async _assert_tensor_metadata
    empty empty_like empty_strided empty_permuted new_empty new_empty_strided new_zeros new_ones new_full
    zeros zeros_like ones ones_like full full_like fill fill_ zero zero_ arange linspace logspace eye
    scalar_tensor tensor tril_indices triu_indices hann_window
    rand rand_like randn randn_like randint randint_like randperm normal normal_ uniform uniform_
    bernoulli bernoulli_ exponential exponential_ random_ cauchy cauchy_ geometric geometric_ log_normal
    log_normal_ multinomial _philox_normal_ _philox_uniform_ _philox_key_split _philox_key_fold_in
    _nested_tensor_from_tensor_list _nested_from_padded _nested_from_padded_and_nested_example to_padded_tensor
    upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d
    _upsample_nearest_exact3d
""".split()
)
_NONE_NAMESPACES = {"profiler", "prim", "fsdp"}  # fsdp: FSDP2's copy-in, copy-out and chunk_cat copies


def _table(kind, arg, names):
    return dict.fromkeys(names.split(), (kind, arg))


# aten ops without a pointwise or reduction tag, counted as one FLOP per element of one
# argument: {name: (kind, argument)}.
# NB: accumulating scatters count one add per accumulated element (index_put only with
# accumulate=True); embedding_dense_backward is an index_add of grad_output's rows.
# NB: nll_loss forward sums one picked log-probability per target and its backward writes one
# value per target; dropout multiplies each element by 0 or 1/(1-p) (the draw is free).
_PER_ELEMENT = {
    **_table("elementwise", "grad_output", "embedding_dense_backward"),
    **_table("elementwise", "source", "index_add index_add_ index_reduce index_reduce_"),
    **_table("elementwise", "src", "scatter_add scatter_add_ scatter_reduce scatter_reduce_"),
    **_table(
        "elementwise",
        "values",
        "index_put index_put_ _index_put_impl_ _unsafe_index_put _unsafe_masked_index_put_accumulate",
    ),
    **_table("elementwise", "target", "nll_loss_backward nll_loss2d_backward"),
    **_table("elementwise", "input", "native_dropout"),
    **_table(
        "elementwise",
        "self",
        "_fused_dropout mse_loss_backward l1_loss_backward "
        "smooth_l1_loss_backward huber_loss_backward binary_cross_entropy_backward",
    ),
    # activations and their backward without the pointwise tag: one per element of the gradient they write (of
    # grad_output's shape) or of their input; glu and floor_divide are in _PER_OUTPUT_ELEMENT
    **_table(
        "elementwise",
        "grad_output",
        "elu_backward leaky_relu_backward softplus_backward mish_backward "
        "hardtanh_backward hardsigmoid_backward hardswish_backward log_sigmoid_backward "
        "rrelu_with_noise_backward softshrink_backward",
    ),
    **_table("elementwise", "grad_out", "hardshrink_backward"),
    # a max pool's gradient goes to its argmax, a nearest upsampling's to the input it was copied from: one add
    # per output gradient (tracer.flops.pool counts the other pools)
    **_table(
        "elementwise",
        "grad_output",
        "max_pool2d_with_indices_backward max_pool3d_with_indices_backward "
        "adaptive_max_pool2d_backward adaptive_max_pool3d_backward mkldnn_max_pool2d_backward "
        "mkldnn_max_pool3d_backward upsample_nearest1d_backward upsample_nearest2d_backward "
        "upsample_nearest3d_backward _upsample_nearest_exact1d_backward _upsample_nearest_exact2d_backward "
        "_upsample_nearest_exact3d_backward",
    ),
    **_table(
        "elementwise",
        "self",
        "hardswish hardswish_ log_sigmoid_forward rrelu_with_noise rrelu_with_noise_ "
        "rrelu_with_noise_functional _prelu_kernel _prelu_kernel_backward glu_backward",
    ),
    # weight_norm's w = g v / ||v|| and its backward: one per element of v
    **_table("elementwise", "v", "_weight_norm_interface"),
    **_table("elementwise", "saved_v", "_weight_norm_interface_backward"),
    **_table("reduction", "target", "nll_loss_forward nll_loss2d_forward"),
    **_table(
        "reduction",
        "self",
        "cumsum cumsum_ cumprod cumprod_ logcumsumexp cummax cummin kl_div "
        "mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy "
        "binary_cross_entropy_with_logits",
    ),
}
_PER_OUTPUT_ELEMENT = frozenset("glu floor_divide floor_divide_".split())  # elementwise, without the pointwise tag
_TAG_KIND = {torch.Tag.pointwise: "elementwise", torch.Tag.reduction: "reduction"}


@dataclass(frozen=True)
class FlopRule:
    """How to count one overload: its kind, and count(args, kwargs, out) on the real tensors.

    `causal(args, kwargs)`, for attention ops only, tells whether the mask was causal.
    `detailed`: count returns a `FlopCount` (FLOPs, bound, group sizes), not an int; the
    hook asks only these rules for more than an int (tracer.schema.FlopBasis.DETAILED).
    `formula`: the registered formula of shapes, when the rule has one.
    """

    kind: str
    count: Callable[[tuple, dict, object], int]
    causal: Callable[[tuple, dict], bool] | None = None
    detailed: bool = False
    formula: Callable[..., int] | None = None


def _zero(args, kwargs, out) -> int:
    return 0


def _numel_out(args, kwargs, out) -> int:
    """Elements written: the tensor outputs (an in-place op returns its mutated input)."""
    if isinstance(out, torch.Tensor):
        return out.numel()
    if isinstance(out, (tuple, list)):
        return sum(t.numel() for t in out if isinstance(t, torch.Tensor))
    return 0


def _numel_first(args, kwargs, out) -> int:
    """Elements of the first tensor argument (a reduction's input)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.numel()
    return 0


def _numel_first_list(args, kwargs, out) -> int:
    """Elements of the first list-of-tensors argument (a foreach op's `self`)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            return sum(t.numel() for t in a if isinstance(t, torch.Tensor))
    return 0


def _arg_getter(func, name):
    """get(args, kwargs): argument `name` of func, passed by position or keyword; None if no such."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            default = a.default_value if a.has_default_value() else None
            if a.kwarg_only:
                return lambda args, kwargs: kwargs.get(name, default)
            return lambda args, kwargs: args[i] if i < len(args) else kwargs.get(name, default)
    return None


def _numel_arg(func, name):
    """count() giving the numel of argument `name`, or 0 when an `accumulate` argument is False."""
    get, accumulate = _arg_getter(func, name), _arg_getter(func, "accumulate")
    if get is None:
        return _numel_first

    def count(args, kwargs, out):
        t = get(args, kwargs)
        if not isinstance(t, torch.Tensor) or (accumulate is not None and not accumulate(args, kwargs)):
            return 0
        return t.numel()

    return count


def _shapes(x):
    """x with every tensor, also inside lists and tuples, replaced by its shape tuple."""
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, (list, tuple)):
        return [_shapes(v) for v in x] if isinstance(x, list) else tuple(map(_shapes, x))
    return x


def _shape_count(formula):
    """count(args, kwargs, out) calling a registered formula of shapes."""

    def count(args, kwargs, out):
        shaped = {k: _shapes(v) for k, v in kwargs.items()}
        return int(formula(*_shapes(args), out_shape=_shapes(out), **shaped))

    return count


def _causal_getter(func):
    """causal(args, kwargs) from `is_causal` or `custom_mask_type` (0 = none); None without either."""
    get = _arg_getter(func, "is_causal")
    if get is not None:
        return lambda args, kwargs: bool(get(args, kwargs))
    get = _arg_getter(func, "custom_mask_type")  # efficient attention: 1, 2 = causal from top/bottom
    return None if get is None else (lambda args, kwargs: get(args, kwargs) != 0)


def _is_view(func) -> bool:
    """Every return aliases an input without writing it (view, t, detach, unbind, ...)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _offsets_value(get, args, kwargs):
    t = get(args, kwargs)
    return concrete_ints(t) if isinstance(t, torch.Tensor) else None


def _grouped_mm_rule(func):
    """_grouped_mm / _scaled_grouped_mm: counted from the group offsets' values (tracer.flops.grouped)."""
    offs = _arg_getter(func, "offs")

    def count(args, kwargs, out):
        return grouped_mm_count(tuple(args[0].shape), tuple(args[1].shape), _offsets_value(offs, args, kwargs))

    return FlopRule("matmul", count, detailed=True)


# packet: (argument names of q, k, v, cumulative query and key lengths, maximum lengths), backward
_VARLEN = {
    "_flash_attention_forward": (("query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k"), False),
    "_flash_attention_backward": (("query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k"), True),
    "_efficient_attention_forward": (
        ("query", "key", "value", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
        False,
    ),
    "_efficient_attention_backward": (
        ("query", "key", "value", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
        True,
    ),
}


def _varlen_attention_rule(func, dense, names, backward):
    """Flash / efficient attention: the registered formula on dense inputs; on packed sequences
    the sum over sequences from the cumulative lengths' values (tracer.flops.grouped)."""
    q, k, v, cum_q, cum_k, max_q, max_k = (_arg_getter(func, name) for name in names)

    def count(args, kwargs, out):
        cq = cum_q(args, kwargs)
        if not isinstance(cq, torch.Tensor):
            return FlopCount(dense(args, kwargs, out))
        shapes = (tuple(q(args, kwargs).shape), tuple(k(args, kwargs).shape), tuple(v(args, kwargs).shape))
        return varlen_attention_count(
            *shapes,
            cq.shape[0] - 1,
            concrete_ints(cq),
            _offsets_value(cum_k, args, kwargs),
            max_q(args, kwargs),
            max_k(args, kwargs),
            backward,
        )

    return FlopRule("attention", count, _causal_getter(func), detailed=True)


def _fused_optimizer_rule(func, name):
    """A fused optimizer step: per parameter element, what the same optimizer's foreach ops count for its
    arguments (tracer.flops.optimizers)."""
    getters = {a.name: _arg_getter(func, a.name) for a in func._schema.arguments}

    def count(args, kwargs, out):
        get = lambda arg: getters[arg](args, kwargs) if arg in getters else None  # noqa: E731
        return passes(name, get) * _numel_first_list(args, kwargs, out)

    return FlopRule("foreach", count)


def flop_rule(func: torch._ops.OpOverload) -> FlopRule:
    """The FlopRule of one overload: its registered formula, else a generic kind. Never raises."""
    packet = func.overloadpacket
    if packet.__name__ in ("_grouped_mm", "_scaled_grouped_mm") and func.namespace == "aten":
        return _grouped_mm_rule(func)
    if packet in _registry:
        formula, kind = _registry[packet]
        count = _shape_count(formula)
        if func.namespace == "aten" and packet.__name__ in _VARLEN:
            return _varlen_attention_rule(func, count, *_VARLEN[packet.__name__])
        return FlopRule(kind, count, _causal_getter(func) if kind == "attention" else None, formula=formula)
    namespace, _, name = func._schema.name.partition("::")
    name = name if namespace == "aten" else ""  # the name tables are for aten ops
    if func in METADATA_OPS or namespace in _NONE_NAMESPACES or name in _NONE_OPS:
        return FlopRule("none", _zero)
    if name in _PER_ELEMENT:
        kind, arg = _PER_ELEMENT[name]
        return FlopRule(kind, _numel_arg(func, arg))
    if name in _PER_OUTPUT_ELEMENT:
        return FlopRule("elementwise", _numel_out)
    if name in FUSED_OPTIMIZERS:
        return _fused_optimizer_rule(func, name)
    if name.startswith(("_foreach_", "_amp_foreach_")):
        return FlopRule("foreach", _numel_first_list)
    tags = func.tags
    if _is_view(func) or torch.Tag.inplace_view in tags or torch.Tag.view_copy in tags:
        return FlopRule("none", _zero)
    kinds = {_TAG_KIND[t] for t in tags if t in _TAG_KIND}
    if not kinds:  # out= and Scalar overloads often lack their packet's tag: use it if unanimous
        kinds = {_TAG_KIND[t] for o in packet.overloads() for t in getattr(packet, o).tags if t in _TAG_KIND}
    twin = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") and torch.Tag.inplace in tags else None
    if not kinds and twin is not None:  # masked_fill_, gt_, gelu_ lack the tag their out-of-place packet has
        kinds = {_TAG_KIND[t] for o in twin.overloads() for t in getattr(twin, o).tags if t in _TAG_KIND}
    if len(kinds) == 1:
        kind = kinds.pop()
        return FlopRule(kind, _numel_out if kind == "elementwise" else _numel_first)
    return FlopRule("unknown", _zero)


# The two counts the tracer's hook computes itself from what it already has.
ZERO = _zero
OUTPUT_ELEMENTS = _numel_out


def native_count(rule: FlopRule) -> str | None:
    """The name under which the compiled hook (tracer/native/_dispatch.cpp `native_flops`) computes `rule.count` itself,
    or None: it is called in Python. The same arithmetic on the same sizes, so both paths write the same FLOPs."""
    if rule.detailed:
        return None
    if rule.formula is not None:
        return NATIVE.get(rule.formula)
    return {_numel_first: "numel_first", _numel_first_list: "numel_first_list"}.get(rule.count)
