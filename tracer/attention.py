"""Attention on the meta device: trace the fused kernel a GPU would run, not the math path.

`F.scaled_dot_product_attention` picks its kernel by device. The meta device has no
fused kernel of its own, so a model traced there runs the math path: it upcasts,
materialises the [b, h, s, s] scores and keeps them for the backward, where a GPU's
flash or memory-efficient kernel keeps one log-sum-exp per row. For a 405B-shaped
step that is most of the traced activation memory, and none of it exists on a GPU.

With `Tracer(..., meta_attention="fused")` (the default) and a model on the meta
device, a torch-function mode calls the kernel CUDA would choose, through its meta
implementation (same output shape and dtype; the fused kernel's FLOPs, memory and
`causal` flag in the trace):

  flash             fp16/bf16, no attn_mask, head dim <= 256 and a multiple of 8
                    (grouped-query attention included)
  memory-efficient  otherwise, when the head dims are multiples of 8 and key and
                    value have the query's heads (an attn_mask is passed as its bias)
  math              anything else (3-d inputs, GQA in fp32, odd head dims): as untraced

NB: the choice follows PyTorch's CUDA rules for the common cases, not every check
(cuDNN attention, the SM-specific head-dim limits). Meta tensors hold no values, so
the substitution changes no result; strides can differ from the math path's.
`meta_attention="math"` keeps the math path. The metadata's `attention` says which
kernels ran: {"meta": "fused" | "math", "flash": n, "efficient": n, "math": n}.
"""

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["META_ATTENTION", "MetaAttention"]

META_ATTENTION = ("fused", "math")
aten = torch.ops.aten
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


class MetaAttention(TorchFunctionMode):
    """Routes scaled_dot_product_attention on meta tensors to the fused kernel CUDA would pick."""

    def __init__(self, fused=True):
        super().__init__()
        self.fused = fused
        self.counts = {"flash": 0, "efficient": 0, "math": 0}
        self.inert = False  # left on a thread whose stack holds it (Tracer._leave_modes): every call runs as it is

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and not self.inert:
            call = dict(_SDPA_DEFAULTS, **dict(zip(_SDPA_ARGS, args)), **kwargs)
            q = call["query"]
            if isinstance(q, torch.Tensor) and q.device.type == "meta":
                kernel = _kernel(call) if self.fused else "math"
                self.counts[kernel] += 1
                if kernel == "flash":
                    return aten._scaled_dot_product_flash_attention(
                        q, call["key"], call["value"], call["dropout_p"], call["is_causal"], False, scale=call["scale"])[0]
                if kernel == "efficient":
                    bias = _bias(call["attn_mask"], q, call["key"])
                    needs_lse = any(call[n].requires_grad for n in ("query", "key", "value")) and torch.is_grad_enabled()
                    return aten._scaled_dot_product_efficient_attention(
                        q, call["key"], call["value"], bias, needs_lse, call["dropout_p"], call["is_causal"],
                        scale=call["scale"])[0]  # fmt: skip
        return func(*args, **kwargs)

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
