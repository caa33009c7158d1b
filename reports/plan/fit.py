"""Does one rank fit in the device's memory, and what is the largest micro-batch that does?

Peak bytes per rank come from the trace's memory model (reports.memory.lifetimes: every
storage's size, lifetime and category at every op). On the target they need, besides:

  allowances   the CUDA context, NCCL's buffers per process group, and the caching
               allocator's fragmentation as a fraction of the peak (assumptions.py), or
               the trace's own reserved / peak allocated bytes when it ran on a GPU
               (metadata cuda_memory at the end of the trace)

  total(k) = (1 + fragmentation) x max over ops of (fixed_op + k x scaled_op) + context + NCCL

where, at each op, `scaled_op` is the bytes of the categories that grow with the tokens a
rank processes (SCALED: activations, temporaries, inputs) and `fixed_op` the rest
(parameters, unsharded parameters, gradients, optimizer state, communication buffers),
and k is the micro-batch over the traced one. What an optimizer-phase op made counts as
fixed whatever its category: AdamW foreach's temporaries (`_foreach_sqrt` of exp_avg_sq,
...) are the size of the optimizer state, not of the batch; so is a copy made from parameters
alone (autocast's bf16 weight, saved for the backward: `_made_from_parameters`). This is the extrapolation: activation
bytes linear in the micro-batch at a fixed sequence length, everything else fixed; it
holds for ops whose outputs have a batch dimension. It does not hold for a change of
sequence length (attention's memory is not linear in it), of world size (the shards
change) or of the checkpointing policy (what is saved changes): those need a re-trace.
The peak may move to another op as k changes; taking the maximum over every op of the
trace follows it. Optimizer state stays from step to step, so it counts at its largest
size in the trace at every op: a trace of a fresh optimizer's first step (AdamW makes its
state in that opt.step(), after the backward) would otherwise peak without the state that
every later step's forward and backward hold (`optimizer_state_added_bytes` at the peak).

The largest micro-batch b = floor(k_max x traced batch), k_max the largest k with
total(k) <= the device's memory: min over ops with scaled bytes of
(budget - fixed_op) / scaled_op, budget = (memory - context - NCCL) / (1 + fragmentation);
0 when the fixed bytes alone do not fit.
"""

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import numpy_of
from reports.flops.recompute import checkpoint_recompute
from reports.memory.lifetimes import CATEGORIES, Storages, dtype_sizes
from reports.plan.changes import Need, changes
from reports.plan.ops import parameter_copies
from tracer.schema import PHASES, Phase

__all__ = ["SCALED", "fit", "phases_of", "traced_batch"]

SCALED = ("activations", "temporaries", "inputs")
_SHARDED = ("parameters", "gradients", "optimizer_state")  # FSDP's shards: 1 / world size of the model's


_OPTIMIZER = PHASES[Phase.OPTIMIZER]


def _live(n, nbytes, alloc, free, pick):
    """int64 bytes of the picked pieces live after each of n rows (alive from alloc + 1 to free, as timeline counts)."""
    start, end = alloc[pick] + 1, free[pick] + 1
    freed = end > 0
    weights = np.r_[nbytes[pick], -nbytes[pick][freed]].astype(np.float64)
    delta = np.bincount(np.r_[start, end[freed]], weights=weights, minlength=n + 1)[: n + 1]
    return np.rint(delta).astype(np.int64).cumsum()[1:]


def _split(run):
    """Per op of the (one-run) trace: (fixed bytes, scaled bytes, optimizer state added), int64
    arrays, the rows' seq and phase, and the parts reports.plan.changes prices (`activations`: the
    scaled bytes of that category; `sharded`: the fixed bytes of parameters, gradients and optimizer
    state, what an optimizer-phase op made included; `fsdp`: whether the trace holds unsharded
    parameters; `checkpointed`: whether it recomputes ops for activation checkpointing); the optimizer state at its largest at every op, and what an optimizer-phase op made
    fixed (module docstring)."""
    rows = run.memory()  # the run's rows in seq order (reports.memory.run_rows.RunRows)
    n, phase = len(rows), phases_of(rows)
    nbytes, alloc, free, cat = Storages(run.name, run.meta, rows).live_pieces()
    by_optimizer = (alloc >= 0) & (phase[np.maximum(alloc, 0)] == _OPTIMIZER)
    grows = np.isin(cat, [CATEGORIES.index(c) for c in SCALED]) & ~by_optimizer
    grows &= ~_made_from_parameters(alloc, rows, run, grows)
    scaled = _live(n, nbytes, alloc, free, grows)
    fixed = _live(n, nbytes, alloc, free, ~grows)
    state = _live(n, nbytes, alloc, free, cat == CATEGORIES.index("optimizer_state"))
    added = state.max() - state if n else state
    shards = np.isin(cat, [CATEGORIES.index(c) for c in _SHARDED]) | by_optimizer
    parts = {
        "activations": _live(n, nbytes, alloc, free, grows & (cat == CATEGORIES.index("activations"))),
        "parameter_sized": _live(n, nbytes, alloc, free, grows & _parameter_sized(nbytes, alloc, phase, rows, run)),
        "sharded": _live(n, nbytes, alloc, free, shards & ~grows) + added,
        "fsdp": bool((cat == CATEGORIES.index("unsharded_parameters")).any()),
        "checkpointed": bool(checkpoint_recompute(run.rows).any()),
    }
    return fixed + added, scaled, added, rows.seq, phase, parts


def _made_from_parameters(alloc, rows, run, pick):
    """bool per piece: one of the `pick`ed pieces made by a copy of parameters (reports.plan.ops.parameter_copies:
    autocast's bf16 weight, saved for the backward, an activation that keeps a parameter's size whatever the
    micro-batch). `rows`: the memory rows (seq order), matched by seq to the run's
    PlanRows."""
    out = np.zeros(len(alloc), dtype=bool)
    candidate = pick & (alloc >= 0)
    if not candidate.any():
        return out
    copy = parameter_copies(run.rows, run.meta)
    if not copy.any():
        return out
    seq = run.rows.ints("seq")
    order = np.argsort(seq, kind="stable")
    at = np.minimum(np.searchsorted(seq[order], rows.seq[alloc[candidate]]), len(seq) - 1)
    out[candidate] = copy[order[at]] & (seq[order[at]] == rows.seq[alloc[candidate]])
    return out


def _parameter_sized(nbytes, alloc, phase, rows, run):
    """bool per piece: made by a backward op at a parameter's numel times the itemsize of a dtype the op wrote. A
    weight's gradient is computed at its parameter's shape before autograd sums it (a tied embedding and head: two) or
    FSDP reduces it, whatever the micro-batch (under autocast first in bf16, an mm's output, then copied to the
    parameter's dtype); such a temporary is counted as growing with the micro-batch (the batch dimension it was
    contracted over is not in the trace), so the largest micro-batch is a lower bound where they are live at its op
    (`fit`'s `max_micro_batch_if_fixed`). An activation's gradient of the same size (tokens x width = a square
    weight's width x width) is caught too: the note says "up to". `rows`: the memory rows (seq order), matched by
    seq to the run's PlanRows for the dtypes the op wrote."""
    itemsize, meta = dtype_sizes(run.meta), run.meta
    numels = {
        int(p["numel"])
        for key in ("parameters", "unsharded_parameters")  # FSDP2: the gradient is the unsharded parameter's size
        for p in (meta.get(key) or {}).values()
        if isinstance(p.get("numel"), int)
    } - {0}
    out = np.zeros(len(nbytes), dtype=bool)
    if not numels or not len(nbytes):
        return out
    made = alloc >= 0
    backward = np.zeros(len(nbytes), dtype=bool)
    backward[made] = phase[alloc[made]] == PHASES[Phase.BACKWARD]
    sizes = np.asarray(sorted({n * s for n in numels for s in set(itemsize.values())} - {0}), dtype=np.int64)
    picked = np.flatnonzero(backward & np.isin(nbytes, sizes))  # a parameter's numel at some itemsize
    if not len(picked) or "output_dtypes" not in run.rows:
        return out
    seq = run.rows.ints("seq")
    order = np.argsort(seq, kind="stable")
    at = order[np.minimum(np.searchsorted(seq[order], rows.seq[alloc[picked]]), len(seq) - 1)]
    found = seq[at] == rows.seq[alloc[picked]]
    lists = run.rows.lists("output_dtypes", pa.string(), at=at)  # each picked piece's op's output dtypes
    words = pc.dictionary_encode(pc.list_flatten(lists))
    if not len(words):
        return out
    size = np.asarray([itemsize.get(w, 0) for w in words.dictionary.to_pylist()] or [0], dtype=np.int64)
    size = np.where(numpy_of(words.indices.is_valid()), size[numpy_of(words.indices, null=0)], 0)
    piece = numpy_of(pc.list_parent_indices(lists))  # the picked piece of each dtype written
    whole = (size > 0) & (nbytes[picked][piece] % np.maximum(size, 1) == 0)
    sized = whole & np.isin(nbytes[picked][piece] // np.maximum(size, 1), np.fromiter(numels, np.int64, len(numels)))
    out[picked] = found & (np.bincount(piece[sized], minlength=len(picked)) > 0)
    return out


def phases_of(rows):
    """Each row's phase (an object array, None for none) of a reports.memory.run_rows.RunRows."""
    return np.asarray([*rows.phases, None], dtype=object)[rows.phase]


def traced_batch(rows, meta):
    """(sequences per rank in the trace, how it was found): the leading size of the indices of a
    forward embedding whose indices have a batch dimension (2-d or more: a position embedding's
    wpe(arange(S)) has none), the first whose indices hold the metadata's `tokens` (batch x
    sequence = tokens) if one does, else the first; without one, the leading size of the first
    input of the first forward op that reads no parameter first (a Linear's input x, not its
    weight; nor FSDP2's unsharded parameters or the all-gather buffer it views as [world size,
    shard]: no storage of fixed size, reports.plan.ops)."""
    from reports.plan.ops import fixed_storages

    forward = np.flatnonzero(rows.objects("phase") == "forward")
    if not len(forward):
        return None, "no forward op"
    ops = rows.words("op")[forward]
    embedding = forward[np.char.startswith(ops.astype(str), "aten.embedding")][:256]
    batched = [
        tuple(shapes[1])
        for shapes in rows.cell_objects("input_shapes", embedding)
        if shapes is not None and len(shapes) > 1 and len(shapes[1]) >= 2
    ]
    if batched:
        tokens = meta.get("tokens")
        held = [s for s in batched if tokens and not isinstance(tokens, bool) and math.prod(s) == tokens]
        if held:
            return int(held[0][0]), f"the leading size of the first embedding's indices of {tokens:,} tokens"
        return int(batched[0][0]), "the leading size of the first embedding's indices with a batch dimension"
    weights = set(fixed_storages(rows, meta).tolist())
    head = forward[:256]
    for shapes, ids in zip(rows.cell_objects("input_shapes", head), rows.cell_objects("input_storage_ids", head)):
        if shapes is not None and len(shapes) and len(shapes[0]) >= 2 and int(ids[0]) not in weights:
            return int(shapes[0][0]), "the leading size of the first forward op's input that is not a parameter"
    return None, "no forward op with a batch dimension"


def _largest(budget, fixed, scaled, batch):
    """floor(k_max x batch), k_max the largest k with fixed + k x scaled <= budget at every op (None: no bound)."""
    grows = scaled > 0
    k_max = np.min((budget - fixed[grows]) / scaled[grows]) if grows.any() else math.inf
    return int(math.floor(k_max * batch)) if math.isfinite(k_max) else None


def _fragmentation(meta, assumed):
    """(fraction, source): the trace's own reserved / peak allocated - 1 when it ran on a GPU, else the assumption."""
    end = ((meta.get("cuda_memory") or {}).get("end")) or {}
    reserved, allocated = end.get("reserved_bytes"), end.get("max_allocated_bytes")
    if isinstance(reserved, int) and isinstance(allocated, int) and allocated > 0 and reserved >= allocated:
        return (
            reserved / allocated - 1,
            f"measured: the trace's reserved {reserved} / peak allocated {allocated} bytes, minus 1",
        )
    return assumed


def fit(run, memory_bytes, assumptions, batch, micro_batch=None, process_groups=1, world=1):
    """The memory figures of a plan of `run` (reports.plan.rows.Run), as a dict (see the module docstring); `batch` is the traced
    micro-batch, `micro_batch` the one planned (default: the traced one); a plan that does not fit
    gets `changes` (reports.plan.changes) at the traced `world` size."""
    fixed, scaled, added, seq, phase, parts = _split(run)
    context, _ = assumptions["cuda_context_bytes"]
    nccl = assumptions["nccl_buffer_bytes"][0] * process_groups
    frag, frag_source = _fragmentation(run.meta, assumptions["fragmentation"])
    k = 1.0 if micro_batch is None or not batch else micro_batch / batch
    live = fixed + k * scaled.astype(np.float64)
    at = int(np.argmax(live)) if len(live) else 0
    peak = float(live[at]) if len(live) else 0.0
    allowances = frag * peak + context + nccl
    out = {
        "peak_bytes_per_rank": peak,
        "peak_fixed_bytes": float(fixed[at]) if len(live) else 0.0,
        "peak_scaled_bytes": float(k * scaled[at]) if len(live) else 0.0,
        "optimizer_state_added_bytes": int(added[at]) if len(live) else 0,
        "optimizer_state_made_bytes": int(added[0]) if len(live) else 0,  # by the trace's ops: largest - first
        "peak_seq": int(seq[at]) if len(live) else None,
        "peak_phase": str(phase[at]) if len(live) else None,
        "fragmentation": frag,
        "fragmentation_source": frag_source,
        "fragmentation_bytes": frag * peak,
        "cuda_context_bytes": float(context),
        "nccl_buffer_bytes": float(nccl),
        "required_bytes": peak + allowances,
        "device_memory_bytes": memory_bytes,
        "parameter_sized_bytes": int(parts["parameter_sized"].max()) if len(live) else 0,
        "max_micro_batch_if_fixed": None,  # the largest micro-batch were they fixed, where that differs (below)
    }
    if memory_bytes is None:
        return out | {"fits": None, "headroom_bytes": None, "max_micro_batch": None}
    out["headroom_bytes"] = memory_bytes - out["required_bytes"]
    out["fits"] = bool(out["headroom_bytes"] >= 0)
    budget = (memory_bytes - context - nccl) / (1 + frag)
    if not len(live) or (fixed > budget).any():
        out["max_micro_batch"] = 0
    elif not batch:
        out["max_micro_batch"] = None
    else:
        out["max_micro_batch"] = _largest(budget, fixed, scaled, batch)
        sized = parts["parameter_sized"]
        if sized.any():  # the same with parameter-sized backward temporaries fixed (_parameter_sized): an upper figure
            upper = _largest(budget, fixed + sized, scaled - sized, batch)
            out["max_micro_batch_if_fixed"] = upper if upper != out["max_micro_batch"] else None
    if not out["fits"] and len(live):
        need = Need(fixed, scaled, parts, k, frag, context + nccl, memory_bytes)
        out["changes"] = changes(need, batch, micro_batch or batch, out["max_micro_batch"], world)
    return out
