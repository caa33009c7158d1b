"""The target of a plan: the device a traced rank is priced on, and the assumptions listed with their sources.

target(gpu, meta)         (catalogue entry or CPU, peak_of(dtype), bandwidth, its source, memory bytes)
on_target(entry, meta)    whether the trace ran, with real op times, on the target (so it calibrates itself)
generation(entry)         the target's generation with efficiency tables (reports.plan.efficiency), or None
table_notes, effective    what the efficiency tables priced and the efficiencies they reach together
listed(...)               the plan's `assumptions` [{name, value, unit, source}]
"""

import numpy as np

from reports.errors import ReportError
from reports.flops.peaks import PEAKS, cpu_ideal_flops, peak_bandwidth
from reports.plan import assumptions as assumed
from reports.plan.devices import CPU, resolve_gpu
from reports.plan.efficiency import generation as _table_generation
from reports.plan.ops import STACKS
from tracer.devices import candidates

__all__ = ["effective", "generation", "listed", "on_target", "table_notes", "target"]


def target(gpu, meta):
    """(gpu entry or CPU, peak_of(dtype), bandwidth, the bandwidth's source, memory bytes)."""
    entry = resolve_gpu(gpu)
    device = meta.get("device") or {}
    if entry == CPU:
        if device.get("type") != "cpu" or device.get("fake"):
            raise ReportError(
                f"plan: gpu 'cpu' plans a trace against the CPU it ran on; this trace ran on {device.get('name')!r}"
            )
        bandwidth, bw_source = peak_bandwidth(device, None, meta.get("bandwidth"))
        if bandwidth is None:  # no datasheet fits a CPU: memory-bound ops cannot be priced without a measured one
            raise ReportError(
                f"plan: gpu 'cpu' needs the CPU's memory bandwidth, which this trace does not record ({bw_source})"
            )
        return entry, lambda d: cpu_ideal_flops(device, d)[0], bandwidth, bw_source, None
    return entry, entry["peaks"].get, entry["bandwidth_bytes_per_s"], entry["bandwidth_source"], entry["memory_bytes"]


def on_target(entry, meta):
    """Whether the trace ran, with real times, on the target device."""
    device = meta.get("device") or {}
    if device.get("fake") or device.get("type") == "meta" or (meta.get("timing") or {}).get("mode") == "off":
        return False
    if entry == CPU:
        return device.get("type") == "cpu"
    # the catalogue records the trace's device can be (by name, then memory size): an A100 40GB is not the 80GB target
    found = candidates(device.get("name"), device.get("total_memory_bytes"))
    return device.get("type") == "cuda" and entry["name"] in {d.name for d in found}


def generation(entry):
    """The target's generation with efficiency tables (reports.plan.efficiency), or None."""
    return None if entry == CPU else _table_generation(entry["peak_key"])


def table_notes(p, sources, entry):
    """Drop the tables' per-row efficiencies of a class whose flat efficiency was given; notes on what priced what."""
    given = {c: sources[f"{c}_efficiency"] == "given" for c in ("matmul", "attention")}
    for c, name in enumerate(("matmul", "attention")):
        if given[name]:
            p["shaped"][p["klass"] == c] = np.nan
    if entry == CPU or generation(entry) is not None:
        return []
    return [
        f"reports.plan.efficiency has no GEMM sweep or attention table for the {entry['peak_key']}: its matmuls "
        "and attention kernels are priced at the flat matmul_efficiency and attention_efficiency"
    ]


def effective(p, eff, a, sources):
    """List matmul_efficiency and attention_efficiency as what the step's ops of the class reach together
    (their FLOPs at the roof over their priced compute time) when a table priced any of them."""
    shaped = p.get("shaped")
    for c, name in enumerate(("matmul", "attention")):
        pick = (p["klass"] == c) & ~np.isnan(shaped) & (p["compute"] > 0)
        if not pick.any():
            continue
        e = np.where(np.isnan(shaped), eff[name], shaped * eff[STACKS[c]])[pick]
        value = float(p["compute"][pick].sum() / (p["compute"][pick] / e).sum())
        a[f"{name}_efficiency"] = value
        table = "a GEMM sweep by (m, n, k)" if name == "matmul" else "its kernel's published figure"
        sources[f"{name}_efficiency"] = (
            f"reports.plan.efficiency: {int(pick.sum())} {name} ops of the step each at {table} on this "
            f"generation x {STACKS[c]} ({eff[STACKS[c]]:.3g}); the figure is what they reach together "
            "(the flat assumption prices only the rest)"
        )


def _peak_source(entry, dtype):
    if entry == CPU:
        return f"the CPU's ideal {dtype} peak (reports.flops.peaks.cpu_ideal_flops)"
    return f"{entry['peak_key']} dense {dtype} peak: {PEAKS.get((entry['peak_key'], dtype), (None, 'none in the table'))[1]}"


def listed(a, sources, entry, peak, dtype, bandwidth, bw_source, memory, overlap):
    """The plan's assumptions [{name, value, unit, source}]: `a` {name: value} with `sources`, then the target's
    peak, bandwidth, memory, the overlap model and (on a GPU) its links."""
    units = assumed.UNITS
    out = [{"name": n, "value": a[n], "unit": units.get(n, "fraction"), "source": sources[n]} for n in a]
    out += [
        {"name": "peak_flops_per_s", "value": peak, "unit": "FLOP/s", "source": _peak_source(entry, dtype)},
        {"name": "hbm_bytes_per_s", "value": bandwidth, "unit": "bytes/s", "source": bw_source},
        {
            "name": "device_memory_bytes",
            "value": memory,
            "unit": "bytes",
            "source": entry["memory_source"] if entry != CPU else "unknown for a CPU",
        },
        {
            "name": "overlap",
            "value": overlap,
            "unit": "",
            "source": "reports.plan.comm: "
            + (
                "FSDP2's prefetch: an all-gather one unit ahead overlaps the current unit's compute; other collectives "
                "overlap the compute after them until their result is read"
                if overlap == "prefetch"
                else "none: every collective blocks the compute stream"
            ),
        },
    ]
    if entry != CPU:
        out += [
            {
                "name": "intra_node_bytes_per_s",
                "value": entry["intra_bytes_per_s"],
                "unit": "bytes/s",
                "source": entry["intra_source"],
            },
            {
                "name": "nic_bytes_per_s",
                "value": entry["nic_bytes_per_s"],
                "unit": "bytes/s",
                "source": entry["nic_source"],
            },
        ]
    return out
