"""Peak FLOP/s and memory bandwidth for the reports: the FLOP table lives in tracer/peaks.py (pure data, shared
with the tracer's run-time meter) and is re-exported here; see that module for what every figure means.

Memory bandwidth (the roofline's memory roof) is below."""

import re

from reports.errors import ReportError
from tracer.peaks import FULL_UNITS, PEAKS, T, cpu_ideal_flops, lookup, match_device, normalize_dtype  # noqa: F401 (re-exported)

__all__ = ["BANDWIDTH", "FULL_UNITS", "PEAKS", "cpu_ideal_flops", "match_device", "normalize_dtype", "peak_bandwidth", "peak_flops"]


def peak_flops(device_meta, dtype, override=None):
    """(peak FLOP/s or None, source) for a run's device (metadata["device"]) and dtype.

    `override` (FLOP/s > 0) wins. A GPU is looked up by name in PEAKS; a CPU gets its
    ideal peak (cpu_ideal_flops). When nothing fits, the value is None and the source
    says why."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, (int, float)) or not override > 0:
            raise ReportError(f"peak_flops: override must be FLOP/s > 0, got {override!r}")
        return float(override), "given"
    return lookup(device_meta, dtype)


# Memory bandwidth -----------------------------------------------------------------------
# Peak DRAM (HBM or GDDR) bandwidth per device, bytes/s, from the same datasheets: the
# memory roof of reports.roofline. Decimal units, as the datasheets print them
# (1 TB/s = 1e12 bytes/s). A100s differ by memory size, so they have their own keys.
G = 1e9

_NV_A100_BW = "NVIDIA A100 Tensor Core GPU datasheet (40GB: 1,555 GB/s; 80GB SXM: 2,039 GB/s; 80GB PCIe: 1,935 GB/s)"
_NV_H100_BW = "NVIDIA H100 Tensor Core GPU datasheet (SXM 3.35 TB/s, PCIe 2 TB/s, NVL 3.9 TB/s)"
_AMD_MI250X_BW = "AMD Instinct MI250X datasheet: 3.2 TB/s (3,276.8 GB/s) per module of two GCDs; halved per GCD"

# device key -> (peak bytes/s, source)
BANDWIDTH = {
    "T4": (320 * G, "NVIDIA T4 datasheet: 320+ GB/s GDDR6"),
    "V100 SXM2": (900 * G, "NVIDIA Tesla V100 datasheet: 900 GB/s HBM2"),
    "V100 PCIe": (900 * G, "NVIDIA Tesla V100 datasheet: 900 GB/s HBM2"),
    "A10": (600 * G, "NVIDIA A10 datasheet: 600 GB/s GDDR6"),
    # NB (unsure): no NVIDIA datasheet; AWS and Baseten give the A10's 24 GB GDDR6 at 600 GB/s.
    "A10G": (600 * G, "AWS A10G (G5 instances; no NVIDIA datasheet): 600 GB/s, the A10's memory"),
    "A100 40GB": (1555 * G, _NV_A100_BW),
    "A100 80GB SXM": (2039 * G, _NV_A100_BW),
    "A100 80GB PCIe": (1935 * G, _NV_A100_BW),
    "L4": (300 * G, "NVIDIA L4 datasheet: 300 GB/s GDDR6"),
    "L40S": (864 * G, "NVIDIA L40S datasheet: 864 GB/s GDDR6"),
    "H100 SXM": (3350 * G, _NV_H100_BW),
    "H100 PCIe": (2000 * G, _NV_H100_BW),
    "H100 NVL": (3900 * G, _NV_H100_BW),  # per GPU, as the later datasheet gives it
    "H200": (4800 * G, "NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s HBM3e (SXM)"),
    "B200": (8000 * G, "NVIDIA HGX B200 datasheet: 64 TB/s for 8 GPUs, 8 TB/s per GPU"),
    "RTX 3090": (936 * G, "NVIDIA Ampere GA102 GPU Architecture whitepaper: 936 GB/s GDDR6X (RTX 3090)"),
    "RTX 4090": (1008 * G, "NVIDIA Ada GPU Architecture whitepaper: 1,008 GB/s GDDR6X (RTX 4090)"),
    # PyTorch sees each of an MI250X's two GCDs as a device, with half the module's memory.
    "MI250X": (1638.4 * G, _AMD_MI250X_BW),
    "MI300X": (5300 * G, "AMD Instinct MI300X datasheet: 5.3 TB/s HBM3"),
}

_A100_80GB_BYTES = 60 * 2**30  # more memory than this: an 80GB part (torch reports about 79.2 GiB)


def _bandwidth_key(device_meta):
    """The BANDWIDTH key for a GPU's metadata: the FLOP table's key, A100s split by memory size and form."""
    name = device_meta.get("name")
    key = match_device(name)
    if key != "A100":
        return key
    tokens = set(re.split(r"[^A-Z0-9]+", name.upper()))
    memory = device_meta.get("total_memory_bytes")
    if "80GB" in tokens or (memory is not None and "40GB" not in tokens and memory > _A100_80GB_BYTES):
        return "A100 80GB PCIe" if "PCIE" in tokens else "A100 80GB SXM"
    if "40GB" in tokens or memory is not None:
        return "A100 40GB"
    return None


def peak_bandwidth(device_meta, override=None, measured=None):
    """(peak memory bytes/s or None, source) for a run's device (metadata["device"]).

    `override` (bytes/s > 0) wins; then a GPU's datasheet figure (BANDWIDTH); then
    `measured` (the triad `tracer.memory_bandwidth` recorded, metadata["bandwidth"]),
    which is what a CPU gets: no datasheet fits a CPU's memory system."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, (int, float)) or not override > 0:
            raise ReportError(f"peak_bandwidth: override must be bytes/s > 0, got {override!r}")
        return float(override), "given"
    if device_meta and device_meta.get("type") != "cpu":
        key = _bandwidth_key(device_meta)
        if key in BANDWIDTH:
            return BANDWIDTH[key]
    rate = (measured or {}).get("bytes_per_s")
    if isinstance(rate, (int, float)) and rate > 0:
        return float(rate), f"measured: STREAM-like triad on {measured.get('n', '?')} elements ({measured.get('dtype', '?')})"
    if not device_meta:
        return None, "the trace records no device"
    if device_meta.get("type") == "cpu":
        return None, "no measured bandwidth: record Tracer.set_bandwidth(tracer.memory_bandwidth())"
    return None, f"no datasheet bandwidth for device {device_meta.get('name')!r}; pass bandwidth="
