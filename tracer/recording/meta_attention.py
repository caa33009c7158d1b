"""Attention on the meta device: trace the fused kernel a GPU would run, not the math path.

`F.scaled_dot_product_attention` picks its kernel by device. The meta device has no
fused kernel of its own, so a model traced there runs the math path: it upcasts,
materialises the [b, h, s, s] scores and keeps them for the backward, where a GPU's
flash or memory-efficient kernel keeps one log-sum-exp per row. For a 405B-shaped
step that is most of the traced activation memory, and none of it exists on a GPU.

With `Tracer(..., meta_attention="fused")` (the default) and a model on the meta
device, a kernel of the tracer's, registered for scaled_dot_product_attention on the
meta device's autograd key while the trace records, calls the kernel CUDA would
choose, through its meta implementation (same output shape and dtype; the fused
kernel's FLOPs, memory and `causal` flag in the trace). Being a kernel, not a
torch-function mode, it also runs where no such mode is active: in the backward,
where activation checkpointing re-runs the forward (a re-run taking the math path
would save other tensors than the forward did, and a non-reentrant checkpoint raises).

  flash             fp16/bf16, no attn_mask, head dim <= 256 and a multiple of 8
                    (grouped-query attention included)
  memory-efficient  otherwise, when the head dims are multiples of 8 and key and
                    value have the query's heads (an attn_mask is passed as its bias)
  math              anything else (3-d inputs, GQA in fp32, odd head dims): as untraced

Under `torch.inference_mode()` no autograd key is dispatched: the op reaches the
tracer whole, as other composite ops do there, and is counted by its own formula
(tracer.flops.composite: the fused kernel's count).

NB: the choice follows PyTorch's CUDA rules for the common cases, not every check
(cuDNN attention, the SM-specific head-dim limits). Meta tensors hold no values, so
the substitution changes no result; strides can differ from the math path's.
`meta_attention="math"` keeps the math path. The metadata's
`attention` says which kernels ran: {"meta": "fused" | "math", "flash": n, "efficient": n,
"math": n}; a kernel someone else registered there is left alone, and the trace takes the
math path ("meta": "math").
"""

import torch

__all__ = ["META_ATTENTION", "MetaAttention"]

META_ATTENTION = ("fused", "math")
aten = torch.ops.aten
_SDPA = "aten::scaled_dot_product_attention"
_KEY = "AutogradMeta"


class MetaAttention:
    """Routes scaled_dot_product_attention on meta tensors to the fused kernel CUDA would pick, while installed."""

    def __init__(self, fused=True):
        self.fused = fused
        self.counts = {"flash": 0, "efficient": 0, "math": 0}
        self._library = None

    def install(self):
        """Register the kernel (not when another kernel is registered there already)."""
        if self._library is not None:
            return
        if torch._C._dispatch_has_kernel_for_dispatch_key(_SDPA, _KEY):  # someone else's: leave it, count nothing
            self.fused = False
            return
        library = torch.library.Library("aten", "IMPL")
        library.impl("scaled_dot_product_attention", self._attention, _KEY)
        self._library = library

    def remove(self):
        library, self._library = self._library, None
        if library is not None:
            library._destroy()

    def _attention(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        """The kernel: the fused kernel CUDA would pick, or, for the math path, the op's own composite kernel
        (which on the meta device runs the math path, op for op as untraced)."""
        call = {"query": query, "key": key, "value": value, "attn_mask": attn_mask, "enable_gqa": enable_gqa}
        kernel = _kernel(call) if self.fused else "math"
        self.counts[kernel] += 1
        if kernel == "flash":
            return aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )[0]
        if kernel == "efficient":
            needs_lse = any(t.requires_grad for t in (query, key, value)) and torch.is_grad_enabled()
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, _bias(attn_mask, query, key), needs_lse, dropout_p, is_causal, scale=scale
            )[0]
        return aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )

    def facts(self):
        """The metadata's `attention` entry."""
        return {"meta": "fused" if self.fused else "math", **self.counts}


def _bias(mask, q, k):
    """An attn_mask as the additive [b, h, s_q, s_k] bias the efficient kernel takes (None stays None)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:  # True: may attend; as SDPA turns it into a bias
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _kernel(call):
    """'flash', 'efficient' or 'math': the kernel CUDA's SDPA would choose for these inputs."""
    q, k, v, mask = call["query"], call["key"], call["value"], call["attn_mask"]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return "math"
    if mask is not None and not isinstance(mask, torch.Tensor):
        return "math"
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if d_qk % 8 or d_v % 8 or k.shape[-1] != d_qk:
        return "math"
    same_heads = q.shape[1] == k.shape[1] == v.shape[1]
    grouped = call["enable_gqa"] and k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0
    if not (same_heads or grouped):
        return "math"
    if q.dtype in (torch.float16, torch.bfloat16) and mask is None and d_qk == d_v and d_qk <= 256:
        return "flash"
    if same_heads and q.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "efficient"
    return "math"
