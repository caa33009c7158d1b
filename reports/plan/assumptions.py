"""Every number a plan assumes, with its source: one table, overridable by name.

  name                  default   range        what it is, and where the figure comes from
  matmul_efficiency     0.80      [0.01, 1]    share of the dense peak a matmul or convolution reaches, where
                                               reports.plan.efficiency has no table (given: every matmul)
  attention_efficiency  0.35      [0.01, 1]    share of the dense peak a fused attention kernel reaches, ditto
  matmul_stack          1.0       [0.01, 2]    the training stack's factor on the GEMM sweep's efficiency; on an
                                               A100 0.776 and a Hopper 0.673, fitted on published runs (BY_GENERATION)
  attention_stack       1.0       [0.01, 2]    the training stack's factor on the attention kernels' table
  vector_efficiency     0.80      [0.01, 1]    share of the float32 (vector) peak other compute-bound ops reach
  memory_efficiency     0.80      [0.01, 1]    share of the datasheet HBM bandwidth memory-bound ops reach
  launch_s              3e-6      [0, 1] s     GPU time per kernel beyond its roofline time
  link_efficiency       0.80      [0.01, 1]    share of a link's datasheet bandwidth a collective's ring reaches
  nccl_base_s           8.4e-6    [0, 1] s     NCCL's base latency of a ring collective (Simple protocol)
  nvlink_step_s         3.4e-6    [0, 1] s     NCCL's latency per ring step over NVLink
  pcie_step_s           5.7e-6    [0, 1] s     ... over PCIe
  net_step_s            9.6e-6    [0, 1] s     ... per ring step that crosses nodes
  cuda_context_bytes    1 GiB     [0, 2^50]    the CUDA context, cuBLAS/cuDNN workspaces and kernels
  nccl_buffer_bytes     256 MiB   [0, 2^50]    NCCL's buffers, per process group with a collective in the trace
  fragmentation         0.10      [0, 10]      the caching allocator's reserved bytes over the peak live bytes, minus 1
  pipeline_send_overlap 0         [0, 1]       share of a pipeline stage's sends to its neighbours hidden behind its compute
The ranges (RANGES) keep a plan's figures finite: a value outside one (inf, nan, a launch cost of
1e308 s, a fragmentation of 1e300, an efficiency of 1e-320, which made a time of bytes / (bandwidth x
1e-320) = inf) is refused with its name, the value and the range. An efficiency divides, so its range
stops at MIN_EFFICIENCY (1% of a peak, below what a plan can mean; the largest time, 2^60 bytes of
an op over 1 GB/s x 0.01, stays finite); latencies, sizes and fragmentation add or multiply. The sources
are in SOURCES. Efficiencies that are judgements say so, and why; a plan on
the device the trace was taken on replaces the four compute and memory efficiencies with
what the trace measured (reports.plan.ops.calibrate), and a trace taken on a GPU
replaces `fragmentation` with its own reserved / peak allocated bytes (reports.plan.fit).
"""

from collections.abc import Mapping

from reports.errors import ReportError

__all__ = ["BY_GENERATION", "DEFAULTS", "MIN_EFFICIENCY", "RANGES", "SOURCES", "UNITS", "resolve"]

DEFAULTS = {
    "matmul_efficiency": 0.80,
    "attention_efficiency": 0.35,
    "matmul_stack": 1.0,
    "attention_stack": 1.0,
    "vector_efficiency": 0.80,
    "memory_efficiency": 0.80,
    "launch_s": 3e-6,
    "link_efficiency": 0.80,
    "nccl_base_s": 8.4e-6,
    "nvlink_step_s": 3.4e-6,
    "pcie_step_s": 5.7e-6,
    "net_step_s": 9.6e-6,
    "cuda_context_bytes": 2**30,
    "nccl_buffer_bytes": 256 * 2**20,
    "fragmentation": 0.10,
    "pipeline_send_overlap": 0.0,
}

UNITS = {
    "launch_s": "s",
    "nccl_base_s": "s",
    "nvlink_step_s": "s",
    "pcie_step_s": "s",
    "net_step_s": "s",
    "cuda_context_bytes": "bytes",
    "nccl_buffer_bytes": "bytes",
}  # (the rest are fractions)

MIN_EFFICIENCY = 0.01  # the least share of a peak: every time divided by an efficiency stays finite (module docstring)
# (low, high, whether low itself is allowed): efficiencies are shares of a peak from MIN_EFFICIENCY, latencies
# under a second, byte sizes under a PiB (2^50), fragmentation under 10x the peak
RANGES = {
    **{name: (MIN_EFFICIENCY, 1.0, True) for name in DEFAULTS if name.endswith("_efficiency")},
    **{name: (0.0, 1.0, True) for name in DEFAULTS if name.endswith("_s")},
    **{name: (MIN_EFFICIENCY, 2.0, True) for name in DEFAULTS if name.endswith("_stack")},
    "cuda_context_bytes": (0, 2**50, True),
    "nccl_buffer_bytes": (0, 2**50, True),
    "fragmentation": (0.0, 10.0, True),
    "pipeline_send_overlap": (0.0, 1.0, True),
}

_NCCL = "NCCL src/graph/tuning.cc (NVIDIA/nccl, ring algorithm, Simple protocol: baseLat and hwLat)"
SOURCES = {
    "matmul_efficiency": (
        "judgement from measurements: the best large bf16 matmul found on an H100 SXM runs at 792.1 TFLOP/s, 80% "
        "of its 989.4 dense peak (A100 SXM: 267.9 of 312, 86%): Stas Bekman's mamf-finder, as tabled in the "
        "README of github.com/mag-/gpu_benchmark. A model's matmuls are smaller and reach less. Used where "
        "reports.plan.efficiency has no table for the target (A100 and Hopper have one: by shape)"
    ),
    "attention_efficiency": (
        "FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608): FlashAttention-2, the kernel PyTorch's "
        "SDPA flash backend runs, reaches 35% of the H100's peak (FlashAttention-3: 75%). Used where "
        "reports.plan.efficiency has no table for the target and kernel"
    ),
    "matmul_stack": (
        "1 where no published runs fit it (BY_GENERATION holds A100's and Hopper's): the matmuls run as fast as "
        "the published GEMM sweep measured them (reports.plan.efficiency); a "
        "training stack that reaches less (clock under a power limit, kernels cuBLAS's heuristics pick badly, "
        "interference from overlapped communication) is below 1. `--calibrate MEASURED` fits it from a trace "
        "measured on the target; range 0.01-2"
    ),
    "attention_stack": (
        "1: attention kernels run at the published figure of their kernel on the target's generation "
        "(reports.plan.efficiency); `--calibrate MEASURED` fits it; range 0.01-2"
    ),
    "vector_efficiency": "judgement: non-matmul FLOPs run on the vector units (the float32 peak) and are rarely the bound",
    "memory_efficiency": (
        "judgement: large elementwise kernels stream at most of the HBM bandwidth; small ones (norms, casts of "
        "small tensors) reach less. Calibrate on the device to replace it"
    ),
    "launch_s": (
        "judgement: the gap between back-to-back kernels on the GPU while the CPU keeps ahead; eager PyTorch's "
        "CPU cost per op (~10 us) is hidden then, and shows only when kernels are shorter"
    ),
    "link_efficiency": (
        "nccl-tests bus bandwidth at large sizes: 230-250 GB/s on 8 A100 SXM4 over NVLink, whose datasheet gives "
        "300 GB/s each way (docs.alayanew.com, 'NCCL-tests in practice', 2026); applied to the network too (judgement)"
    ),
    "nccl_base_s": _NCCL + ": 8.4 us",
    "nvlink_step_s": _NCCL + ": 3.4 us per step over NVLink",
    "pcie_step_s": _NCCL + ": 5.7 us per step over PCIe",
    "net_step_s": _NCCL + ": 9.6 us per step over the network",
    "cuda_context_bytes": (
        "judgement: the CUDA context with cuBLAS, cuDNN and NCCL's kernels loaded takes 0.5-1 GiB on recent "
        "GPUs; the larger figure is taken"
    ),
    "nccl_buffer_bytes": (
        "NCCL_BUFFSIZE's default, 4 MiB (NCCL's environment variable documentation), x 2 (send and receive) x 32 "
        "channels (NCCL's most; judgement that a large job opens them all)"
    ),
    "fragmentation": (
        "judgement: PyTorch's caching allocator rounds blocks up and keeps freed blocks reserved; reserved bytes "
        "run 5-15% above the peak allocated in large training jobs"
    ),
    "pipeline_send_overlap": (
        "Megatron-LM megatron/core/pipeline_parallel/schedules.py: its 1F1B schedule exchanges activations and "
        "gradients with the neighbouring stages by blocking batched send/recv (send_forward_recv_backward waits "
        "for them), so none is hidden; 1 models its overlap_p2p_comm, which the interleaved schedule offers"
    ),
}


# defaults that are a property of a GPU generation and its training stacks (reports.plan.efficiency's generations):
# {name: {generation: (value, source)}}, in place of DEFAULTS[name] on a target of that generation
_FITTED = (
    "the median of the matmul_stack that matches each published run of the generation in "
    "benchmarks/plan_validation.py (reports.plan.calibration.stack_step, pooled), as of 2026-12-05: {runs}. "
    "What it stands for is not measured apart: GEMMs in a training step share the power limit with HBM and "
    "NVLink traffic and their SMs with NCCL's kernels, which the sweep's GEMMs alone did not (a GEMM on random "
    "data is already power-limited: 257 against 295 TFLOP/s on zeros on an A100, Horace He, 'Strangely, Matrix "
    "Multiplications on GPUs Run Faster When Given Predictable Data!', thonking.ai, 2024); no published figure "
    "of the clocks a training step sustains was found. Judged leave-one-out in docs/planning.md"
)
BY_GENERATION = {
    "matmul_stack": {
        "hopper": (
            0.673,
            _FITTED.format(
                runs="7 runs of 2 sources: llm-foundry's MPT 1b 0.673, 3b 0.597, 7b 0.730, 13b 0.726, 30b 0.762 "
                "(H100 SXM, 700 W); torchtitan's Llama 3.1 8B 0.554 and 405B 0.560 (H100 96 GB at 500 W)"
            ),
        ),
        "ampere": (
            0.776,
            _FITTED.format(
                runs="11 runs of 3 sources: llm-foundry's MPT 125m 0.704, 1b 0.821, 3b 0.728, 7b 0.862, 13b 0.905, "
                "30b 0.951; torchtitan's Llama 3 8B 0.746, 70B 0.776; fms-fsdp's Llama 2 7b 0.731, 13b 0.649, "
                "70b 0.820 (A100 80GB SXM; Megatron-LM's 1T run is left out: no stack in range matches it, its "
                "error is its slowest pipeline stage's)"
            ),
        ),
    },
}


def _interval(name):
    low, high, closed = RANGES[name]
    unit = UNITS.get(name, "")
    high = "2^50" if high == 2**50 else f"{high:g}"
    return f"{'[' if closed else '('}{low:g}, {high}]" + (f" {unit}" if unit else "")


def resolve(overrides=None, generation=None):
    """{name: (value, source)}: DEFAULTS (BY_GENERATION's where it has `generation`, the target's generation in
    reports.plan.efficiency) with `overrides` ({name: number}) applied, their source "given".

    An unknown name, or a value that is not a number in its RANGES (inf and nan never are), is a
    ReportError naming it, the value and the range; overrides that are not a dict, one naming that."""
    table = {name: (value, SOURCES[name]) for name, value in DEFAULTS.items()}
    table.update({name: by[generation] for name, by in BY_GENERATION.items() if generation in by})
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ReportError(
            f"plan: assumptions must be a dict {{name: number}}, got a {type(overrides).__name__}: {overrides!r:.80}"
        )
    for name, value in (overrides or {}).items():
        if name not in DEFAULTS:
            raise ReportError(f"plan: unknown assumption {name!r}; expected one of {', '.join(DEFAULTS)}")
        low, high, closed = RANGES[name]
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or not (low <= value <= high) or (value == low and not closed):  # nan fails low <= value
            raise ReportError(f"plan: assumption {name} must be in {_interval(name)}, got {value!r}")
        table[name] = (float(value), "given")
    return table
