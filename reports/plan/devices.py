"""The GPUs a plan can target: memory size and links, beside the peaks and bandwidths of reports.flops.peaks.

Each entry names the keys of PEAKS (dense FLOP/s per dtype) and BANDWIDTH (HBM bytes/s),
and adds what a plan needs beyond them, each figure with its source:

  memory_bytes   the datasheet capacity read in binary units (HBM stacks come in GiB:
                 "80GB" is five 16 GiB stacks): 80 GiB for an H100 SXM. The driver keeps
                 a little of it, which the CUDA-context allowance covers (assumptions.py).
  intra_bytes_per_s  one direction of a GPU's link to the other GPUs of its node: NVLink
                 (half the datasheet's bidirectional figure: an H100 SXM's 900 GB/s is
                 450 GB/s each way), or PCIe for parts without an NVLink switch.
  nic_bytes_per_s    one direction of the network port a GPU has to other nodes (the DGX
                 systems give each GPU its own 400 Gb/s ConnectX-7: 50 GB/s; DGX A100 a
                 200 Gb/s HDR port: 25 GB/s).

The CPU a trace ran on is a target too ("cpu"): its peak and bandwidth come from the
trace's own metadata (reports.flops.peaks: the ideal peak of its ISA and the triad the
tracer measured), which is what calibrating a plan against the traced step needs.
"""

from reports.errors import ReportError
from reports.flops.peaks import BANDWIDTH, PEAKS

__all__ = ["GPUS", "CPU", "Gpu", "gpu_choices", "resolve_gpu"]

GiB = 2**30
G = 1e9

_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM: 80GB HBM3, NVLink 900GB/s; PCIe: 80GB, PCIe Gen5 128GB/s)"
_DGX_H100 = "NVIDIA DGX H100 datasheet: 8x single-port ConnectX-7 VPI, 400Gb/s InfiniBand/Ethernet, one per GPU"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141GB HBM3e, NVLink 900GB/s)"
_DGX_H200 = "NVIDIA DGX H200 datasheet: 8x ConnectX-7 400Gb/s per GPU, as DGX H100"
_B200 = "NVIDIA HGX B200 datasheet: 1,440GB of HBM3e for 8 GPUs (180GB each), NVLink 5 1.8TB/s per GPU"
_DGX_B200 = "NVIDIA DGX B200 datasheet: 8x single-port ConnectX-7 400Gb/s, one per GPU"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (40GB or 80GB HBM2e; SXM NVLink 600GB/s)"
_DGX_A100 = "NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6 200Gb/s HDR InfiniBand, one per GPU"


class Gpu(dict):
    """One catalogue entry: a dict with the keys of the module docstring (and `name`)."""


def _gpu(name, peak, bandwidth, memory, memory_source, intra, intra_source, nic, nic_source):
    assert any(k == peak for k, _ in PEAKS) and bandwidth in BANDWIDTH, name  # the catalogue names real table keys
    return Gpu(name=name, peak_key=peak, bandwidth_key=bandwidth, memory_bytes=memory, memory_source=memory_source,
               intra_bytes_per_s=intra, intra_source=intra_source, nic_bytes_per_s=nic, nic_source=nic_source)


# name -> entry; the names `--gpu` takes (case and spaces ignored: "h100-sxm", "H100_SXM" are "H100 SXM")
GPUS = {g["name"]: g for g in (
    _gpu("H100 SXM", "H100 SXM", "H100 SXM", 80 * GiB, _H100, 450 * G, _H100 + ": 450 GB/s each way", 50 * G, _DGX_H100),
    _gpu("H100 PCIe", "H100 PCIe", "H100 PCIe", 80 * GiB, _H100, 64 * G, _H100 + ": PCIe Gen5 64 GB/s each way",
         50 * G, "assumed as DGX H100 (no DGX of PCIe parts): " + _DGX_H100),
    _gpu("H200", "H200", "H200", 141 * GiB, _H200, 450 * G, _H200 + ": 450 GB/s each way", 50 * G, _DGX_H200),
    _gpu("B200", "B200", "B200", 180 * GiB, _B200, 900 * G, _B200 + ": 900 GB/s each way", 50 * G, _DGX_B200),
    _gpu("A100 80GB SXM", "A100", "A100 80GB SXM", 80 * GiB, _A100, 300 * G, _A100 + ": 300 GB/s each way", 25 * G, _DGX_A100),
    _gpu("A100 40GB SXM", "A100", "A100 40GB", 40 * GiB, _A100, 300 * G, _A100 + ": 300 GB/s each way", 25 * G, _DGX_A100),
)}  # fmt: skip

CPU = "cpu"
_ALIASES = {"H100": "H100 SXM", "A100": "A100 80GB SXM", "A100 80GB": "A100 80GB SXM", "A100 40GB": "A100 40GB SXM"}


def _key(name):
    return " ".join(str(name).upper().replace("-", " ").replace("_", " ").split())


def gpu_choices():
    """The names `resolve_gpu` takes, for messages and help."""
    return [*GPUS, CPU]


def resolve_gpu(name):
    """The catalogue entry for `name` ("H100 SXM", "h100-sxm", "H100", "A100"), or CPU for "cpu".

    A name it does not know is a ReportError naming the value and the choices."""
    if isinstance(name, str) and _key(name) == "CPU":
        return CPU
    by_key = {_key(n): n for n in GPUS} | {_key(a): n for a, n in _ALIASES.items()}
    found = by_key.get(_key(name)) if isinstance(name, str) else None
    if found is None:
        raise ReportError(f"plan: unknown gpu {name!r}; expected one of {', '.join(gpu_choices())}")
    return GPUS[found]
