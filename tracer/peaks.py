"""Peak FLOP/s as data: dense datasheet figures per (device, dtype), and a CPU's ideal peak.

Shared by the tracer (tracer/meter.py, MFU at run time) and the reports (reports/flops/peaks.py
re-exports every name): pure Python, no torch, pandas or pyarrow.

Every GPU figure is DENSE: no 2:4 structured sparsity. NVIDIA's Hopper, Ada and
Blackwell datasheets print the sparse figure, twice the dense one, with an
asterisk; the values below are halved back (the H100 SXM's "1,979 TFLOPS BF16*" is
989.4 dense). Dtype keys are torch dtype names:

  float32   plain fp32 math, which is what PyTorch runs unless TF32 is switched on
            (torch.backends.cuda.matmul.allow_tf32): NVIDIA's non-tensor-core FP32.
            On AMD Instinct parts fp32 GEMMs run on the matrix cores at full fp32
            precision, so their float32 entry is the "FP32 matrix" figure.
  tfloat32  the TF32 tensor-core rate (pass dtype="tfloat32" when TF32 is on)
  bfloat16, float16  tensor-core rates with FP32 accumulation (PyTorch's GEMMs)
  float8    FP8 tensor-core rate with FP32 accumulation, where the device has FP8

A (device, dtype) without an entry has no peak: MFU is then None (N/A) rather
than measured against a rate the device does not have (a T4 has no bf16 tensor
cores, so bf16 on a T4 has no datasheet peak).

Every figure is PER DEVICE AS TORCH SEES IT (one torch.cuda device), not per board:
  MI250X    one OAM module holds two GCDs, and ROCm shows each as its own device:
            the datasheet's module figures are halved (BF16 383 -> 191.5 per device,
            as torchtitan's get_peak_flops has it)
  MI300X    eight XCDs, one device in the default SPX partition mode
  B200      two dies, one CUDA device: per-GPU figures of the HGX B200 (eight GPUs)
  H100 NVL  sold as a bridged pair of PCIe boards, each its own device: per-GPU figures
A device partitioned further (NVIDIA MIG, AMD CPX/DPX modes) reports fewer compute
units (metadata device.multi_processor_count) than the whole part has; for the parts
in FULL_UNITS the peak is scaled by that fraction (NB: it assumes the same clock).
"""

import re

__all__ = ["FULL_UNITS", "PEAKS", "cpu_ideal_flops", "lookup", "match_device", "normalize_dtype"]

T = 1e12

_NV_T4 = "NVIDIA T4 Tensor Core GPU datasheet (dense)"
_NV_V100 = "NVIDIA Tesla V100 GPU datasheet (dense)"
_NV_A10 = "NVIDIA A10 Tensor Core GPU datasheet (dense)"
_NV_A100 = "NVIDIA A100 Tensor Core GPU datasheet (dense; SXM and PCIe list the same rates)"
_NV_L4 = "NVIDIA L4 Tensor Core GPU datasheet (dense: half the sparse figures)"
_NV_L40S = "NVIDIA L40S GPU datasheet (dense)"
_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet (dense: half the sparse figures)"
_NV_H200 = "NVIDIA H200 Tensor Core GPU datasheet (dense: half the sparse figures)"
_NV_B200 = "NVIDIA HGX B200 datasheet, per GPU (dense: half the sparse figures)"
_NV_GA102 = "NVIDIA Ampere GA102 GPU Architecture whitepaper, RTX 3090 (dense, FP32 accumulate)"
_NV_AD102 = "NVIDIA Ada GPU Architecture whitepaper, RTX 4090 (dense, FP32 accumulate)"
_AMD_MI250X = ("AMD Instinct MI250X datasheet (dense), per GCD: ROCm shows each of the module's two GCDs as a "
               "device, so the module's 95.7 / 383 TFLOPS are halved (https://www.amd.com/en/products/accelerators/"
               "instinct/mi200/mi250x.html; torchtitan get_peak_flops: 191.5e12 per GCD)")
_AMD_MI300X = "AMD Instinct MI300X datasheet (dense; one device in SPX mode)"
# NB (unsure): the A10G is an AWS-only part with no NVIDIA datasheet. Its figures are
# derived from its configuration (80 SMs at 1.71 GHz, GA102 with half-rate FP32-accumulate
# tensor math like the GeForce parts): 35 TFLOPS FP32, 70 TFLOPS BF16/FP16 dense, as
# AWS's G5 documentation and Baseten's "A10 vs A10G" comparison give them. Some tables
# (Lightning's) reuse the A10's 125 TFLOPS instead.
_A10G = "AWS A10G (G5 instances; no NVIDIA datasheet): derived dense figures, see NB in tracer/peaks.py"

# (device key, dtype) -> (dense FLOP/s, source)
PEAKS = {
    ("T4", "float32"): (8.1 * T, _NV_T4),
    ("T4", "float16"): (65 * T, _NV_T4),  # "Mixed precision (FP16/FP32)"; Turing has no bf16
    ("V100 SXM2", "float32"): (15.7 * T, _NV_V100),
    ("V100 SXM2", "float16"): (125 * T, _NV_V100),  # Volta has no bf16 tensor cores
    ("V100 PCIe", "float32"): (14 * T, _NV_V100),
    ("V100 PCIe", "float16"): (112 * T, _NV_V100),
    ("A10", "float32"): (31.2 * T, _NV_A10),
    ("A10", "tfloat32"): (62.5 * T, _NV_A10),
    ("A10", "bfloat16"): (125 * T, _NV_A10),
    ("A10", "float16"): (125 * T, _NV_A10),
    ("A10G", "float32"): (35 * T, _A10G),
    ("A10G", "tfloat32"): (35 * T, _A10G),
    ("A10G", "bfloat16"): (70 * T, _A10G),
    ("A10G", "float16"): (70 * T, _A10G),
    ("A100", "float32"): (19.5 * T, _NV_A100),
    ("A100", "tfloat32"): (156 * T, _NV_A100),
    ("A100", "bfloat16"): (312 * T, _NV_A100),
    ("A100", "float16"): (312 * T, _NV_A100),
    ("L4", "float32"): (30.3 * T, _NV_L4),
    ("L4", "tfloat32"): (60 * T, _NV_L4),
    ("L4", "bfloat16"): (121 * T, _NV_L4),
    ("L4", "float16"): (121 * T, _NV_L4),
    ("L4", "float8"): (242.5 * T, _NV_L4),
    ("L40S", "float32"): (91.6 * T, _NV_L40S),
    ("L40S", "tfloat32"): (183 * T, _NV_L40S),
    ("L40S", "bfloat16"): (362.05 * T, _NV_L40S),
    ("L40S", "float16"): (362.05 * T, _NV_L40S),
    ("L40S", "float8"): (733 * T, _NV_L40S),
    ("H100 SXM", "float32"): (67 * T, _NV_H100),
    ("H100 SXM", "tfloat32"): (494.7 * T, _NV_H100),
    ("H100 SXM", "bfloat16"): (989.4 * T, _NV_H100),
    ("H100 SXM", "float16"): (989.4 * T, _NV_H100),
    ("H100 SXM", "float8"): (1978.9 * T, _NV_H100),
    ("H100 PCIe", "float32"): (51 * T, _NV_H100),
    ("H100 PCIe", "tfloat32"): (378 * T, _NV_H100),
    ("H100 PCIe", "bfloat16"): (756.5 * T, _NV_H100),
    ("H100 PCIe", "float16"): (756.5 * T, _NV_H100),
    ("H100 PCIe", "float8"): (1513 * T, _NV_H100),
    # NB (unsure): the first H100 NVL datasheet gave figures for a bridged pair of GPUs (two torch
    # devices); these are the per-GPU ones of the later H100 datasheet (FP32 60, TF32 835*, BF16
    # 1,671*, FP8 3,341*), sparse halved to dense. torchtitan's table has 835e12 bf16 per device.
    ("H100 NVL", "float32"): (60 * T, _NV_H100),
    ("H100 NVL", "tfloat32"): (417.5 * T, _NV_H100),
    ("H100 NVL", "bfloat16"): (835.5 * T, _NV_H100),
    ("H100 NVL", "float16"): (835.5 * T, _NV_H100),
    ("H100 NVL", "float8"): (1670.5 * T, _NV_H100),
    ("H200", "float32"): (67 * T, _NV_H200),  # H200 SXM: the H100 SXM's rates with more memory
    ("H200", "tfloat32"): (494.7 * T, _NV_H200),
    ("H200", "bfloat16"): (989.4 * T, _NV_H200),
    ("H200", "float16"): (989.4 * T, _NV_H200),
    ("H200", "float8"): (1978.9 * T, _NV_H200),
    # NB (unsure): per GPU of an 8-GPU HGX B200 (FP32 600, TF32 18 P*, BF16 36 P*, FP8 72 P*
    # for eight). The 1,200 W GB200 parts are faster (BF16 2.5 PFLOPS dense).
    ("B200", "float32"): (75 * T, _NV_B200),
    ("B200", "tfloat32"): (1125 * T, _NV_B200),
    ("B200", "bfloat16"): (2250 * T, _NV_B200),
    ("B200", "float16"): (2250 * T, _NV_B200),
    ("B200", "float8"): (4500 * T, _NV_B200),
    # GeForce: tensor math with FP32 accumulation runs at half the FP16-accumulate rate.
    ("RTX 3090", "float32"): (35.6 * T, _NV_GA102),
    ("RTX 3090", "tfloat32"): (35.6 * T, _NV_GA102),
    ("RTX 3090", "bfloat16"): (71 * T, _NV_GA102),
    ("RTX 3090", "float16"): (71 * T, _NV_GA102),
    ("RTX 4090", "float32"): (82.6 * T, _NV_AD102),
    ("RTX 4090", "tfloat32"): (82.6 * T, _NV_AD102),
    ("RTX 4090", "bfloat16"): (165.2 * T, _NV_AD102),
    ("RTX 4090", "float16"): (165.2 * T, _NV_AD102),
    ("RTX 4090", "float8"): (330.3 * T, _NV_AD102),
    # per GCD (one torch device): half the module's FP32 matrix 95.7 (vector 47.9), BF16/FP16 383
    ("MI250X", "float32"): (47.85 * T, _AMD_MI250X),
    ("MI250X", "bfloat16"): (191.5 * T, _AMD_MI250X),
    ("MI250X", "float16"): (191.5 * T, _AMD_MI250X),
    ("MI300X", "float32"): (163.4 * T, _AMD_MI300X),  # FP32 matrix (vector: 81.7)
    ("MI300X", "tfloat32"): (653.7 * T, _AMD_MI300X),
    ("MI300X", "bfloat16"): (1307.4 * T, _AMD_MI300X),
    ("MI300X", "float16"): (1307.4 * T, _AMD_MI300X),
    ("MI300X", "float8"): (2614.9 * T, _AMD_MI300X),
}

# Compute units (SMs / CUs) of one whole device, for scaling a partition's peak (MIG, CPX/DPX):
# NVIDIA's architecture whitepapers and AMD's CDNA 2/3 whitepapers.
FULL_UNITS = {
    "A100": 108, "H100 SXM": 132, "H100 PCIe": 114, "H100 NVL": 132, "H200": 132, "B200": 148,
    "MI250X": 110,  # per GCD (220 per module)
    "MI300X": 304,
}  # fmt: skip

# Name matching works on whole tokens of the upper-cased name split at anything that is
# not a letter or digit ("NVIDIA A100-SXM4-80GB" -> NVIDIA, A100, SXM4, 80GB), so "A100"
# never matches inside "A1000" nor "A10" inside "A100" or "A10G". Rules are tried in order:
# (key, tokens that must all appear, tokens that must not appear).
_RULES = (
    ("H100 NVL", {"H100", "NVL"}, set()),
    ("H100 PCIe", {"H100", "PCIE"}, set()),
    ("H100 SXM", {"H100"}, {"NVL", "PCIE"}),  # "NVIDIA H100 80GB HBM3" is the SXM5 part
    ("H200", {"H200"}, {"NVL"}),  # the H200 NVL runs slower and has no entry
    ("B200", {"B200"}, set()),
    ("A100", {"A100"}, set()),
    ("A10G", {"A10G"}, set()),
    ("A10", {"A10"}, set()),
    ("L40S", {"L40S"}, set()),
    ("L4", {"L4"}, set()),
    ("T4", {"T4"}, set()),
    ("V100 SXM2", {"V100", "SXM2"}, set()),
    ("V100 PCIe", {"V100", "PCIE"}, set()),
    ("RTX 3090", {"RTX", "3090"}, {"TI", "LAPTOP", "MOBILE"}),
    ("RTX 4090", {"RTX", "4090"}, {"D", "LAPTOP", "MOBILE"}),
    ("MI250X", {"MI250X"}, set()),
    ("MI300X", {"MI300X"}, set()),
)


def match_device(name):
    """The PEAKS device key for a device name (torch.cuda.get_device_name), or None."""
    if not isinstance(name, str):
        return None
    tokens = set(re.split(r"[^A-Z0-9]+", name.upper())) - {""}
    for key, need, forbid in _RULES:
        if need <= tokens and not forbid & tokens:
            return key
    return None


_DTYPE_ALIASES = {
    "fp32": "float32", "float": "float32", "float32": "float32",
    "tf32": "tfloat32", "tfloat32": "tfloat32",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "half": "float16", "float16": "float16",
    "fp64": "float64", "double": "float64", "float64": "float64",
    "fp8": "float8", "float8": "float8",
}


def normalize_dtype(dtype):
    """A dtype name for PEAKS: "bfloat16" from torch.bfloat16, "torch.bfloat16", "bf16"; every fp8 -> "float8"."""
    name = str(dtype).removeprefix("torch.").lower()
    if name.startswith("float8"):
        return "float8"
    return _DTYPE_ALIASES.get(name, name)


def lookup(device_meta, dtype):
    """(peak FLOP/s or None, source) for a run's device (metadata["device"]) and dtype.

    A GPU is looked up by name in PEAKS; a CPU gets its ideal peak (cpu_ideal_flops).
    When nothing fits, the value is None and the source says why."""
    if not device_meta:
        return None, "the trace records no device"
    if device_meta.get("fake"):
        return None, "fake tensors (FakeTensorMode): no device ran the ops; pass a peak to compare"
    dtype = normalize_dtype(dtype)
    if device_meta.get("type") == "cpu":
        return cpu_ideal_flops(device_meta, dtype)
    name = device_meta.get("name")
    key = match_device(name)
    if key is None:
        return None, f"no datasheet peak for device {name!r}; pass peak_flops="
    if (key, dtype) not in PEAKS:
        have = sorted(d for k, d in PEAKS if k == key)
        return None, f"{key} has no dense {dtype} peak in the table (it lists {', '.join(have)})"
    value, source = PEAKS[(key, dtype)]
    units, full = device_meta.get("multi_processor_count"), FULL_UNITS.get(key)
    if isinstance(units, int) and full and 0 < units < full:
        return value * units / full, f"{source}; a partition with {units} of {full} compute units: scaled to match"
    return value, source


# CPU ------------------------------------------------------------------------------------
# FLOPs per cycle per core, from the widest vector unit in metadata["device"]["isa"].
# NB: assumes 2 FMA units per core, each a full vector wide: true for Intel Xeon
# Gold/Platinum (Skylake-SP on) and AMD Zen 5; Xeon Silver/Bronze have one 512-bit unit,
# and AMD Zen 4 runs AVX-512 on 256-bit units (half these figures). An FMA counts 2 FLOPs.
_LANES32 = (("avx512f", 16), ("avx2", 8), ("avx", 8), ("sse2", 4))
# NB (unsure): AMX does 1,024 bf16 FLOPs per cycle per core (Intel's "1024 BF16 ops/cycle").
_AMX_BF16 = 1024


def _per_cycle(isa, bits=32):
    lanes = next((n for flag, n in _LANES32 if flag in isa), 1) * 32 // bits
    if "fma" in isa or "avx512f" in isa:
        return lanes * 2 * 2, f"{lanes} fp{bits} lanes x 2 (FMA) x 2 FMA units"
    return lanes * 2, f"{lanes} fp{bits} lanes x 2 (one multiply and one add unit, no FMA)"


def cpu_ideal_flops(device_meta, dtype):
    """(cores x clock x FLOPs per cycle per core, how it was computed) for a CPU, or (None, why).

    The lecture's FLOPS (Ideal). Cores: the threads PyTorch used (it starts one per
    physical core), at most the logical CPUs. Clock: the rated maximum (max_mhz) if
    known, else the clock /proc/cpuinfo reported. FLOPs per cycle: fp32 lanes of the
    widest vector ISA x 2 (an FMA is a multiply and an add) x 2 FMA units (assumed):
    AVX-512: 16 x 2 x 2 = 64; AVX2 + FMA: 8 x 2 x 2 = 32 (without FMA: one multiply
    and one add unit, 8 x 2 = 16). float64 has half the lanes.
    bfloat16: AMX 1,024; AVX512_BF16 twice the fp32 rate (a dot product of bf16
    pairs per fp32 lane); otherwise bf16/fp16 math runs in fp32 (the fp32 rate)."""
    if not device_meta or device_meta.get("type") != "cpu":
        return None, "not a CPU"
    dtype = normalize_dtype(dtype)
    isa = set(device_meta.get("isa") or [])
    cores = device_meta.get("threads") or device_meta.get("cores")
    if device_meta.get("cores"):
        cores = min(cores, device_meta["cores"])
    mhz = device_meta.get("max_mhz") or device_meta.get("mhz")
    if not cores or not mhz:
        return None, "the trace records no CPU core count or clock"
    if not isa:
        return None, "the trace records no CPU instruction set (isa)"
    per_cycle, how = _per_cycle(isa)
    if dtype == "float32":
        pass
    elif dtype == "float64":
        per_cycle, how = _per_cycle(isa, 64)
    elif dtype == "bfloat16" and "amx_bf16" in isa:
        per_cycle, how = _AMX_BF16, "AMX: 1,024 bf16 FLOPs per cycle"
    elif dtype == "bfloat16" and "avx512_bf16" in isa:
        per_cycle, how = per_cycle * 2, f"AVX512_BF16: 2 x ({how})"
    elif dtype in ("bfloat16", "float16"):
        how += f"; no native {dtype} math, so it runs in fp32"
    else:
        return None, f"no CPU ideal for dtype {dtype}"
    clock = "max" if device_meta.get("max_mhz") else "reported"
    source = (f"CPU ideal: {cores} cores x {mhz / 1000:.2f} GHz ({clock} clock) x {per_cycle} FLOPs/cycle "
              f"({how})")
    return cores * mhz * 1e6 * per_cycle, source
