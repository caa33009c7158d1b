"""What explain says a run's activation x activation work is: the kernels and ops its rows show, and which of its
attention kernels were causal (the `causal` column), never more than the rows say.

    kernel_words(rows, mask, kernel)   (label, description) of the rows `mask` of the attention category
    causal_line(rows, mask)            the sentence on the fused attention kernels `mask`, by their causal flag

A fused attention kernel (flop_kind "attention": scaled_dot_product_attention's kernels, flex_attention) computes
q @ kᵀ and softmax(·) @ v; a matmul of two activations (a bmm, an mm) is named by its op alone: it may be attention's
scores and values, a state-space scan's products or a linear attention's, and the rows cannot tell which.
"""

from reports.arrays import numpy_of
from reports.flops.accounting import name_pattern

__all__ = ["causal_line", "kernel_words"]


def _ops(rows, mask):
    return ", ".join(sorted({str(op) for op in rows.labels("op").strings(mask)}))


def kernel_words(rows, mask, kernel):
    """(label, what) for the attention-category rows `mask`: "Attention" when a fused attention kernel is among them,
    else "Activation x activation matmuls"; `what` names the kernels and the ops, by kind."""
    kernels, matmuls = mask & kernel, mask & ~kernel
    parts = []
    if kernels.any():
        parts.append(f"fused attention kernels, which compute q @ kᵀ and softmax(·) @ v: {_ops(rows, kernels)}")
    if matmuls.any():
        parts.append(f"matmuls of two activations: {_ops(rows, matmuls)}")
    return ("Attention" if kernels.any() else "Activation x activation matmuls"), "; ".join(parts)


def _places(rows, mask):
    """The modules of the rows `mask`, one name per kind (layer indices as *), or their ops where no module is known."""
    if "module" in rows:
        modules = rows.labels("module").strings(mask)
        if all(m is not None for m in modules):
            names = sorted({name_pattern(str(m)) or "outside any module" for m in modules})
            return ", ".join(names)
    return _ops(rows, mask)


def causal_line(rows, mask):
    """The sentence on the fused attention kernels `mask` (forward rows), by the causal column: which modules ran a
    causal kernel, which a kernel that is not causal. None when no row of `mask` says (no kernel, or no causal column)."""
    if "causal" not in rows or not mask.any():
        return None
    known = numpy_of(rows.table.column("causal").is_valid())
    flag = rows.flag("causal")
    causal, full = mask & flag, mask & known & ~flag
    said = []
    if causal.any():
        said.append(
            f"Causal attention (the causal column) in {_places(rows, causal)}: the full score matrix is "
            f"counted (as PaLM does), though a causal kernel can skip the masked half."
        )
    if full.any():
        said.append(
            f"Attention that is not causal (the causal column) in {_places(rows, full)}: every score is "
            f"computed, and counted."
        )
    return " ".join(said) or None
