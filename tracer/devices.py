"""The device catalogue: what a GPU is, one record per device, each figure with its source.

Every consumer reads this one table: the peak FLOP/s of MFU (tracer.peaks, which the tracer's
run-time meter and reports.flops.peaks use), the memory roof of the roofline
(reports.flops.peaks.peak_bandwidth) and the targets of `optrace plan --gpu`
(reports.plan.devices). Pure Python: no torch, pandas or pyarrow.

A record (Device) holds, for one device as torch sees it (one torch.cuda device, see
tracer.peaks for boards of several dies or GPUs):

  name          the catalogue name, which `--gpu` takes ("A100 80GB SXM")
  family        the key of tracer.peaks.PEAKS: devices that differ only in memory size or
                form factor compute at the same rates and share it ("A100")
  peaks         {dtype: dense FLOP/s}; dtypes and the dense convention are tracer.peaks's
  peaks_source  the datasheet the peaks come from
  units         compute units (SMs / CUs) of the whole device, to scale a partition's peak
                (NVIDIA's architecture whitepapers, AMD's CDNA 2/3 whitepapers), or None
  memory_bytes  capacity, the datasheet's GB read as GiB (HBM stacks and GDDR chips come in
                binary sizes: "80GB" is five 16 GiB stacks); the driver keeps a little of it,
                which the plan's CUDA-context allowance covers (reports.plan.assumptions)
  bandwidth     peak DRAM (HBM or GDDR) bytes/s, decimal as the datasheets print it
                (1 TB/s = 1e12 bytes/s): the roofline's memory roof
  link          what joins the GPUs of a node: "NVLink", "PCIe" or "xGMI" (AMD Infinity
                Fabric); the plan prices a PCIe ring step at NCCL's PCIe latency, the others
                at its NVLink latency (reports.plan.comm)
  intra         one direction of a GPU's link to the other GPUs of its node, bytes/s: NVLink
                or xGMI (half the datasheet's bidirectional figure: an H100 SXM's 900 GB/s is
                450 GB/s each way), or PCIe for boards without a switch (PCIe Gen4 x16: the
                datasheets' 64 GB/s bidirectional, 32 GB/s each way)
  nic           one direction of the network port a GPU has to other nodes, bytes/s, from the
                reference system's datasheet (DGX H100: one 400 Gb/s ConnectX-7 per GPU,
                50 GB/s; DGX A100: 200 Gb/s HDR, 25 GB/s)
Each figure has a `*_source` beside it. A figure no datasheet publishes is None, its source
says why, and a consumer that needs it refuses in one line naming it (`optrace plan` needs
`intra` only for a collective and `nic` only for one that crosses nodes). Where a figure is
derived or assumed rather than printed, an NB says so beside it (the A10G's, from AWS; the
H100 PCIe's network port, assumed as DGX H100's; DGX-1's ports shared by two V100s).

Names match on whole tokens of the upper-cased name split at anything that is not a letter
or digit ("NVIDIA A100-SXM4-80GB" -> NVIDIA, A100, SXM4, 80GB), so "A100" never matches
inside "A1000" nor "A10" inside "A100" or "A10G". First the family: the rules of _RULES,
tried in order, each (family, tokens that must all appear, tokens that must not). Then,
where a family has several records, the variant: a PCIE token picks the PCIe boards (else
the others); a size token ("40GB") picks that size; else the memory torch reports
(device.total_memory_bytes) picks the record of the nearest size (79.2 GiB: the 80GB one).
A name that leaves several records is ambiguous: `find` gives None, `candidates` lists them.
A person's name for a device (`optrace plan --gpu`) goes through `named`: the catalogue name
("h100-sxm" too), else a device name (a bare "H100" is the SXM part, as torch names it; "A100
80GB" names both forms), else the records whose names hold all its tokens ("RTX").
"""

import re
from typing import NamedTuple

__all__ = ["DEVICES", "Device", "by_family", "candidates", "family", "find", "named", "tokens"]

T = 1e12
G = 1e9
GiB = 2**30


class Device(NamedTuple):
    """One device: the fields of the module docstring."""

    name: str
    family: str
    peaks: dict
    peaks_source: str
    units: int | None
    memory_bytes: int | None
    memory_source: str
    bandwidth: float | None
    bandwidth_source: str
    link: str
    intra: float | None
    intra_source: str
    nic: float | None
    nic_source: str


# Dense FLOP/s per dtype (tracer.peaks: what each dtype key means, why the figures are dense) -----
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
_AMD_MI250X = (
    "AMD Instinct MI250X datasheet (dense), per GCD: ROCm shows each of the module's two GCDs as a "
    "device, so the module's 95.7 / 383 TFLOPS are halved (https://www.amd.com/en/products/accelerators/"
    "instinct/mi200/mi250x.html; torchtitan get_peak_flops: 191.5e12 per GCD)"
)
_AMD_MI300X = "AMD Instinct MI300X datasheet (dense; one device in SPX mode)"
# NB (unsure): the A10G is an AWS-only part with no NVIDIA datasheet. Its figures are
# derived from its configuration (80 SMs at 1.71 GHz, GA102 with half-rate FP32-accumulate
# tensor math like the GeForce parts): 35 TFLOPS FP32, 70 TFLOPS BF16/FP16 dense, as
# AWS's G5 documentation and Baseten's "A10 vs A10G" comparison give them. Some tables
# (Lightning's) reuse the A10's 125 TFLOPS instead; its memory is the A10's (AWS, Baseten).
_A10G = "AWS A10G (G5 instances; no NVIDIA datasheet): derived dense figures, see NB in tracer.devices"


def _rates(fp32, tf32=None, bf16=None, fp16=None, fp8=None):
    """{dtype: FLOP/s} of the rates given, in TFLOP/s."""
    pairs = (("float32", fp32), ("tfloat32", tf32), ("bfloat16", bf16), ("float16", fp16), ("float8", fp8))
    return {dtype: value * T for dtype, value in pairs if value is not None}


_T4 = _rates(8.1, fp16=65)  # "Mixed precision (FP16/FP32)"; Turing has no bf16
_V100_SXM2 = _rates(15.7, fp16=125)  # Volta has no bf16 tensor cores
_V100_PCIE = _rates(14, fp16=112)
_A10 = _rates(31.2, 62.5, 125, 125)
_A10G_RATES = _rates(35, 35, 70, 70)
_A100_RATES = _rates(19.5, 156, 312, 312)
_L4 = _rates(30.3, 60, 121, 121, 242.5)
_L40S = _rates(91.6, 183, 362.05, 362.05, 733)
_H100_SXM = _rates(67, 494.7, 989.4, 989.4, 1978.9)
_H100_PCIE = _rates(51, 378, 756.5, 756.5, 1513)
# NB (unsure): the first H100 NVL datasheet gave figures for a bridged pair of GPUs (two torch
# devices); these are the per-GPU ones of the later H100 datasheet (FP32 60, TF32 835*, BF16
# 1,671*, FP8 3,341*), sparse halved to dense. torchtitan's table has 835e12 bf16 per device.
_H100_NVL = _rates(60, 417.5, 835.5, 835.5, 1670.5)
_H200_RATES = _rates(67, 494.7, 989.4, 989.4, 1978.9)  # H200 SXM: the H100 SXM's rates with more memory
# NB (unsure): per GPU of an 8-GPU HGX B200 (FP32 600, TF32 18 P*, BF16 36 P*, FP8 72 P*
# for eight). The 1,200 W GB200 parts are faster (BF16 2.5 PFLOPS dense).
_B200_RATES = _rates(75, 1125, 2250, 2250, 4500)
# GeForce: tensor math with FP32 accumulation runs at half the FP16-accumulate rate.
_RTX3090 = _rates(35.6, 35.6, 71, 71)
_RTX4090 = _rates(82.6, 82.6, 165.2, 165.2, 330.3)
# NB (unsure): no NVIDIA datasheet in hand for the TITAN RTX; its launch figures as Tom's Hardware printed them
# (2018-12-03, "Nvidia Titan RTX specs, pricing": 16.3 TFLOPS FP32, 130 Tensor TFLOPS, 24GB GDDR6, 672 GB/s).
# Turing has no bf16.
_TITAN_RTX = _rates(16.3, fp16=130)
_TITAN_RTX_SHEET = "NVIDIA TITAN RTX launch figures (Tom's Hardware, 2018-12-03; see NB in tracer.devices)"
# per GCD (one torch device): half the module's FP32 matrix 95.7 (vector 47.9), BF16/FP16 383
_MI250X = _rates(47.85, bf16=191.5, fp16=191.5)
_MI300X = _rates(163.4, 653.7, 1307.4, 1307.4, 2614.9)  # FP32 matrix (vector: 81.7)

# Memory, bandwidth and links --------------------------------------------------------------
_PCIE4 = "32 GB/s each way (PCIe Gen4 x16: 64 GB/s both ways)"
_PCIE4_SPEC = (
    "PCI Express Base Specification 4.0: x16 at 16 GT/s, " + _PCIE4 + " as NVIDIA's datasheets round it; "
    "the GeForce boards have no NVLink switch"
)
_NO_SYSTEM = "not published: no reference system gives this board a network port per GPU"
_T4_SHEET = "NVIDIA T4 datasheet: 16 GB GDDR6, x16 PCIe Gen3 32 GB/s (both ways)"
_V100_SHEET = "NVIDIA Tesla V100 datasheet: 16 or 32 GB HBM2; NVLink 300 GB/s (SXM2), PCIe 32 GB/s (PCIe), both ways"
_V100_BW = "NVIDIA Tesla V100 datasheet: 900 GB/s HBM2"
# NB (unsure): DGX-1 (V100) lists "4X IB EDR" for its eight GPUs; shared by two GPUs each.
_DGX1 = "NVIDIA DGX-1 datasheet: 4x 100Gb/s EDR InfiniBand for 8 GPUs, one port per two GPUs: 6.25 GB/s per GPU"
_A10G_SHEET = "AWS A10G (G5 instances; no NVIDIA datasheet): 24 GB GDDR6, the A10's memory"
_A10G_LINKS = "not published: AWS gives no link or per-GPU network bandwidth for the A10G (G5 sizes differ)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (40GB or 80GB HBM2e; SXM NVLink 600GB/s)"
_A100_PCIE = "NVIDIA A100 Tensor Core GPU datasheet (PCIe: 40GB or 80GB HBM2e, PCIe Gen4 64GB/s)"
_NV_A100_BW = "NVIDIA A100 Tensor Core GPU datasheet (40GB: 1,555 GB/s; 80GB SXM: 2,039 GB/s; 80GB PCIe: 1,935 GB/s)"
_DGX_A100 = "NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6 200Gb/s HDR InfiniBand, one per GPU"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM: 80GB HBM3, NVLink 900GB/s; PCIe: 80GB, PCIe Gen5 128GB/s)"
_H100_NVL_SHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet (NVL: 94GB HBM3, NVLink bridge 600GB/s to its pair, PCIe Gen5 128GB/s)"
)
_NV_H100_BW = "NVIDIA H100 Tensor Core GPU datasheet (SXM 3.35 TB/s, PCIe 2 TB/s, NVL 3.9 TB/s)"
_DGX_H100 = "NVIDIA DGX H100 datasheet: 8x single-port ConnectX-7 VPI, 400Gb/s InfiniBand/Ethernet, one per GPU"
# NB (assumed): the H100 SXM with 96GB HBM2e at a 500 W power limit (Meta's Grand Teton hosts, torchtitan's
# 2025 runs) has no datasheet; torchtitan gives its memory, bandwidth and network, and says its peak lies
# "between SXM and NVL" and is not known: the SXM's dense peaks are kept, an upper bound
_TT_GRAND_TETON = (
    "torchtitan docs/performance.md (github.com/pytorch/torchtitan, 2025 version): Grand Teton hosts, 8 H100 "
    "fully connected with NVLink, each with 96GB HBM2e at 2.4 TB/sec, 400 Gb/s RDMA per GPU, 500W power limit"
)
_H100_96GB_PEAKS = (
    "assumed: the H100 SXM's dense peaks (" + _NV_H100 + "); torchtitan docs/performance.md (2025 version) "
    "says the peak of its 500W HBM2e H100 is between SXM and NVL and not known, and uses the SXM's"
)
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141GB HBM3e, NVLink 900GB/s)"
_DGX_H200 = "NVIDIA DGX H200 datasheet: 8x ConnectX-7 400Gb/s per GPU, as DGX H100"
_B200 = "NVIDIA HGX B200 datasheet: 1,440GB of HBM3e for 8 GPUs (180GB each), NVLink 5 1.8TB/s per GPU"
_DGX_B200 = "NVIDIA DGX B200 datasheet: 8x single-port ConnectX-7 400Gb/s, one per GPU"
_AMD_MI250X_BW = "AMD Instinct MI250X datasheet: 3.2 TB/s (3,276.8 GB/s) per module of two GCDs; halved per GCD"
_MI250X_LINKS = (
    "not one figure: the GCDs of an MI250X node link to each other over 1 to 4 Infinity Fabric links, "
    "by pair (AMD CDNA 2 whitepaper)"
)
_MI300X_SHEET = (
    "AMD Instinct MI300X datasheet: 192 GB HBM3; 7 Infinity Fabric links to the platform's other GPUs, "
    "128 GB/s each (both ways)"
)


def _device(
    name,
    family,
    peaks,
    peaks_source,
    memory,
    memory_source,
    bandwidth,
    bandwidth_source,
    link,
    intra,
    intra_source,
    nic=None,
    nic_source=_NO_SYSTEM,
    units=None,
):
    return Device(
        name,
        family,
        peaks,
        peaks_source,
        units,
        memory,
        memory_source,
        bandwidth,
        bandwidth_source,
        link,
        intra,
        intra_source,
        nic,
        nic_source,
    )


def _v100(name, family, peaks, memory, intra, intra_source, nic=None, nic_source=_NO_SYSTEM):
    link = "NVLink" if "SXM2" in name else "PCIe"
    return _device(
        name,
        family,
        peaks,
        _NV_V100,
        memory * GiB,
        _V100_SHEET,
        900 * G,
        _V100_BW,
        link,
        intra,
        intra_source,
        nic,
        nic_source,
    )


def _a100(name, memory, bandwidth):
    if "PCIe" in name:
        return _device(
            name,
            "A100",
            _A100_RATES,
            _NV_A100,
            memory * GiB,
            _A100_PCIE,
            bandwidth * G,
            _NV_A100_BW,
            "PCIe",
            32 * G,
            _A100_PCIE + ": " + _PCIE4,
            units=108,
        )
    return _device(
        name,
        "A100",
        _A100_RATES,
        _NV_A100,
        memory * GiB,
        _A100,
        bandwidth * G,
        _NV_A100_BW,
        "NVLink",
        300 * G,
        _A100 + ": 300 GB/s each way",
        25 * G,
        _DGX_A100,
        units=108,
    )


DEVICES = (
    _device("T4", "T4", _T4, _NV_T4, 16 * GiB, _T4_SHEET, 320 * G, "NVIDIA T4 datasheet: 320+ GB/s GDDR6", "PCIe",
            16 * G, _T4_SHEET + ": 16 GB/s each way"),
    _v100("V100 SXM2 16GB", "V100 SXM2", _V100_SXM2, 16, 150 * G, _V100_SHEET + ": 150 GB/s each way", 6.25 * G, _DGX1),
    _v100("V100 SXM2 32GB", "V100 SXM2", _V100_SXM2, 32, 150 * G, _V100_SHEET + ": 150 GB/s each way", 6.25 * G, _DGX1),
    _v100("V100 PCIe 16GB", "V100 PCIe", _V100_PCIE, 16, 16 * G, _V100_SHEET + ": 16 GB/s each way"),
    _v100("V100 PCIe 32GB", "V100 PCIe", _V100_PCIE, 32, 16 * G, _V100_SHEET + ": 16 GB/s each way"),
    _device("A10", "A10", _A10, _NV_A10, 24 * GiB, "NVIDIA A10 datasheet: 24 GB GDDR6", 600 * G,
            "NVIDIA A10 datasheet: 600 GB/s GDDR6", "PCIe", 32 * G, "NVIDIA A10 datasheet: " + _PCIE4),
    _device("A10G", "A10G", _A10G_RATES, _A10G, 24 * GiB, _A10G_SHEET, 600 * G,
            "AWS A10G (G5 instances; no NVIDIA datasheet): 600 GB/s, the A10's memory", "PCIe", None, _A10G_LINKS,
            None, _A10G_LINKS),
    _a100("A100 40GB SXM", 40, 1555),
    _a100("A100 80GB SXM", 80, 2039),
    _a100("A100 40GB PCIe", 40, 1555),
    _a100("A100 80GB PCIe", 80, 1935),
    _device("L4", "L4", _L4, _NV_L4, 24 * GiB, "NVIDIA L4 datasheet: 24 GB GDDR6", 300 * G,
            "NVIDIA L4 datasheet: 300 GB/s GDDR6", "PCIe", 32 * G, "NVIDIA L4 datasheet: " + _PCIE4),
    _device("L40S", "L40S", _L40S, _NV_L40S, 48 * GiB, "NVIDIA L40S datasheet: 48 GB GDDR6", 864 * G,
            "NVIDIA L40S datasheet: 864 GB/s GDDR6", "PCIe", 32 * G, "NVIDIA L40S datasheet: " + _PCIE4),
    _device("H100 SXM", "H100 SXM", _H100_SXM, _NV_H100, 80 * GiB, _H100, 3350 * G, _NV_H100_BW, "NVLink",
            450 * G, _H100 + ": 450 GB/s each way", 50 * G, _DGX_H100, units=132),
    _device("H100 SXM 96GB", "H100 SXM 96GB", _H100_SXM, _H100_96GB_PEAKS, 96 * GiB, _TT_GRAND_TETON, 2400 * G,
            _TT_GRAND_TETON, "NVLink", 450 * G, "assumed as the H100 SXM's (" + _H100 + ": 450 GB/s each way); "
            + _TT_GRAND_TETON + " (no NVLink figure)", 50 * G, _TT_GRAND_TETON + ": 400 Gb/s = 50 GB/s each way",
            units=132),  # NB: assumed peaks and NVLink, see _H100_96GB_PEAKS
    _device("H100 PCIe", "H100 PCIe", _H100_PCIE, _NV_H100, 80 * GiB, _H100, 2000 * G, _NV_H100_BW, "PCIe",
            64 * G, _H100 + ": PCIe Gen5 64 GB/s each way",
            50 * G, "assumed as DGX H100 (no DGX of PCIe parts): " + _DGX_H100, units=114),  # NB: assumed
    # per GPU, as the later datasheet gives it; the NVLink bridge joins a pair only, so a node's GPUs meet over PCIe
    _device("H100 NVL", "H100 NVL", _H100_NVL, _NV_H100, 94 * GiB, _H100_NVL_SHEET, 3900 * G, _NV_H100_BW, "PCIe",
            64 * G, _H100_NVL_SHEET + ": PCIe Gen5 64 GB/s each way", units=132),
    _device("H200", "H200", _H200_RATES, _NV_H200, 141 * GiB, _H200, 4800 * G,
            "NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s HBM3e (SXM)", "NVLink",
            450 * G, _H200 + ": 450 GB/s each way", 50 * G, _DGX_H200, units=132),
    _device("B200", "B200", _B200_RATES, _NV_B200, 180 * GiB, _B200, 8000 * G,
            "NVIDIA HGX B200 datasheet: 64 TB/s for 8 GPUs, 8 TB/s per GPU", "NVLink",
            900 * G, _B200 + ": 900 GB/s each way", 50 * G, _DGX_B200, units=148),
    _device("RTX 3090", "RTX 3090", _RTX3090, _NV_GA102, 24 * GiB,
            "NVIDIA Ampere GA102 GPU Architecture whitepaper: 24 GB GDDR6X (RTX 3090)", 936 * G,
            "NVIDIA Ampere GA102 GPU Architecture whitepaper: 936 GB/s GDDR6X (RTX 3090)", "PCIe", 32 * G, _PCIE4_SPEC),
    _device("RTX 4090", "RTX 4090", _RTX4090, _NV_AD102, 24 * GiB,
            "NVIDIA Ada GPU Architecture whitepaper: 24 GB GDDR6X (RTX 4090)", 1008 * G,
            "NVIDIA Ada GPU Architecture whitepaper: 1,008 GB/s GDDR6X (RTX 4090)", "PCIe", 32 * G, _PCIE4_SPEC),
    _device("TITAN RTX", "TITAN RTX", _TITAN_RTX, _TITAN_RTX_SHEET, 24 * GiB, _TITAN_RTX_SHEET + ": 24GB GDDR6",
            672 * G, _TITAN_RTX_SHEET + ": 672 GB/s", "PCIe", 16 * G,
            "assumed: PCIe Gen3 x16, 16 GB/s each way (Turing's host interface; the launch figures print no link)",
            None, "not in the launch figures: no network"),
    # PyTorch sees each of an MI250X's two GCDs as a device, with half the module's memory and bandwidth.
    _device("MI250X", "MI250X", _MI250X, _AMD_MI250X, 64 * GiB,
            "AMD Instinct MI250X datasheet: 128 GB HBM2e per module of two GCDs; halved per GCD", 1638.4 * G,
            _AMD_MI250X_BW, "xGMI", None, _MI250X_LINKS, units=110),  # 110 CUs per GCD (220 per module)
    _device("MI300X", "MI300X", _MI300X, _AMD_MI300X, 192 * GiB, _MI300X_SHEET, 5300 * G,
            "AMD Instinct MI300X datasheet: 5.3 TB/s HBM3", "xGMI",
            448 * G, _MI300X_SHEET + ": 7 x 64 = 448 GB/s each way",
            units=304),
)  # fmt: skip

# (family, tokens that must all appear, tokens that must not appear), tried in order
_RULES = (
    ("H100 NVL", {"H100", "NVL"}, set()),
    ("H100 PCIe", {"H100", "PCIE"}, set()),
    ("H100 SXM 96GB", {"H100", "96GB"}, {"NVL", "PCIE"}),  # the 500 W HBM2e part, if torch names its size
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
    ("TITAN RTX", {"TITAN", "RTX"}, set()),
    ("RTX 3090", {"RTX", "3090"}, {"TI", "LAPTOP", "MOBILE"}),
    ("RTX 4090", {"RTX", "4090"}, {"D", "LAPTOP", "MOBILE"}),
    ("MI250X", {"MI250X"}, set()),
    ("MI300X", {"MI300X"}, set()),
)


def tokens(name):
    """The set of whole upper-cased tokens of a name: "NVIDIA A100-SXM4-80GB" -> {NVIDIA, A100, SXM4, 80GB}."""
    return set(re.split(r"[^A-Z0-9]+", str(name).upper())) - {""}


def family(name):
    """The family (tracer.peaks.PEAKS key) of a device name (torch.cuda.get_device_name), or None."""
    if not isinstance(name, str):
        return None
    found = tokens(name)
    return next((key for key, need, forbid in _RULES if need <= found and not forbid & found), None)


def by_family(key):
    """The records of a family, in catalogue order."""
    return [d for d in DEVICES if d.family == key]


def _size(device):
    """The size token of a record's name ("80GB" of "A100 80GB SXM"), or None."""
    return next((t for t in tokens(device.name) if re.fullmatch(r"[0-9]+GB", t)), None)


def candidates(name, memory_bytes=None, form_implied=True):
    """The records a device name (and the memory torch reports, if known) can be: one, several, or none.
    `form_implied`: a name without PCIE is an SXM board's, as torch names them ("NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe"); False for a person's name, where "A100 80GB" may be either."""
    found = by_family(family(name))
    if len(found) > 1:
        words = tokens(name)
        if form_implied or "PCIE" in words or any(w.startswith("SXM") for w in words):
            found = [d for d in found if (d.link == "PCIe") == ("PCIE" in words)] or found
        sized = [d for d in found if _size(d) in words]
        if sized:
            found = sized
        elif isinstance(memory_bytes, (int, float)) and not isinstance(memory_bytes, bool) and len(found) > 1:
            found = [min(found, key=lambda d: abs(d.memory_bytes - memory_bytes))]
    return found


def find(name, memory_bytes=None):
    """The one record a device name (and its memory) names, or None when none or several fit."""
    found = candidates(name, memory_bytes)
    return found[0] if len(found) == 1 else None


def _key(name):
    return " ".join(str(name).upper().replace("-", " ").replace("_", " ").split())


def named(text):
    """The records a user's name for a device can be (`--gpu`): its catalogue name, case, "-" and "_" ignored
    ("h100-sxm"); else a device name as torch gives it ("H100", "NVIDIA A100-SXM4-80GB"; "A100 80GB" names both
    forms); else the records whose names hold every token of it ("RTX": RTX 3090 and RTX 4090). One record,
    several (ambiguous), or []."""
    exact = [d for d in DEVICES if _key(d.name) == _key(text)]
    if exact:
        return exact
    found = candidates(text, form_implied=False)
    if found:
        return found
    words = tokens(text)
    return [d for d in DEVICES if words and words <= tokens(d.name)]
