"""Norms on meta and fake tensors: trace the fused kernel a GPU runs, not the CPU's composite.

`F.rms_norm` (`nn.RMSNorm`) is a composite op: PyTorch's `rms_norm_symint`
(aten/src/ATen/native/layer_norm.cpp) calls `_fused_rms_norm`, which on CUDA is one kernel
(`_fused_rms_norm_cuda`) whose autograd formula (tools/autograd/derivatives.yaml) keeps the
input, the weight and `rstd` ([..., 1], fp32 for fp16/bf16 inputs) for `_fused_rms_norm_backward`.
The meta device and the CPU have no such kernel: `_fused_rms_norm` decomposes there
(`rms_norm_composite`) into pow, mean, add, rsqrt, mul and mul, and autograd keeps what
those keep: an fp32 copy of a bf16 input, the normalised fp32 product and rstd. For a bf16
[N, D] input that is 8·N·D + 4·N bytes kept to the 4·N of the GPU (12 bytes per element
against the 2 of the output).

With a model on the meta device or on fake tensors (FakeTensorMode), a kernel of the
tracer's is registered for rms_norm on the autograd key of their device while the trace
records (as tracer.recording.meta_attention does for attention): it runs `_fused_rms_norm`
and `_fused_rms_norm_backward` whole, as two ops with meta kernels of the tracer's (the
CUDA kernels' output shapes and dtypes), so the trace's FLOPs (tracer.flops.formulas) and
memory are the fused kernels'. It follows `rms_norm_symint`'s choice: a weight of another
dtype than the input, a complex input or a channels-last one take the composite, as on
CUDA, and are counted as such; on fake tensors a real tensor takes the composite as untraced.

The other norms and losses need no stand-in: `layer_norm` reaches the tracer whole as
`native_layer_norm` on every device, and its meta kernel gives CUDA's fp32 mean and rstd
([..., 1] each; `layer_norm_cuda` in aten/src/ATen/native/cuda/layer_norm_kernel.cu);
`cross_entropy` is a composite on CUDA too (`cross_entropy_loss_symint`,
aten/src/ATen/native/LossNLL.cpp: `_log_softmax` then `nll_loss_nd`), and its CUDA
kernels keep what the meta trace records: the log-softmax output (the derivative of
`_log_softmax` reads its result) and nll_loss's total weight. A fused cross entropy
(chunked or Liger-style) is a library's kernel, not PyTorch's, and is traced as its
library runs it.

The metadata's `fused_standins` says what stood in: {"rms_norm": n, "composite": n}
(calls that ran the fused kernel, and calls `rms_norm_symint` leaves to the composite).
A kernel someone else registered there is left alone (nothing stands in; the key is
absent). Under `torch.inference_mode()` no autograd key is dispatched: rms_norm reaches
the tracer whole, counted by its composite formula (tracer.flops.composite).
"""

import torch

__all__ = ["MetaFused", "fused_key"]

aten = torch.ops.aten
_RMS_NORM = "aten::rms_norm"
_KEYS = {"meta": "AutogradMeta", "cpu": "AutogradCPU", "cuda": "AutogradCUDA"}
_HALF = (torch.float16, torch.bfloat16)


def fused_key(tensor, fake):
    """The autograd dispatch key the stand-in goes on for a model whose first parameter is `tensor` (None: none)."""
    if tensor is None or not (fake or tensor.device.type == "meta"):
        return None
    return _KEYS.get(tensor.device.type)


class MetaFused:
    """Routes rms_norm on meta or fake tensors to the fused CUDA kernel's two ops, while installed."""

    def __init__(self, key):
        self.key = key
        self.counts = {"rms_norm": 0, "composite": 0}
        self._libraries = []
        self._stood_in = False

    def install(self):
        """Register the kernels (not where another kernel is registered already)."""
        if self._libraries or torch._C._dispatch_has_kernel_for_dispatch_key(_RMS_NORM, self.key):
            return
        library = torch.library.Library("aten", "IMPL")
        library.impl("rms_norm", self._rms_norm, self.key)
        self._libraries.append(library)
        self._stood_in = True

    def remove(self):
        libraries, self._libraries = self._libraries, []
        for library in libraries:
            library._destroy()

    def _rms_norm(self, input, normalized_shape, weight=None, eps=None):
        """The kernel: the fused kernel's ops where CUDA's rms_norm_symint calls them, else the composite."""
        if not self._fused(input, weight):
            self.counts["composite"] += 1
            return aten.rms_norm.default.decompose(input, normalized_shape, weight, eps)
        self.counts["rms_norm"] += 1
        return _FusedRmsNorm.apply(input, weight, list(normalized_shape), eps)

    def _fused(self, input, weight):
        """Whether rms_norm_symint would call _fused_rms_norm on these inputs (and they are not real CPU tensors)."""
        if self.key != "AutogradMeta" and not _is_fake(input):
            return False
        if input.is_complex() or (weight is not None and weight.dtype != input.dtype):
            return False
        from torch._prims_common import suggest_memory_format

        return suggest_memory_format(input) not in (torch.channels_last, torch.channels_last_3d)

    def facts(self):
        """The metadata's `fused_standins` entry, or None when nothing was installed."""
        return dict(self.counts) if self._stood_in else None


def _is_fake(tensor):
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


class _FusedRmsNorm(torch.autograd.Function):
    """_fused_rms_norm's autograd formula: keeps input, weight and rstd; the backward is _fused_rms_norm_backward, or,
    in grad mode (a double backward's create_graph), a differentiable composite, as CUDA's formula takes then."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps):
        with torch._C._AutoDispatchBelowAutograd():
            out, rstd = aten._fused_rms_norm.default(input, normalized_shape, weight, eps)
        ctx.save_for_backward(input, rstd, weight)
        ctx.normalized_shape, ctx.eps = normalized_shape, eps
        return out

    @staticmethod
    def backward(ctx, grad):
        input, rstd, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]]
        if torch.is_grad_enabled():
            return (*_differentiable_backward(ctx, grad, input, weight, mask), None, None)
        with torch._C._AutoDispatchBelowAutograd():
            grad_input, grad_weight = aten._fused_rms_norm_backward.default(
                grad, input, ctx.normalized_shape, rstd, weight, mask
            )
        return grad_input if mask[0] else None, grad_weight if mask[1] else None, None, None


def _differentiable_backward(ctx, grad, input, weight, mask):
    """(input's gradient, weight's) through the composite, with a graph of their own."""
    wanted = [t for t, want in zip((input, weight), mask) if want]
    if not wanted:
        return None, None
    out = aten.rms_norm.default.decompose(input, ctx.normalized_shape, weight, ctx.eps)
    found = iter(torch.autograd.grad(out, wanted, grad, create_graph=True))
    return tuple(next(found) if want else None for want in mask)
