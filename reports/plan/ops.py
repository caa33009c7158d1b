"""Each op of a traced rank priced on the target device, as the roofline says.

  compute time  flops / (peak x efficiency): matmuls and convolutions at the dense peak of
                their dtype x matmul_efficiency, fused attention at that peak x
                attention_efficiency, every other op's FLOPs at the float32 (vector) peak x
                vector_efficiency. A dtype without a peak in the table (float64, integers)
                is priced at the float32 peak, and the plan says so.
  memory time   (bytes_read + bytes_written) / (HBM bandwidth x memory_efficiency); views
                move nothing
  causal        a causal attention kernel (the `causal` column) skips the masked half of the
                scores, while its FLOPs count the whole matrix (as PaLM and FlopCounterMode
                do): it is priced at half its FLOPs, as FlashAttention's benchmarks count it
  op time       max(compute time, memory time, flops / peak) + launch_s for every op that
                does work: the roofline's bound, never faster than the counted FLOPs at the
                peak (so MFU <= 1), plus a fixed cost per kernel. Views, metadata ops and
                collectives (priced in comm.py) cost nothing here.

The classes (CLASSES) are the efficiencies: `bound` names the one that set an op's time.
Calibration: on the device the trace ran on, with real op times, each class's efficiency
is measured instead: the time its ops would take at the roof (efficiency 1) over the time
they took (capped at 1: a roof that was beaten, by caches on a CPU say, is kept as the
roof), and the launch cost is 0 (measured times include it).

A micro-batch k times the traced one scales the FLOPs and bytes of forward and backward
ops by k (what they compute grows with the tokens); optimizer and other ops keep theirs.
"""

import numpy as np
import pandas as pd

from reports.flops.peaks import normalize_dtype
from reports.tables import row_dtype_codes

__all__ = ["CLASSES", "calibrate", "price"]

CLASSES = ("matmul", "attention", "vector", "memory")
_MATMUL = ("matmul", "conv")


def _dtypes(rows):
    codes, words = row_dtype_codes(rows)
    return np.asarray([normalize_dtype(w) if w else "" for w in words], dtype=object)[codes]


class Priced(dict):
    """Per-row arrays of one run: ideal (efficiency 1) compute and memory seconds, the class
    that bounds each op, whether it is a kernel, plus the notes about peaks used."""


def roofs(rows, peak_of, bandwidth, k=1.0):
    """Per-row ideal times at efficiency 1. `peak_of(dtype)` gives FLOP/s or None."""
    kinds = rows["flop_kind"].astype(object).to_numpy()
    is_comm = rows["comm_bytes"].notna().to_numpy()
    view = rows["is_view"].to_numpy(dtype=bool)
    flops = rows["flops"].to_numpy(dtype=np.float64).copy()
    nbytes = (rows["bytes_read"].to_numpy(np.float64) + rows["bytes_written"].to_numpy(np.float64))
    nbytes[view | is_comm] = 0.0
    flops[is_comm] = 0.0
    scaled = rows["phase"].isin(("forward", "backward")).to_numpy()
    flops[scaled] *= k
    nbytes[scaled] *= k
    dtypes = _dtypes(rows)
    fp32, notes = peak_of("float32"), []
    tensor_peak = {}
    for d in pd.unique(dtypes[np.isin(kinds, _MATMUL + ("attention",))]):
        p = peak_of(d) if d else None
        if p is None:
            notes.append(f"no dense {d or 'unknown'} peak on the target: its matmuls are priced at the float32 peak")
            p = fp32
        tensor_peak[d] = p
    tensor = np.isin(kinds, _MATMUL + ("attention",))
    peak = np.full(len(rows), fp32 if fp32 else np.nan, dtype=np.float64)
    for d, p in tensor_peak.items():
        peak[tensor & (dtypes == d)] = p
    klass = np.where(np.isin(kinds, _MATMUL), 0, np.where(kinds == "attention", 1, 2))
    causal = (kinds == "attention") & rows["causal"].fillna(False).to_numpy(dtype=bool)
    floor = np.where(flops > 0, flops / peak, 0.0)
    compute = np.where(causal, floor / 2, floor)
    memory = nbytes / bandwidth
    kernel = ~view & ~is_comm & ((flops > 0) | (nbytes > 0))
    return Priced(compute=compute, floor=floor, memory=memory, klass=klass, kernel=kernel, flops=flops, peak=peak,
                  tensor_peak=tensor_peak, notes=notes)


def price(p, eff, launch_s):
    """Per-row op seconds and bound class index (into CLASSES) for efficiencies {class: e}."""
    compute = p["compute"] / np.array([eff["matmul"], eff["attention"], eff["vector"]])[p["klass"]]
    memory = p["memory"] / eff["memory"]
    bound = np.where((compute >= memory) & (p["compute"] > 0), p["klass"], 3)
    seconds = np.where(p["kernel"], np.maximum(np.maximum(compute, memory), p["floor"]) + launch_s, 0.0)
    return seconds, bound


def calibrate(p, measured_s, eff):
    """{class: (efficiency, source)} measured from the trace's op times: ideal over measured, per class."""
    _, bound = price(p, eff, 0.0)
    ideal = np.maximum(p["compute"], p["memory"])
    out = {}
    for c, name in enumerate(CLASSES):
        pick = p["kernel"] & (bound == c) & (measured_s > 0)
        spent = float(measured_s[pick].sum())
        if not pick.any() or spent <= 0:
            out[name] = (eff[name], f"assumed (no {name}-bound op with a time in the trace)")
            continue
        value = float(ideal[pick].sum()) / spent
        source = f"measured on the traced step: {int(pick.sum())} {name}-bound ops, their roof time over their op time"
        if value > 1:
            source += f" ({value:.3g}, above the roof: capped at 1)"
            value = 1.0
        out[name] = (value, source)
    return out
