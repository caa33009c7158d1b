"""Pipeline parallelism planned over a traced rank: stages, schedule, bubble, sends and memory.

The trace is of one rank running every layer. Its repeated blocks (the module path with the
most numbered children: `blocks.0`, `blocks.1`, ... or `layers.N`; a Sequential's `0`, `1`, ...)
are split into contiguous stages, p (`pp`) of them, or p x v chunks for the interleaved
schedule (v `virtual_stages`, chunk j on rank j mod p), so that the slowest one's priced time
(forward and backward, reports.plan.ops) is the least. What runs before the first block
(the embedding) goes with the first stage, what runs after the last (the head, the loss) with
the last; ops of other phases (the optimizer) are shared by the ranks in proportion to the
parameters they hold (the metadata's `parameters`, each to its block by its name), and the traced
step's exposed communication (FSDP2's collectives, reports.plan.comm) in proportion to their
compute, once per micro-batch (FSDP2 gathers a stage's parameters for each).

Schedule (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", arXiv:2104.04473, section 2.2): with T_r the time of rank r for one
micro-batch (its chunks' forward and backward, its sends) and m micro-batches per step,

  step      m x max T_r + bubble          (the slowest rank never waits once the pipe is full)
  bubble    (sum T_r - max T_r) / v       the fill and drain; equal stages of time t:
                                          (p-1) t / v, a fraction (p-1)/(m+p-1) of the step for
                                          1F1B (v = 1; (p-1)/m of the ideal m t), (p-1)/(v m+p-1)
                                          interleaved (the paper's bubble divided by v)

Point-to-point sends: the activation bytes at a stage boundary (the storages written before it
and read after it in the forward, less those of fixed size: parameters, FSDP2's buffers), per
micro-batch, forward; the same bytes of their gradient back. Each is priced as a two-rank
broadcast on the link between the ranks (reports.plan.comm.collective_cost: one hop, NCCL's
latency; on one node the GPU link, across nodes one GPU's NIC); stage r's ranks start at r x
`world` (the traced job's ranks times the context-parallel degree; pipeline outermost, as Megatron-LM orders its groups), so a send crosses nodes when the
two stages' first ranks sit on different nodes (interleaved, the last rank sends back to the first). A rank's sends count in its T_r
but for the share `pipeline_send_overlap` hides (reports.plan.assumptions; 0 by default:
Megatron-LM's 1F1B exchanges activations and gradients by blocking batched send/recv); what it
receives comes in over the link's other direction meanwhile.

Memory per rank: its share of the fixed bytes (parameters, gradients, optimizer state and
communication buffers at the traced peak, in proportion to its parameters), plus the
activations of the micro-batches in flight: with 1F1B rank i runs p - i forwards before its
first backward, so holds min(p - i, m) micro-batches' activations (the first p); interleaved,
Megatron-LM's warm-up of 2 (p - i - 1) + (v - 1) p chunk forwards plus one (megatron/core/
pipeline_parallel/schedules.py), at most m x v, each a chunk's: (2 (p-i-1) + (v-1) p + 1) / v
micro-batches of the rank's activations (the first p + (p-1)/v, Korthikanti et al. 2022,
arXiv:2205.05198, section 4.2.3). Of one micro-batch, a rank keeps the activations allocated
by its blocks (a storage read by a later stage's forward is sent there, and counted there),
and needs at most its peak of those while its ops run: peak + (in flight - 1) x saved.
"""

import math

import numpy as np

from reports.errors import ReportError
from reports.flops.rows import per_step, require
from reports.memory.lifetimes import CATEGORIES, Storages, dtype_sizes
from reports.plan.comm import collective_cost
from reports.plan.fit import SCALED, phases_of
from reports.plan.ops import fixed_storages

__all__ = ["SCHEDULES", "blocks_of", "in_flight", "partition", "pipeline", "schedule"]

SCHEDULES = ("1f1b", "interleaved")
_TRAINING = ("forward", "backward")


def _block_of(path):
    """(prefix, index) of a module path's first numbered segment ("blocks.3.attn" -> ("blocks", 3)), or None."""
    parts = str(path).split(".") if path else []
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i]), int(part)
    return None


def blocks_of(modules, phases):
    """(prefix, blocks, position per row, in the rows' order): the repeated blocks are the numbered
    children of the prefix with the most of them; position 1..n is a row's block (its index's rank
    among them). A row of no block goes by where it runs in its stretch of forward (or backward) rows:
    before the stretch's first block row 0 in the forward (the embedding), n + 1 in the backward (the
    head's gradients); after its last block row n + 1 in the forward (the head, the loss), 0 in the
    backward; between two, the block before it (a root module's hook). -1 for other phases."""
    modules, phases = np.asarray(modules, dtype=object), np.asarray(phases, dtype=object)
    training = np.isin(phases, _TRAINING)
    found = {m: _block_of(m) for m in dict.fromkeys(modules[training].tolist())}
    numbered = {}
    for hit in found.values():
        if hit:
            numbered.setdefault(hit[0], set()).add(hit[1])
    if not numbered:
        raise ReportError(
            "plan: pp needs repeated blocks (numbered modules: blocks.0, blocks.1, ...); the trace has none"
        )
    prefix = max(numbered, key=lambda k: (len(numbered[k]), -len(k)))
    indices = sorted(numbered[prefix])
    rank = {i: j + 1 for j, i in enumerate(indices)}
    of = {m: rank[hit[1]] if hit and hit[0] == prefix else 0 for m, hit in found.items()}
    block = np.array([of.get(m, 0) for m in modules], dtype=np.int64)
    position = np.full(len(modules), -1, dtype=np.int64)
    n = len(indices)
    starts = np.flatnonzero(np.r_[True, phases[1:] != phases[:-1]])
    for start, end in zip(starts, np.r_[starts[1:], len(phases)]):
        if not training[start]:
            continue
        stretch = block[start:end]
        at = np.flatnonzero(stretch > 0)
        forward = phases[start] == "forward"
        if not len(at):
            position[start:end] = 0 if forward else n + 1
            continue
        last = np.maximum.accumulate(np.where(stretch > 0, np.arange(len(stretch)), -1))
        where = np.where(last >= 0, stretch[np.maximum(last, 0)], 0 if forward else n + 1)
        where[at[-1] + 1 :] = n + 1 if forward else 0
        position[start:end] = np.where(stretch > 0, stretch, where)
    return prefix, indices, position


def partition(costs, parts):
    """Bounds [(start, end)] of `parts` contiguous groups of `costs` whose largest sum is the least
    (the earliest such split); len(costs) >= parts >= 1."""
    n = len(costs)
    total = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    best = np.full((parts + 1, n + 1), math.inf)
    cut = np.zeros((parts + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1, i], total[j] - total[i])
                if v < best[k, j] - 1e-15 * max(1.0, abs(v)):
                    best[k, j], cut[k, j] = v, i
    bounds, j = [], n
    for k in range(parts, 0, -1):
        bounds.append((int(cut[k, j]), j))
        j = int(cut[k, j])
    return bounds[::-1]


def schedule(times, micro_batches, virtual_stages=1):
    """{step_s, bubble_s, bubble_fraction} of ranks taking `times` seconds each per micro-batch (module docstring)."""
    slowest, total = max(times), sum(times)
    bubble = (total - slowest) / virtual_stages
    step = micro_batches * slowest + bubble
    return {"step_s": step, "bubble_s": bubble, "bubble_fraction": bubble / step if step > 0 else 0.0}


def in_flight(pp, micro_batches, kind="1f1b", virtual_stages=1):
    """Per rank, the micro-batches whose activations it holds at once, in units of the rank's
    activations of one micro-batch (module docstring)."""
    if kind == "1f1b":
        return [float(min(pp - i, micro_batches)) for i in range(pp)]
    v = virtual_stages
    return [min(micro_batches * v, 2 * (pp - i - 1) + (v - 1) * pp + 1) / v for i in range(pp)]


def _boundary_bytes(rows, meta, position, n):
    """Per boundary after position j (0..n), the bytes of the forward's storages written at or before
    it and read after it, of one traced micro-batch; and {storage id: the last forward position reading
    it} of the storages read past where they were made (a sent storage is held by the stage it is sent to)."""
    forward = np.flatnonzero(rows.objects("phase") == "forward")
    fixed = set(fixed_storages(rows, meta).tolist())
    size = dtype_sizes(meta)
    made, last = {}, {}
    ids = rows.cell_objects("input_storage_ids", forward)
    outs = zip(*(rows.cell_objects(c, forward) for c in ("output_storage_ids", "output_shapes", "output_dtypes")))
    for at, i_ids, (o_ids, shapes, dtypes) in zip(forward, ids, outs):
        where = position[at]
        for s in i_ids if i_ids is not None else ():
            last[int(s)] = max(last.get(int(s), -1), where)
        for s, shape, dtype in zip(*(() if c is None else c for c in (o_ids, shapes, dtypes))):
            if int(s) not in made and int(s) not in fixed:
                made[int(s)] = (where, math.prod(shape) * size.get(dtype, 0))
    crossing = np.zeros(n + 1)
    for s, (where, nbytes) in made.items():
        reader = last.get(s, -1)
        if reader > where:
            crossing[where:reader] += nbytes
    return crossing, {s: last[s] for s in made if last.get(s, -1) > made[s][0]}


def _stage_of_position(bounds, n):
    """Per position 0..n+1, the chunk holding it (the embedding with the first, the head with the last)."""
    chunk = np.zeros(n + 2, dtype=np.int64)
    for c, (start, end) in enumerate(bounds):
        chunk[start + 1 : end + 1] = c
    chunk[n + 1] = len(bounds) - 1
    return chunk


def _parameter_share(meta, prefix, indices, chunk_of, ranks, pre_post):
    """Per rank, its share of the parameters' bytes (by each name's block; others by pre_post(name))."""
    rank_of = {i: j + 1 for j, i in enumerate(indices)}
    held = np.zeros(ranks)
    for name, p in (meta.get("parameters") or {}).items():
        hit = _block_of(name)
        nbytes = float(p.get("numel") or 0)
        where = rank_of[hit[1]] if hit and hit[0] == prefix and hit[1] in rank_of else pre_post(name)
        held[chunk_of[where] % ranks] += nbytes
    return held / held.sum() if held.sum() > 0 else np.full(ranks, 1.0 / ranks)


def _memory(run, position, chunk_of, ranks, sent_to):
    """Per rank: (peak of one micro-batch's growing bytes while its ops run, bytes saved at the end of
    a forward); each piece to the rank of the row that made it, or of the stage it is sent to. `position`:
    each of the run's rows' (blocks_of), in seq order."""
    rows = run.memory()  # in seq order
    n = len(rows)
    phase = phases_of(rows)
    storages = Storages(run.name, run.meta, rows)
    sids, _, alloc0, free0, made0 = storages.arrays()
    cat = storages.categories(sids, alloc0, free0, made0)
    index, nbytes, alloc, free, sid = storages.pieces()
    cat = cat[index]
    made = alloc >= 0
    by_optimizer = phase[np.maximum(alloc, 0)] == "optimizer"
    grows = np.isin(cat, [CATEGORIES.index(c) for c in SCALED]) & made & ~by_optimizer
    owner_pos = np.where(made, position[np.maximum(alloc, 0)], -1)
    moved = np.array([sent_to.get(int(i), -1) for i in sid], dtype=np.int64)
    owner_pos = np.maximum(owner_pos, np.where(owner_pos >= 0, moved, -1))
    owner = np.where(owner_pos >= 0, chunk_of[np.maximum(owner_pos, 0)] % ranks, -1)
    row_rank = np.where(position >= 0, chunk_of[np.maximum(position, 0)] % ranks, -1)
    forward = np.flatnonzero(phase == "forward")
    ends = forward[np.r_[np.diff(forward) > 1, True]] if len(forward) else forward  # a forward's last row
    peak, saved = np.zeros(ranks), np.zeros(ranks)
    for r in range(ranks):
        pick = grows & (owner == r)
        start, end = alloc[pick] + 1, free[pick] + 1
        freed = end > 0
        weights = np.r_[nbytes[pick], -nbytes[pick][freed]].astype(np.float64)
        live = np.cumsum(np.bincount(np.r_[start, end[freed]], weights=weights, minlength=n + 1)[: n + 1])[1:]
        own = row_rank == r
        peak[r] = float(live[own].max()) if own.any() else 0.0
        saved[r] = float(live[ends].max()) if len(ends) else 0.0
    return peak, saved


def _send_s(nbytes, gpu, gpus_per_node, ranks, a):
    """Seconds of one point-to-point send of `nbytes` between two global `ranks`."""
    if nbytes <= 0:
        return 0.0
    return collective_cost("broadcast", nbytes, 2, gpu, gpus_per_node, a, ranks=ranks)[0]


def pipeline(rows, run, meta, seconds, exposed_s, k, gpu, gpus_per_node, world, a, memory_fit, batch, shape):
    """The pipeline's figures (module docstring) for `shape` = (pp, micro_batches, schedule, virtual_stages):
    ({name: value} for the plan's record, {detail}); `rows` the priced step's (reports.plan.rows.PlanRows),
    `seconds` their op seconds, `exposed_s` the step's exposed communication, `run` the reports.plan.rows.Run
    (every row, for the memory), `k` the planned micro-batch over the traced one (`batch` sequences),
    `memory_fit` reports.plan.fit.fit's figures."""
    require(rows.table.column_names, ("module",), "plan")
    pp, m, kind, v = shape
    v = v if kind == "interleaved" else 1
    chunks = pp * v
    phases = rows.objects("phase")
    prefix, indices, position = blocks_of(rows.objects("module"), phases)
    n = len(indices)
    name = f"{prefix}.N" if prefix else "N"
    if n < chunks:
        raise ReportError(
            f"plan: {chunks} pipeline stages ({pp} x {v} virtual) need at least {chunks} repeated blocks; "
            f"the trace has {n} ({name})"
        )
    train = position >= 0
    steps = max(1, int(np.unique(rows.ints("step")[train]).size))
    cost = np.bincount(position[train], weights=seconds[train], minlength=n + 2) / steps
    blocks = cost[1 : n + 1].copy()
    blocks[0] += cost[0]
    blocks[-1] += cost[n + 1]
    bounds = partition(blocks, chunks)
    chunk_of = _stage_of_position(bounds, n)
    work = np.bincount(chunk_of[position[train]], weights=seconds[train], minlength=chunks) / steps
    work = work + (exposed_s * work / work.sum() if work.sum() > 0 else 0.0)  # FSDP's exposed share, per unit
    crossing, _ = _boundary_bytes(rows, meta, position, n)
    sent = np.array([crossing[end] * k / steps if c < chunks - 1 else 0.0 for c, (_, end) in enumerate(bounds)])
    # chunk c's rank (c mod pp) sends to the next chunk's: the first ranks of the two stages, `world` x rank
    links = [[(c % pp) * world, ((c + 1) % pp) * world] for c in range(chunks)]
    forward_s = np.array([_send_s(b, gpu, gpus_per_node, link, a) for b, link in zip(sent, links)])
    backward_s = np.r_[0.0, forward_s[:-1]]  # chunk c sends back the gradient of what chunk c - 1 sent it
    chunk_time = work + (1 - a["pipeline_send_overlap"]) * (forward_s + backward_s)
    rank_time = np.bincount(np.arange(chunks) % pp, weights=chunk_time, minlength=pp)
    rank_sends = np.bincount(np.arange(chunks) % pp, weights=forward_s + backward_s, minlength=pp)
    timed = schedule(list(rank_time), m, v)

    held = _parameter_share(meta, prefix, indices, chunk_of, pp, _pre_post(rows, position, n))
    other = float(per_step(rows, values=np.where(train, 0.0, seconds)))
    optimizer = other * held
    step = timed["step_s"] + float(optimizer.max())

    every = run.rows.take(np.argsort(run.rows.ints("seq"), kind="stable"))  # every row, in seq order
    every_position = blocks_of(every.objects("module"), every.objects("phase"))[2]
    _, sent_to = _boundary_bytes(every, meta, every_position, n)
    peak, saved = _memory(run, every_position, chunk_of, pp, sent_to)
    flight = np.array(in_flight(pp, m, kind, v))
    growing = k * (peak + (flight - 1) * saved)
    fixed = memory_fit["peak_fixed_bytes"] * held
    frag, context = memory_fit["fragmentation"], memory_fit["cuda_context_bytes"]
    nccl = memory_fit["nccl_buffer_bytes"] + a["nccl_buffer_bytes"]  # and the pipeline's group
    need = fixed + growing + memory_fit.get("cp_kv_in_flight_bytes", 0.0)  # ring attention's blocks (context.py)
    required = (1 + frag) * need + context + nccl
    memory = memory_fit["device_memory_bytes"]
    worst = int(np.argmax(required))
    record = {
        "pp": pp,
        "micro_batches": m,
        "schedule": kind,
        "virtual_stages": v,
        "step_time_s": step,
        "pipeline_bubble_s": timed["bubble_s"],
        "bubble_fraction": timed["bubble_fraction"],
        "p2p_s": float(m * rank_sends.max()),  # the busiest rank's sends per step
        "peak_bytes_per_rank": float(need[worst]),
        "required_bytes": float(required[worst]),
    }
    if memory is not None:
        budget = (memory - context - nccl) / (1 + frag)
        per_k = growing / k
        k_max = min(((budget - f) / g for f, g in zip(fixed, per_k) if g > 0), default=math.inf)
        record |= {
            "fits": bool(required[worst] <= memory),
            "headroom_bytes": memory - float(required[worst]),
            "max_micro_batch": 0
            if (fixed > budget).any()
            else (int(math.floor(k_max * batch)) if batch and math.isfinite(k_max) else None),
        }
    stages = [
        {
            "rank": r,
            "chunks": [
                {"blocks": f"{indices[bounds[c][0]]}-{indices[bounds[c][1] - 1]}", "seconds": float(chunk_time[c])}
                for c in range(r, chunks, pp)
            ],
            "seconds_per_micro_batch": float(rank_time[r]),
            "send_bytes": float(sum(sent[c] for c in range(r, chunks, pp))),
            "send_s": float(rank_sends[r]),
            "optimizer_s": float(optimizer[r]),
            "parameter_share": float(held[r]),
            "in_flight": float(flight[r]),
            "fixed_bytes": float(fixed[r]),
            "activation_peak_bytes": float(k * peak[r]),
            "saved_activation_bytes": float(k * saved[r]),
            "peak_bytes": float(need[r]),
            "required_bytes": float(required[r]),
        }
        for r in range(pp)
    ]
    detail = {
        "blocks": name,
        "block_count": n,
        "stages": stages,
        "cuda_context_bytes": float(context),
        "nccl_buffer_bytes": float(nccl),
        "fragmentation": float(frag),
    }
    return record, detail


def _pre_post(rows, position, n):
    """name -> position (0 or n + 1) of a parameter outside the blocks, by its module's position."""
    where = dict(zip(rows.objects("module"), position))
    return lambda name: 0 if where.get(name.rpartition(".")[0], n + 1) == 0 else n + 1
