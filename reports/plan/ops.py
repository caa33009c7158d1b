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
  op time       max(compute time, memory time, performed flops / peak) + launch_s for every
                op that does work: the roofline's bound, never faster than the FLOPs it
                performs (a causal kernel's: half its counted FLOPs) at the peak, plus a fixed
                cost per kernel. Views, metadata ops and collectives (priced in comm.py) cost
                nothing here.

The classes (CLASSES) are the efficiencies: `bound` names the one that set an op's time.
On a target with tables (reports.plan.efficiency: an A100 or a Hopper), a bf16/fp16 matmul's
efficiency is its shape's (m, n, k) from a published GEMM sweep x matmul_stack, and a fused
attention kernel's is its kernel's on that generation x attention_stack (`shaped`, per row;
the k of a matmul planned at k times the traced micro-batch grows with its FLOPs); other
rows, and every row where the class's efficiency is given, take the class's flat figure.
Calibration: on the device the trace ran on, with real op times, each class's efficiency
is measured instead: the time its ops would take at the roof (efficiency 1) over the time
they took (capped at 1: a roof that was beaten, by caches on a CPU say, is kept as the
roof), and the launch cost is 0 (measured times include it); rows with a table's
efficiency scale their stack factor by their predicted time over their measured time.

A micro-batch k times the traced one scales the FLOPs of forward and backward ops by k
(what they compute grows with the tokens), and of their bytes those of the storages that
grow with the tokens (activations, temporaries, inputs: fit.py's SCALED); the bytes of
inputs and outputs whose storages stay (`fixed_bytes`: parameters, unsharded parameters,
gradients, optimizer state, communication buffers, as the memory model categorises them)
are moved once whatever the micro-batch: a Linear reads its weight once for 1 or 64
sequences; so are those of a copy of parameters (autocast's bf16 weight: `parameter_copies`). Optimizer and other ops keep theirs. As in the memory model, FSDP2's unsharded
gradients before the reduce-scatter are temporaries, so their bytes scale (an
overestimate), and a tensor-parallel all-reduce's output is a communication buffer, so the
reads of it stay (an underestimate). Llama-3-8B under FSDP2 traced at 1 and planned at 4:
memory-bound 0.907 s, against 0.892 s planned from a trace at 4 (1.130 s scaling every byte).
"""

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import ONE_TO_ONE_COPIES, packet, unique
from reports.arrays import numpy_of, objects_of
from reports.flops.peaks import normalize_dtype
from reports.memory.lifetimes import dtype_sizes
from reports.memory.resizes import COLLECTIVE_PREFIXES
from reports.plan import efficiency as tables

__all__ = ["CLASSES", "STACKS", "calibrate", "fixed_bytes", "fixed_storages", "price", "shaped_efficiency"]

CLASSES = ("matmul", "attention", "vector", "memory")
STACKS = {0: "matmul_stack", 1: "attention_stack"}  # class index -> the stack factor on its table
_MATMUL = ("matmul", "conv")


def _first_items(column):
    """Per cell of a ListArray of strings, its first item ('' for an empty or null list, or a null item)."""
    out = np.full(len(column), "", dtype=object)
    if pa.types.is_null(column.type) or not len(column):
        return out
    first = pc.list_slice(column, 0, 1)
    items = pc.list_flatten(first)
    if pa.types.is_dictionary(items.type):
        items = items.cast(items.type.value_type)
    found = objects_of(items)
    found[found == None] = ""  # noqa: E711
    out[numpy_of(pc.list_parent_indices(first))] = found
    return out


def _dtypes(rows):
    """Per row, the normalized dtype of its first tensor input, else of its first output ('' with neither)."""
    words = _first_items(rows.lists("input_dtypes"))
    bare = np.flatnonzero(words == "")  # no tensor input (factories): the outputs of these rows
    if len(bare):
        words[bare] = _first_items(rows.lists("output_dtypes", at=bare))
    names = {w: normalize_dtype(w) if w else "" for w in dict.fromkeys(words.tolist())}
    return np.asarray([names[w] for w in words.tolist()], dtype=object)


def _collective_storages(rows, in_rows, in_ids, out_rows, out_ids):
    """Ids of the storages a collective row (its op one of COLLECTIVE_PREFIXES') read or wrote."""
    op = rows.labels("op")
    hit = np.asarray([w.startswith(COLLECTIVE_PREFIXES) for w in op.words] + [False], dtype=bool)
    collective = hit[op.codes]  # a null's -1: the last, False
    if not collective.any():
        return np.zeros(0, dtype=np.int64)
    return unique(np.concatenate([in_ids[collective[in_rows]], out_ids[collective[out_rows]]]))


class Priced(dict):
    """Per-row arrays of one run: ideal (efficiency 1) compute and memory seconds, the class
    that bounds each op, whether it is a kernel, plus the notes about peaks used."""


def _explode(rows, name):
    """A list column of ids as (the row of each id, the ids), a null cell holding none."""
    offsets, values = rows.flat(name)
    return np.repeat(np.arange(len(rows)), np.diff(offsets)), values


def _fixed_ids(rows, meta, ins, outs):
    """Ids of the storages whose size does not grow with the micro-batch (module docstring)."""
    roles = meta.get("storage_roles") or {}
    ids = [
        p.get("storage_id") for key in ("parameters", "unsharded_parameters") for p in (meta.get(key) or {}).values()
    ]
    ids += [i for role in ("gradient", "optimizer_state", "external_parameter") for i in roles.get(role) or ()]
    known = np.asarray([int(i) for i in ids if i is not None], dtype=np.int64)
    copies = _copies_of_parameters(rows, meta, ins, outs)
    return np.union1d(np.union1d(known, copies), _collective_storages(rows, *ins, *outs))


def _copies_of_parameters(rows, meta, ins, outs):
    """Ids of the storages a copy of parameters made (`parameter_copies`)."""
    copy = parameter_copies(rows, meta)
    if not copy.any():
        return np.zeros(0, dtype=np.int64)
    made = copy[outs[0]] & ~np.isin(outs[1], ins[1][copy[ins[0]]])
    return unique(outs[1][made])


def parameter_copies(rows, meta):
    """bool per row of `rows` (reports.plan.rows.PlanRows): a one-to-one copy (reports._util.ONE_TO_ONE_COPIES) of the
    model's parameters alone (FSDP2's unsharded ones included): autocast's copy of a weight in bf16 (`aten._to_copy`,
    saved for the backward; of a transposed view of it too), a parameter's size whatever the micro-batch. A parameter
    repeated over the batch (DETR's `query.unsqueeze(1).repeat(1, B, 1)`) is no copy of it: it grows. One level: a
    copy of such a copy is no parameter's, and grows."""
    ids = [
        p["storage_id"]
        for key in ("parameters", "unsharded_parameters")
        for p in (meta.get(key) or {}).values()
        if isinstance(p.get("storage_id"), int)
    ]
    if not ids or not len(rows) or "input_storage_ids" not in rows:
        return np.zeros(len(rows), dtype=bool)
    offsets, read_ids = rows.flat("input_storage_ids")
    read = np.diff(offsets)
    of_params = np.bincount(np.repeat(np.arange(len(read)), read)[np.isin(read_ids, ids)], minlength=len(read))
    return (read > 0) & (of_params == read) & rows.labels("op").map(packet).isin(ONE_TO_ONE_COPIES)


def fixed_storages(rows, meta):
    """Ids (int64 array) of the storages whose size does not grow with the micro-batch."""
    return _fixed_ids(rows, meta, _explode(rows, "input_storage_ids"), _explode(rows, "output_storage_ids"))


def fixed_bytes(rows, meta):
    """Per row, float64: the bytes read and written of tensors whose storages stay fixed as the
    micro-batch grows (inputs read; outputs written: fresh ones, or any of an in-place op)."""
    out = np.zeros(len(rows))
    ins, outs = _explode(rows, "input_storage_ids"), _explode(rows, "output_storage_ids")
    fixed = _fixed_ids(rows, meta, ins, outs)
    touched = np.union1d(ins[0][np.isin(ins[1], fixed)], outs[0][np.isin(outs[1], fixed)])
    if not len(touched):
        return out
    size, fixed = dtype_sizes(meta), set(fixed.tolist())
    cells = [
        rows.cell_objects(c, touched)
        for c in (
            "input_storage_ids",
            "input_shapes",
            "input_dtypes",
            "output_storage_ids",
            "output_shapes",
            "output_dtypes",
        )
    ]
    inplace = rows.flag("inplace")[touched]
    for j, (i_ids, i_shapes, i_dtypes, o_ids, o_shapes, o_dtypes) in enumerate(zip(*cells)):
        i_ids = [] if i_ids is None else [int(s) for s in i_ids]
        read = sum(math.prod(s) * size.get(d, 0) for sid, s, d in zip(i_ids, i_shapes, i_dtypes) if sid in fixed)
        written = sum(
            math.prod(s) * size.get(d, 0)
            for sid, s, d in zip(o_ids if o_ids is not None else (), o_shapes, o_dtypes)
            if int(sid) in fixed and (inplace[j] or int(sid) not in i_ids)
        )
        out[touched[j]] = read + written
    return out


def roofs(rows, peak_of, bandwidth, k=1.0, fixed=None, gen=None):
    """Per-row ideal times at efficiency 1. `peak_of(dtype)` gives FLOP/s or None; `fixed`: per
    row, the bytes that stay when the micro-batch is k times the traced one (`fixed_bytes`); `gen`:
    the target's generation with efficiency tables (reports.plan.efficiency), or None."""
    kinds = rows.objects("flop_kind")
    is_comm = rows.valid("comm_bytes")
    view = rows.flag("is_view")
    flops = rows.floats("flops").copy()
    nbytes = rows.floats("bytes_read") + rows.floats("bytes_written")
    nbytes[view | is_comm] = 0.0
    flops[is_comm] = 0.0
    scaled = np.isin(rows.objects("phase"), ("forward", "backward"))
    flops[scaled] *= k
    if k != 1.0:
        stay = np.minimum(fixed if fixed is not None else 0.0, nbytes)
        nbytes[scaled] = stay[scaled] + k * (nbytes[scaled] - stay[scaled])
    dtypes = _dtypes(rows)
    fp32, notes = peak_of("float32"), []
    tensor_peak = {}
    for d in dict.fromkeys(dtypes[np.isin(kinds, _MATMUL + ("attention",))].tolist()):
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
    causal = (kinds == "attention") & rows.flag("causal")
    compute = np.where(flops > 0, flops / peak, 0.0)
    compute[causal] /= 2  # the FLOPs a causal kernel performs: the floor too
    floor = compute
    memory = nbytes / bandwidth
    kernel = ~view & ~is_comm & ((flops > 0) | (nbytes > 0))
    return Priced(
        shaped=shaped_efficiency(rows, gen, dtypes, flops),
        compute=compute,
        floor=floor,
        memory=memory,
        klass=klass,
        kernel=kernel,
        flops=flops,
        peak=peak,
        tensor_peak=tensor_peak,
        notes=notes,
    )


def _row_efficiency(p, eff):
    """Per row, the compute efficiency: the class's flat one, or a table's x the class's stack (module docstring)."""
    flat = np.array([eff["matmul"], eff["attention"], eff["vector"]])[p["klass"]]
    shaped = p.get("shaped")
    if shaped is None:
        return flat
    stack = np.array([eff.get("matmul_stack", 1.0), eff.get("attention_stack", 1.0), 1.0])[p["klass"]]
    return np.where(np.isnan(shaped), flat, shaped * stack)


def price(p, eff, launch_s):
    """Per-row op seconds and bound class index (into CLASSES) for efficiencies {class: e} (and the stack
    factors {"matmul_stack": f, "attention_stack": f} on the rows with a table's efficiency)."""
    compute = p["compute"] / _row_efficiency(p, eff)
    memory = p["memory"] / eff["memory"]
    bound = np.where((compute >= memory) & (p["compute"] > 0), p["klass"], 3)
    seconds = np.where(p["kernel"], np.maximum(np.maximum(compute, memory), p["floor"]) + launch_s, 0.0)
    return seconds, bound


def shaped_efficiency(rows, gen, dtypes=None, flops=None):
    """Per row, float64: a table's efficiency (reports.plan.efficiency) for bf16/fp16 matmuls on `gen` by their
    shape, and for fused attention kernels on `gen` by their kernel; nan elsewhere (and everywhere when `gen` is
    None: the target has no table)."""
    out = np.full(len(rows), np.nan)
    if gen is None or not len(rows):
        return out
    kinds = rows.objects("flop_kind")
    dtypes = _dtypes(rows) if dtypes is None else dtypes
    flops = rows.floats("flops") if flops is None else flops
    half = np.isin(dtypes, ("bfloat16", "float16"))
    pick = np.flatnonzero((kinds == "matmul") & half & (flops > 0))
    if len(pick):
        dims = [tables.matmul_dims(s, f) for s, f in zip(rows.cell_objects("output_shapes", pick), flops[pick])]
        ok = np.array([d is not None for d in dims], dtype=bool)
        if ok.any():
            m, n, k = (np.array([d[i] for d in dims if d is not None], dtype=np.float64) for i in range(3))
            out[pick[ok]] = tables.matmul(m, n, k, gen)
    attn = np.flatnonzero((kinds == "attention") & (flops > 0))
    ops = rows.objects("op")
    for i in attn:
        found = tables.attention(tables.kernel_of(ops[i]), gen)
        if found:
            out[i] = found[0]
    return out


def calibrate(p, measured_s, eff):
    """{assumption name: (value, source)} measured from the trace's op times: per class, ideal over measured (the
    `<class>_efficiency`), and for the rows with a table's efficiency their stack factor (`matmul_stack`,
    `attention_stack`) times their predicted over their measured time."""
    _, bound = price(p, eff, 0.0)
    ideal = np.maximum(p["compute"], p["memory"])
    shaped = p.get("shaped")
    shaped = np.zeros(len(ideal), dtype=bool) if shaped is None else ~np.isnan(shaped)
    predicted = p["compute"] / _row_efficiency(p, eff)
    out = {}
    for c, stack in STACKS.items():
        pick = p["kernel"] & (bound == c) & (measured_s > 0) & shaped
        spent = float(measured_s[pick].sum())
        if pick.any() and spent > 0:
            value = eff.get(stack, 1.0) * float(predicted[pick].sum()) / spent
            source = (
                f"measured: {int(pick.sum())} {CLASSES[c]}-bound ops priced by reports.plan.efficiency's tables, "
                "their predicted time over their op time, times the stack factor"
            )
            low, high = 0.01, 2.0  # reports.plan.assumptions.RANGES
            if not low <= value <= high:
                source += f" ({value:.3g}, outside [{low:g}, {high:g}]: clipped)"
                value = min(max(value, low), high)
            out[stack] = (value, source)
    for c, name in enumerate(CLASSES):
        pick = p["kernel"] & (bound == c) & (measured_s > 0) & ~shaped
        spent = float(measured_s[pick].sum())
        if not pick.any() or spent <= 0:
            out[f"{name}_efficiency"] = (eff[name], f"assumed (no {name}-bound op with a time in the trace)")
            continue
        value = float(ideal[pick].sum()) / spent
        source = f"measured on the traced step: {int(pick.sum())} {name}-bound ops, their roof time over their op time"
        if value > 1:
            source += f" ({value:.3g}, above the roof: capped at 1)"
            value = 1.0
        out[f"{name}_efficiency"] = (value, source)
    return out
