"""Peak FLOP/s: dense datasheet figures per (device, dtype), and a CPU's ideal peak.

The figures are the device catalogue's (tracer.devices: one record per device, with its memory,
bandwidth and links); this module looks them up. Shared by the tracer (tracer.metering.meter, MFU at run
time) and the reports (reports.flops.peaks re-exports every name): pure Python, no torch, pandas
or pyarrow.

Every GPU figure is DENSE: no 2:4 structured sparsity. NVIDIA's Hopper, Ada and
Blackwell datasheets print the sparse figure, twice the dense one, with an
asterisk; the catalogue's values are halved back (the H100 SXM's "1,979 TFLOPS BF16*" is
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

from tracer.devices import DEVICES, T, family  # noqa: F401 (T is re-exported: reports.flops.peaks)

__all__ = ["FULL_UNITS", "PEAKS", "cpu_ideal_flops", "lookup", "match_device", "normalize_dtype"]

# (family, dtype) -> (dense FLOP/s, source): the catalogue's peaks (tracer.devices.DEVICES), one entry per family
PEAKS = {(d.family, dtype): (value, d.peaks_source) for d in DEVICES for dtype, value in d.peaks.items()}

# family -> compute units (SMs / CUs) of one whole device, for scaling a partition's peak (MIG, CPX/DPX)
FULL_UNITS = {d.family: d.units for d in DEVICES if d.units}


def match_device(name):
    """The PEAKS device key (tracer.devices.family) for a device name (torch.cuda.get_device_name), or None."""
    return family(name)


_DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "float32": "float32",
    "tf32": "tfloat32",
    "tfloat32": "tfloat32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float16": "float16",
    "fp64": "float64",
    "double": "float64",
    "float64": "float64",
    "fp8": "float8",
    "float8": "float8",
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
    source = f"CPU ideal: {cores} cores x {mhz / 1000:.2f} GHz ({clock} clock) x {per_cycle} FLOPs/cycle ({how})"
    return cores * mhz * 1e6 * per_cycle, source
