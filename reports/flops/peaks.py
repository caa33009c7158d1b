"""Peak FLOP/s and memory bandwidth for the reports: the FLOP table lives in tracer.peaks (shared with the tracer's
run-time meter) and is re-exported here; every figure is the device catalogue's (tracer.devices), whose docstring
says what each means and where it comes from.

Memory bandwidth (the roofline's memory roof) is below."""

from reports.errors import ReportError
from tracer.devices import DEVICES, by_family, candidates
from tracer.peaks import FULL_UNITS, PEAKS, T, cpu_ideal_flops, lookup, match_device, normalize_dtype  # noqa: F401 (re-exported)

__all__ = [
    "BANDWIDTH",
    "FULL_UNITS",
    "PEAKS",
    "cpu_ideal_flops",
    "match_device",
    "normalize_dtype",
    "peak_bandwidth",
    "peak_flops",
]


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


def _bandwidths():
    """{key: (peak DRAM bytes/s, source)}: the memory roof of reports.roofline, from the device catalogue
    (tracer.devices), keyed by the catalogue name ("A100 80GB SXM") and by the family (the PEAKS key) where every
    device of the family has the same bandwidth ("V100 SXM2"; not "A100", whose sizes differ)."""
    found = {d.name: (d.bandwidth, d.bandwidth_source) for d in DEVICES if d.bandwidth}
    for key in dict.fromkeys(d.family for d in DEVICES):
        figures = {found.get(d.name) for d in by_family(key)}
        if len(figures) == 1 and None not in figures:
            found[key] = figures.pop()
    return found


BANDWIDTH = _bandwidths()


def _datasheet_bandwidth(device_meta):
    """(bytes/s, source) of the catalogue records a GPU's metadata can name (by name, then memory size), when they
    agree; else None."""
    figures = {
        (d.bandwidth, d.bandwidth_source)
        for d in candidates(device_meta.get("name"), device_meta.get("total_memory_bytes"))
    }
    return figures.pop() if len(figures) == 1 and None not in next(iter(figures)) else None


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
        found = _datasheet_bandwidth(device_meta)
        if found:
            return found
    rate = (measured or {}).get("bytes_per_s")
    if isinstance(rate, (int, float)) and rate > 0:
        return float(
            rate
        ), f"measured: STREAM-like triad on {measured.get('n', '?')} elements ({measured.get('dtype', '?')})"
    if not device_meta:
        return None, "the trace records no device"
    if device_meta.get("type") == "cpu":
        return None, "no measured bandwidth: record Tracer.set_bandwidth(tracer.memory_bandwidth())"
    return None, f"no datasheet bandwidth for device {device_meta.get('name')!r}; pass bandwidth="
