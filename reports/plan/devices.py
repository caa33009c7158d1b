"""The GPUs a plan can target: every device of the catalogue (tracer.devices), whose docstring says what each
figure means and where it comes from, and the CPU a trace ran on.

A target (Gpu) is the plan's view of a catalogue record: its name, its family (`peak_key`, the key of
reports.flops.peaks.PEAKS) and peaks, memory size, memory bandwidth and links, each figure with its source:

  memory_bytes, bandwidth_bytes_per_s   always needed: a record without one cannot be planned
  intra_bytes_per_s   one direction of a GPU's link to the other GPUs of its node: needed to price a collective
  nic_bytes_per_s     one direction of its network port: needed to price a collective that crosses nodes
  link                "NVLink", "PCIe" or "xGMI": the latency of a ring step (reports.plan.comm)
A figure the catalogue does not have is None; the plan refuses in one line naming it when it needs it.

The CPU a trace ran on is a target too ("cpu"): its peak and bandwidth come from the
trace's own metadata (reports.flops.peaks: the ideal peak of its ISA and the triad the
tracer measured), which is what calibrating a plan against the traced step needs.
"""

from reports.errors import ReportError
from tracer.devices import DEVICES, named

__all__ = ["CHOICES", "CPU", "GPUS", "Gpu", "missing", "resolve_gpu"]

CPU = "cpu"


class Gpu(dict):
    """One target: a dict with the keys of the module docstring (and `name`)."""


def _gpu(d):
    return Gpu(
        name=d.name,
        peak_key=d.family,
        peaks=d.peaks,
        memory_bytes=d.memory_bytes,
        memory_source=d.memory_source,
        bandwidth_bytes_per_s=d.bandwidth,
        bandwidth_source=d.bandwidth_source,
        intra_bytes_per_s=d.intra,
        intra_source=d.intra_source,
        nic_bytes_per_s=d.nic,
        nic_source=d.nic_source,
        link=d.link,
    )


# name -> target; the names `--gpu` takes (case, "-" and "_" ignored: "h100-sxm" is "H100 SXM")
GPUS = {d.name: _gpu(d) for d in DEVICES}
CHOICES = (*GPUS, CPU)  # for `--gpu`'s help and the message for a name that is none of them

_FIGURES = {
    "memory_bytes": "memory size",
    "bandwidth_bytes_per_s": "memory bandwidth",
    "intra_bytes_per_s": "intra-node link bandwidth",
    "nic_bytes_per_s": "inter-node (NIC) bandwidth",
}


def missing(gpu, figure):
    """A ReportError for a figure `gpu` lacks: "plan: the device catalogue has no <figure> for <gpu> (<why>)"."""
    why = gpu[figure.replace("_bytes_per_s", "").replace("_bytes", "") + "_source"]
    return ReportError(f"plan: the device catalogue has no {_FIGURES[figure]} for {gpu['name']} ({why})")


def resolve_gpu(name):
    """The target `name` names ("H100 SXM", "h100-sxm", "H100", "NVIDIA A100-SXM4-80GB"), or CPU for "cpu".

    A name it does not know, or one that names several devices ("A100"), is a ReportError naming the value and
    the choices or the devices it could be."""
    if isinstance(name, str) and name.strip().lower() == CPU:
        return CPU
    found = named(name) if isinstance(name, str) else []
    if len(found) > 1:
        raise ReportError(f"plan: gpu {name!r} is ambiguous: {', '.join(d.name for d in found)}")
    if not found:
        raise ReportError(f"plan: unknown gpu {name!r}; expected one of {', '.join(CHOICES)}")
    gpu = GPUS[found[0].name]
    for figure in ("memory_bytes", "bandwidth_bytes_per_s"):
        if gpu[figure] is None:
            raise missing(gpu, figure)
    return gpu
