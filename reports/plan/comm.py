"""Collectives priced on the target's links, and the step they leave exposed.

Cost of one collective of message S (nccl-tests' size: the full array of an all-gather or
reduce-scatter) on a group of W ranks spanning n nodes, by NCCL's ring. Global rank r sits
on node r // gpus_per_node (torchrun's placement); the group's ranks (the metadata's
`process_groups`) give n and g, the fewest of its GPUs on any one node: HSDP's replicate
group of ranks 0, 8, ..., 56 at 8 per node spans 8 nodes with g = 1. A group the metadata
does not list is taken as consecutive ranks (n = ceil(W / gpus_per_node), g = min(W,
gpus_per_node)), and the plan says so.

  bytes      S x the bytes a rank sends per byte of message (reports.distributed.collectives
             `traffic`: all-gather and reduce-scatter (W-1)/W, all-reduce 2(W-1)/W)
  bandwidth  link_efficiency x: within a node, the GPU's NVLink (or PCIe) one way; across
             nodes, min(NVLink, g x NIC), g the group's GPUs per node: NCCL runs one ring
             channel per NIC, so a ring crossing nodes goes at the node's NICs together
             (NCCL tuning.cc: bus bandwidth = channels x the inter-node speed)
  latency    nccl_base_s + steps within a node x nvlink_step_s (pcie_step_s) + steps across
             nodes x net_step_s, with NCCL's step counts: W-1 (n-1 across) for all-gather and
             reduce-scatter, 2(W-1) (2(n-1)) for all-reduce, 1 for broadcast and reduce (NCCL
             prices its pipelined ring as one step, across nodes when it spans several), W (n,
             none on one node) for the others
  time       latency + bytes / bandwidth; 0 for a group of one rank

Overlap model (`overlap="prefetch"`, FSDP2's): the step runs on a compute stream and one
communication stream per process group (ProcessGroupNCCL runs a group's collectives on one
stream, in the order issued: FSDP2's all-gathers and reduce-scatters queue behind each other,
a tensor-parallel group's all-reduces do not queue behind them). An op that does work and
reads (or writes) what a collective wrote waits for that collective: the copy-out of an
all-gather, the optimizer reading a reduced gradient, `wait_tensor`. An op that costs nothing
(a view, a metadata op: no kernel) never waits; what it makes is ready when its inputs are,
so readiness passes through it to the op that reads the view (FSDP2's views of each
reduce-scatter's output do not stall the compute stream). An all-gather starts as soon as
its group's stream is free and the compute stream has begun using that group's previous
all-gather's output: one unit's all-gather ahead, as FSDP2 prefetches, overlapping the
current unit's compute. Every other collective starts when its group's stream is free and
the compute issued before it is done (its input is that compute's result: a reduce-scatter
of the gradients just computed). A collective reading another collective's output (HSDP's
all-reduce of a reduce-scatter's shard) starts when that one ends. Exposed communication is
the time the compute stream waits for collectives, plus the time the streams run past the
step's last op (the step ends when every stream is done): step time - compute time.
`overlap="none"`: every collective blocks the compute stream (all of it exposed).
"""

import math

import numpy as np

from reports.distributed.collectives import collective_kind, traffic
from reports.plan.devices import missing
from reports.plan.rows import plan_rows

__all__ = ["OVERLAPS", "collective_cost", "simulate", "tensor_parallel"]

OVERLAPS = ("prefetch", "none")


def _steps(kind, w, nodes):
    """(ring steps, of which across nodes), as NCCL's tuning model counts them."""
    if kind in ("all_gather", "reduce_scatter"):
        return w - 1, nodes - 1
    if kind == "all_reduce":
        return 2 * (w - 1), 2 * (nodes - 1)
    if kind in ("broadcast", "reduce"):  # a pipelined ring: one step's latency, over the network if it spans nodes
        return 1, int(nodes > 1)
    return w, nodes if nodes > 1 else 0


def placement(w, gpus_per_node, ranks=None):
    """(nodes spanned, fewest of the group's GPUs on one of them) of a group of `w` ranks: from its
    global `ranks` when given, else as if they were consecutive."""
    if not ranks:
        return math.ceil(w / gpus_per_node), min(w, gpus_per_node)
    _, per_node = np.unique(np.asarray(ranks, dtype=np.int64) // gpus_per_node, return_counts=True)  # not by rank:
    return len(per_node), int(per_node.min())  # a metadata rank of 10^15 sizes no array


def collective_cost(kind, message_bytes, w, gpu, gpus_per_node, a, ranks=None):
    """(seconds, bytes sent, bandwidth bytes/s, latency s) of one collective; `a` is {name: value};
    `ranks`: the group's global ranks (None: consecutive)."""
    if w is None or w <= 1:
        return 0.0, 0.0, math.nan, 0.0
    nodes, local = placement(w, gpus_per_node, ranks)
    sent = message_bytes * traffic(kind, w)[0]
    for figure in ("intra_bytes_per_s",) if nodes == 1 else ("intra_bytes_per_s", "nic_bytes_per_s"):
        if gpu[figure] is None:
            raise missing(gpu, figure)
    intra = gpu["intra_bytes_per_s"]
    if nodes == 1:
        bandwidth = intra
    else:
        bandwidth = min(intra, local * gpu["nic_bytes_per_s"])
    bandwidth *= a["link_efficiency"]
    steps, across = _steps(kind, w, nodes)
    # NB: an xGMI ring step (AMD Infinity Fabric) is priced at NVLink's latency (judgement: both link GPU to GPU)
    step = a["pcie_step_s"] if gpu["link"] == "PCIe" else a["nvlink_step_s"]
    latency = a["nccl_base_s"] + (steps - across) * step + across * a["net_step_s"]
    return latency + sent / bandwidth, sent, bandwidth, latency


def costs(rows, gpu, gpus_per_node, a, groups=None):
    """Per row: collective seconds (0 for other ops), kinds ('' for other ops), and the names of
    the groups priced as consecutive ranks (not in `groups`, the metadata's process_groups)."""
    ranks = {g.get("name"): g.get("ranks") for g in groups or () if isinstance(g, dict)}
    rows = plan_rows(rows)
    names = rows.objects("process_group")
    guessed = set()
    comm = rows.valid("comm_bytes")
    seconds = np.zeros(len(rows))
    kinds = np.full(len(rows), "", dtype=object)
    at = np.flatnonzero(comm)
    ops = rows.objects("op")
    size = rows.floats("group_size")
    message = rows.floats("comm_bytes")
    for i in at:
        kinds[i] = collective_kind(ops[i])
        w = None if size[i] != size[i] else int(size[i])
        listed = ranks.get(names[i])
        if w and w > 1 and (not listed or len(listed) != w):
            guessed.add(str(names[i]) or "unnamed")
            listed = None
        seconds[i] = collective_cost(kinds[i], message[i], w, gpu, gpus_per_node, a, listed)[0]
    return seconds, kinds, sorted(guessed)


def tensor_parallel(rows, tokens=None):
    """(degree, group name): the size of the largest process group that all-reduces or reduce-scatters,
    in the forward phase, a tensor of at least `tokens` elements (the rank's tokens per step; 2 when
    unknown), (1, None) when none does. Those are tensor parallelism's collectives of activations, one
    or more elements per token (Megatron-LM's all-reduce after a row-parallel linear; a reduce-scatter
    with sequence parallelism): its ranks read the same tokens. FSDP and DDP reduce in the backward,
    expert parallelism's all-to-all moves tokens between ranks that read different ones, and a loss or
    a count per expert all-reduced in the forward is smaller than the tokens."""
    least = max(2, int(tokens)) if tokens and not isinstance(tokens, bool) else 2
    rows = plan_rows(rows)
    phase = rows.objects("phase")
    ops = rows.objects("op")
    size = rows.floats("group_size")
    names = rows.objects("process_group")
    at = np.flatnonzero(rows.valid("comm_bytes") & (phase == "forward") & (size > 1))
    found = (1, None)
    for i, shapes in zip(at, rows.cell_objects("input_shapes", at)):
        if collective_kind(ops[i]) not in ("all_reduce", "reduce_scatter") or shapes is None or not len(shapes):
            continue
        if math.prod(int(n) for n in shapes[0]) >= least and size[i] > found[0]:
            found = (int(size[i]), names[i] if isinstance(names[i], str) else None)
    return found


def simulate(rows, op_s, comm_s, kinds, overlap="prefetch"):
    """{step: (step seconds, compute seconds, communication seconds, {collective kind: seconds the
    compute stream waited for it})} by the overlap model above."""
    rows = plan_rows(rows)
    inputs = rows.cell_objects("input_storage_ids")
    outputs = rows.cell_objects("output_storage_ids")
    groups = np.asarray(["" if g is None else str(g) for g in rows.objects("process_group")], dtype=object)
    steps = rows.ints("step")
    out = {}
    for step in np.unique(steps):
        s = _Streams(overlap)
        for i in np.flatnonzero(steps == step):
            ins = _ids(inputs[i])
            if kinds[i]:
                s.collective(kinds[i], groups[i], ins, _ids(outputs[i]), comm_s[i])
            elif op_s[i] > 0:
                s.compute(ins + _ids(outputs[i]), op_s[i])
            elif s.ready:
                s.passes(ins, _ids(outputs[i]))
        out[int(step)] = (max([s.t_c, *s.free.values()]), s.busy, s.spent, s.waited)
    return out


def _ids(cell):
    return [int(x) for x in cell] if cell is not None else []


class _Streams:
    """One step's clocks: the compute stream's (`t_c`), each process group's communication stream's
    (`free`: when its last collective ends), when each storage a collective wrote is ready."""

    def __init__(self, overlap):
        self.overlap = overlap
        self.t_c = self.busy = self.spent = 0.0
        self.free, self.gate = {}, {}  # per group: its stream's end; when its next all-gather may start
        self.ready, self.writer = {}, {}  # per storage: when it is ready; the kind of the collective that wrote it
        self.unconsumed = {}  # all-gather output storage -> its group, until an op that does work reads it
        self.waited = {}

    def collective(self, kind, group, ins, outs, seconds):
        after = max((self.ready.get(x, 0.0) for x in ins), default=0.0)  # another collective's output
        if self.overlap != "none" and kind == "all_gather":
            start = max(self.free.get(group, 0.0), self.gate.get(group, 0.0), after)
        else:
            start = max(self.free.get(group, 0.0), self.t_c, after)
        end = self.free[group] = start + seconds
        self.spent += seconds
        for x in outs:
            self.ready[x], self.writer[x] = end, kind
            if kind == "all_gather":
                self.unconsumed[x] = group
        if self.overlap == "none":
            self._wait(end, kind)

    def compute(self, ids, seconds):
        if self.ready:
            x = max(ids, key=lambda x: self.ready.get(x, 0.0), default=None)
            if x is not None and x in self.ready:
                self._wait(self.ready[x], self.writer[x])
            for x in ids:
                if x in self.unconsumed:  # the compute stream has begun using an all-gather's output
                    group = self.unconsumed.pop(x)
                    self.gate[group] = max(self.gate.get(group, 0.0), self.t_c)
        self.t_c += seconds
        self.busy += seconds

    def passes(self, ins, outs):
        """An op that costs nothing: no wait; what it makes is ready when its inputs are."""
        known = [x for x in ins if x in self.ready]
        if not known:
            return
        x = max(known, key=self.ready.get)
        for y in outs:
            if self.ready.get(y, 0.0) < self.ready[x]:
                self.ready[y], self.writer[y] = self.ready[x], self.writer[x]
            group = next((self.unconsumed[z] for z in ins if z in self.unconsumed), None)
            if group is not None:
                self.unconsumed.setdefault(y, group)

    def _wait(self, until, kind):
        if until > self.t_c:
            self.waited[kind] = self.waited.get(kind, 0.0) + until - self.t_c
            self.t_c = until
