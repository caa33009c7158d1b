"""Analytic FLOP counts for aten ops: the registry of formulas, and the counting conventions.

FLOPs count 2 per multiply-add (an [m, k] @ [k, n] matmul is 2*m*k*n), as PaLM and
`torch.utils.flop_counter` do; MAC-counting tools (fvcore, thop, ptflops) report half.

`tracer.flops.op_kinds.flop_rule(func)` gives one OpOverload a `FlopRule`: a kind from
`schema.FLOP_KINDS` and a fast `count(args, kwargs, out)` on the real tensors. It looks,
in order, at:

1. the registry, formulas of shapes filled by `register_flop_formula`: matmuls,
   convolutions, attention, softmax, norms. They equal `FlopCounterMode` on every op it
   counts, except the flash/efficient attention kernels it reads in the wrong layout.
2. a classification of every other op, by name table, schema and tags:
   - "elementwise": one FLOP per output element, whatever the function (gelu and exp count
     1, like add); an in-place op writes, and counts, its input. An in-place packet without
     the pointwise tag (`masked_fill_`, `gt_`, `gelu_`, `abs_`) takes its out-of-place twin's.
   - "foreach": `_foreach_*` ops, one FLOP per element of the first tensor list. NB:
     `_foreach_addcmul_`, `_foreach_lerp_` and `_foreach_addcdiv_` count 1 per element, as
     `addcmul_` does as "elementwise", so an optimizer step's count is a lower bound of its
     arithmetic. A fused optimizer step (`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`,
     `_fused_adagrad_`) counts what the same optimizer's `_foreach_*` ops count for its flags,
     per parameter element (AdamW: 8, Adam without weight decay 7; tracer.flops.optimizers),
     so a fused and a foreach run of the same model count the same FLOPs.
   - "reduction": one FLOP per input element (sum, mean, amax, norm, cumsum, losses); a pool one per
     input element each window reads (tracer.flops.pool).
   - "none": views, copies, fills, factories, random draws: 0 FLOPs.
   - "unknown": anything else, counted as 0. `flop_rule` never raises.

Ops whose FLOPs depend on tensor values, not only shapes, have rules of their own in
`tracer.flops.op_kinds` that count a `FlopCount` (FLOPs, whether they are a bound, group sizes):
the grouped matmuls of mixture-of-experts layers (`_grouped_mm`, `_scaled_grouped_mm`) and
the flash / efficient attention kernels on packed sequences (tracer.flops.grouped).

`matmul`, `linear`, `einsum`, `softmax` and other CompositeImplicitAutograd ops decompose
into mm/bmm/addmm/_softmax before dispatch, which are counted. Under `torch.inference_mode()`
they reach the dispatch mode whole and run whole (the tracer never decomposes an op: that
could change what runs); `tracer.flops.composite` counts them as what they decompose
into, so the same forward counts the same FLOPs either way. A composite without a formula
counts 0 with kind "unknown".
"""

# the registry and the formulas by family (importing them registers the formulas), every name importable from here
from tracer.flops.attention import (  # noqa: F401 (re-exported)
    _bhsd,
    _bshd,
    attention_backward_flop_count,
    attention_flop_count,
    efficient_attention_backward_flop,
    efficient_attention_flop,
    flash_attention_backward_flop,
    flash_attention_flop,
    sdpa_backward_flop,
    sdpa_flop,
)
from tracer.flops.conv import conv_backward_flop, conv_flop, conv_flop_count, conv_kernel_flop  # noqa: F401 (re-exported)
from tracer.flops.matmul import (  # noqa: F401 (re-exported)
    addmm_flop,
    addmv_flop,
    addr_flop,
    baddbmm_flop,
    bmm_flop,
    dot_flop,
    input_times_weight_flop,
    mm_flop,
    mv_flop,
)
from tracer.flops.norms import (  # noqa: F401 (re-exported)
    _norm_backward,
    _norm_forward,
    batch_norm_backward_flop,
    batch_norm_flop,
    batch_norm_with_update_flop,
    cudnn_batch_norm_backward_flop,
    group_norm_backward_flop,
    group_norm_flop,
    layer_norm_backward_flop,
    layer_norm_flop,
    rms_norm_backward_flop,
    rms_norm_flop,
    softmax_backward_flop,
    softmax_flop,
)
from tracer.flops.registry import (  # noqa: F401 (re-exported: the registry and its helpers, as before the split)
    FlopCount,
    _packets,
    _registry,
    aten,
    has_formula,
    register_flop_formula,
)

__all__ = ["FlopCount", "register_flop_formula", "has_formula"]

# Formulas the compiled hook (tracer/native/_dispatch.cpp `native_flops`) computes itself, with the same arithmetic on the
# same sizes and arguments: {formula: its name there}. A formula registered in their place is called in Python.
NATIVE = {
    mm_flop: "mm",
    addmm_flop: "addmm",
    bmm_flop: "bmm",
    baddbmm_flop: "baddbmm",
    softmax_flop: "softmax",
    softmax_backward_flop: "softmax_backward",
    layer_norm_flop: "layer_norm",
    layer_norm_backward_flop: "layer_norm_backward",
}
