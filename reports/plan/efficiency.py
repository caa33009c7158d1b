"""Efficiency as data: the share of the dense peak a matmul or an attention kernel reaches, by GPU
generation, dtype, shape and kernel, from published measurements.

  matmul      `matmul(m, n, k, generation)`: the share of the dense bf16/fp16 peak a (m x k) @ (k x n)
              GEMM reaches, from a published sweep of 78 shapes, every side 256..4096
              (HOPPER_BF16: XLA's default matmul performance table for sm_90). Between the measured
              shapes: inverse-distance weighting of the 4 nearest in log2(m, n, k); past the sweep
              (a side above 4096 or under 256) the side is clamped, so a training GEMM of 8192 x 4096
              x 14336 reaches what 4096^3 reached, the sweep's saturation (0.79 on an H100 SXM).
              Rising with the smallest side: 256 x 256 x 4096 reaches 0.085, 256 x 4096 x 4096 0.42,
              4096 x 4096 x 4096 0.79. An A100 has no published sweep of its own here: it takes the
              Hopper curve scaled so its saturation is the A100's best measured GEMM (SATURATION),
              a judgement (the A100's 108 SMs fill with smaller GEMMs than the H100's 132, so its
              small shapes are, if anything, underrated). The sweep times are kernel times from the
              host, launch included: the plan's launch_s is added on top (3 us, negligible beside a
              training GEMM, not beside a 256^3 one).
  attention   `attention(kernel, generation)`: the share of the dense peak a fused attention
              kernel reaches, fwd+bwd, by kernel (flash = FlashAttention-2, as PyTorch's SDPA
              runs it; efficient = the memory-efficient kernel; cudnn; fa3 = FlashAttention-3) and
              generation (ATTENTION, each with its source). The math path (no fused kernel) is
              no attention op: its batched matmuls take the matmul curve and its softmax the
              memory roof, as any op.
  stack       the training stack (framework, compile, overlap of kernels) as two factors on the
              tables, `matmul_stack` and `attention_stack` (reports.plan.assumptions): 1 is the
              kernels as published; `optrace plan --calibrate MEASURED` fits them from a trace
              measured on the target GPU (reports.plan.calibration).

A generation without a table (V100, L40S, B200, MI300X...) keeps the flat matmul_efficiency and
attention_efficiency assumptions, and the plan says so; so does every plan where those are given
(`--assume matmul_efficiency=0.7` prices every matmul at 0.7).
"""

import numpy as np

__all__ = [
    "ATTENTION",
    "GENERATIONS",
    "HOPPER_BF16",
    "SATURATION",
    "SOURCES",
    "attention",
    "generation",
    "kernel_of",
    "matmul",
    "matmul_dims",
]

# catalogue family (tracer.devices) -> generation with a table here
GENERATIONS = {
    "A100": "ampere",
    "H100 SXM": "hopper",
    "H100 PCIe": "hopper",
    "H100 NVL": "hopper",
    "H200": "hopper",
}

_XLA = (
    "XLA's default matmul performance table for sm_90 (H100 SXM), bf16 x bf16 -> bf16, batch 1: "
    "openxla/xla (tensorflow/tensorflow third_party/xla) xla/service/gpu/model/matmul_interpolator_data.h "
    "(2025), FLOP/s over the H100 SXM's dense bf16 peak of 989.4 TFLOP/s"
)
_MAMF = (
    "Stas Bekman's mamf-finder (github.com/stas00/ml-engineering, compute/accelerator/benchmarks), as tabled "
    "in the README of github.com/mag-/gpu_benchmark: the best bf16 GEMM found, A100 SXM 267.9 of 312 TFLOP/s "
    "(0.859), H100 SXM 792.1 of 989.4 (0.801)"
)

# (m, n, k): TFLOP/s measured, sm_90 bf16, batch 1 (_XLA)
HOPPER_BF16 = {
    (256, 256, 512): 11.46, (256, 256, 2048): 31.13, (256, 256, 4096): 84.31,
    (256, 512, 256): 11.46, (256, 512, 512): 21.96, (256, 512, 1024): 39.11, (256, 512, 4096): 91.68,
    (256, 1024, 256): 22.67, (256, 1024, 512): 41.84, (256, 1024, 1024): 72.47, (256, 1024, 4096): 172.29,
    (256, 2048, 256): 41.84, (256, 2048, 512): 78.22, (256, 2048, 4096): 285.87,
    (256, 4096, 256): 78.03, (256, 4096, 512): 138.08, (256, 4096, 1024): 225.20, (256, 4096, 2048): 324.59,
    (256, 4096, 4096): 412.03,
    (512, 256, 256): 11.46, (512, 256, 512): 21.79, (512, 256, 1024): 39.29, (512, 256, 4096): 91.06,
    (512, 512, 256): 21.62, (512, 512, 2048): 114.72, (512, 512, 4096): 174.54,
    (512, 1024, 256): 43.46, (512, 1024, 2048): 216.48, (512, 1024, 4096): 309.61,
    (512, 2048, 256): 79.32, (512, 2048, 1024): 232.61, (512, 2048, 2048): 342.39, (512, 2048, 4096): 430.53,
    (512, 4096, 1024): 373.35,
    (1024, 256, 256): 21.96, (1024, 256, 1024): 68.34, (1024, 256, 4096): 169.68,
    (1024, 512, 512): 82.24, (1024, 512, 2048): 220.03,
    (1024, 1024, 512): 145.57, (1024, 1024, 2048): 349.98,
    (1024, 2048, 256): 139.52, (1024, 2048, 512): 237.55, (1024, 2048, 1024): 373.35, (1024, 2048, 2048): 524.29,
    (1024, 4096, 256): 209.72, (1024, 4096, 1024): 490.29, (1024, 4096, 4096): 738.47,
    (2048, 256, 256): 43.58, (2048, 256, 512): 77.31, (2048, 256, 1024): 135.85, (2048, 256, 2048): 216.13,
    (2048, 256, 4096): 307.49,
    (2048, 512, 1024): 235.88, (2048, 512, 2048): 347.71,
    (2048, 1024, 1024): 373.35, (2048, 1024, 2048): 523.27,
    (2048, 2048, 1024): 493.90, (2048, 2048, 2048): 631.98,
    (2048, 4096, 512): 450.40, (2048, 4096, 1024): 594.21,
    (4096, 256, 2048): 304.69,
    (4096, 512, 256): 142.48, (4096, 512, 512): 238.82, (4096, 512, 1024): 370.77, (4096, 512, 2048): 521.74,
    (4096, 512, 4096): 649.96,
    (4096, 1024, 256): 216.48, (4096, 1024, 512): 343.71, (4096, 1024, 1024): 488.06, (4096, 1024, 4096): 738.47,
    (4096, 2048, 256): 304.00, (4096, 2048, 512): 447.02, (4096, 2048, 4096): 758.43,
    (4096, 4096, 256): 392.16, (4096, 4096, 512): 543.12, (4096, 4096, 2048): 738.74, (4096, 4096, 4096): 783.33,
}  # fmt: skip
_HOPPER_PEAK = 989.4  # TFLOP/s, the H100 SXM's dense bf16 peak the sweep's shares are taken of

# the best GEMM a generation reaches, as a share of its dense bf16 peak (_MAMF)
SATURATION = {"ampere": 267.9 / 312, "hopper": 792.1 / 989.4}

_FA2 = "FlashAttention-2 paper (Dao 2023, arXiv:2307.08691): 50-73% of the A100's peak"
_FA3 = (
    "FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608): FlashAttention-2 reaches 35% of the H100's "
    "peak; FlashAttention-3 up to 75% (740 TFLOP/s bf16)"
)
_CUDNN = (
    "judgement from PyTorch 2.5's release notes: the cuDNN SDPA backend runs up to 75% faster than "
    "FlashAttention-2 on H100, so 0.35 x 1.75 = 0.61 at best"
)
# (kernel, generation): (share of the dense peak, fwd+bwd, source)
ATTENTION = {
    ("flash", "ampere"): (0.60, _FA2 + " (forward); 0.60 taken for forward and backward (judgement)"),
    ("efficient", "ampere"): (0.50, _FA2 + "; the memory-efficient kernel at its low end, 0.50 (judgement)"),
    ("cudnn", "ampere"): (0.60, _FA2 + "; cuDNN's kernel taken as FlashAttention-2's (judgement)"),
    ("flash", "hopper"): (0.35, _FA3),
    ("efficient", "hopper"): (0.30, _FA3 + "; the memory-efficient kernel below FlashAttention-2, 0.30 (judgement)"),
    ("cudnn", "hopper"): (0.61, _CUDNN),
    ("fa3", "hopper"): (0.75, _FA3),
}

SOURCES = {"matmul": _XLA, "saturation": _MAMF}


def generation(family):
    """The generation of a catalogue family ("H100 SXM" -> "hopper"), or None: no table for it here."""
    return GENERATIONS.get(family)


_POINTS = np.log2(np.array(list(HOPPER_BF16), dtype=np.float64))
_SHARES = np.array(list(HOPPER_BF16.values())) / _HOPPER_PEAK
_LOW, _HIGH = np.log2(256.0), np.log2(4096.0)


def matmul(m, n, k, gen):
    """Per GEMM (arrays or scalars m, n, k: rows of the output, its columns, the contracted size), the share of
    the dense bf16/fp16 peak it reaches on `gen` (module docstring), as a float64 array."""
    x = np.clip(np.log2(np.maximum(np.stack(np.broadcast_arrays(m, n, k), -1).astype(np.float64), 1)), _LOW, _HIGH)
    flat = x.reshape(-1, 3)
    d = np.sqrt(((flat[:, None, :] - _POINTS[None, :, :]) ** 2).sum(-1))
    near = np.argsort(d, axis=1)[:, :4]
    dn = np.take_along_axis(d, near, 1)
    w = 1.0 / np.maximum(dn, 1e-9) ** 2
    share = (w * _SHARES[near]).sum(1) / w.sum(1)
    share = np.where(dn[:, 0] < 1e-9, _SHARES[near[:, 0]], share)  # a measured shape: its own figure
    if gen == "ampere":
        share = share * SATURATION["ampere"] / _SHARES.max()
    return share.reshape(x.shape[:-1])


def attention(kernel, gen):
    """(share, source) of an attention kernel on `gen`, or None when neither is in ATTENTION."""
    return ATTENTION.get((kernel, gen))


def kernel_of(op):
    """The fused kernel an attention op stands for on a GPU: 'flash', 'efficient', 'cudnn', 'fa3' or None.
    A CPU trace's `_scaled_dot_product_flash_attention_for_cpu` is the kernel a GPU's SDPA picks for the
    same inputs in bf16 (tracer.recording.meta_attention): flash."""
    name = str(op).lower()
    for word, kernel in (("flash_attn_3", "fa3"), ("flash3", "fa3"), ("cudnn", "cudnn"), ("efficient", "efficient")):
        if word in name:
            return kernel
    return "flash" if "flash" in name else None


def matmul_dims(out_shapes, flops):
    """(m, n, k) of a matmul from its first output's shape and its FLOPs: m the product of the output's
    leading sizes (a batch folded in), n its last size, k = flops / (2 m n). None where that fails."""
    m = n = k = None
    if out_shapes is not None and len(out_shapes) and out_shapes[0] is not None and len(out_shapes[0]) >= 2:
        shape = [int(s) for s in out_shapes[0]]
        m, n = int(np.prod(shape[:-1])), shape[-1]
        k = flops / (2.0 * m * n) if m and n else None
    return (m, n, k) if k and k >= 1 else None
