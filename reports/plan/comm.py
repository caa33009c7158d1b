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

Overlap model (`overlap="prefetch"`, FSDP2's): the step runs on two streams, compute and
communication, one collective at a time on the latter, in the trace's order. An op that
reads what a collective wrote (the copy-out of an all-gather, the optimizer reading a
reduced gradient) waits for it. An all-gather starts as soon as the communication stream
is free and the compute stream has begun using the previous all-gather's output: one
unit's all-gather ahead, as FSDP2 prefetches, overlapping the current unit's compute.
Every other collective starts when the compute issued before it is done (its input is
that compute's result: a reduce-scatter of the gradients just computed). The step ends
when both streams are done; exposed communication = step time - compute time.
`overlap="none"`: every collective blocks the compute stream (all of it exposed).
"""

import math

import numpy as np

from reports.distributed.collectives import collective_kind, traffic
from reports.loading.columns import cell_objects
from reports.plan.devices import missing

__all__ = ["OVERLAPS", "collective_cost", "simulate"]

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
    names = rows["process_group"].astype(object).to_numpy()
    guessed = set()
    comm = rows["comm_bytes"].notna().to_numpy()
    seconds = np.zeros(len(rows))
    kinds = np.full(len(rows), "", dtype=object)
    at = np.flatnonzero(comm)
    ops = rows["op"].astype(object).to_numpy()
    size = rows["group_size"].to_numpy(dtype=np.float64, na_value=np.nan)
    message = rows["comm_bytes"].to_numpy(dtype=np.float64, na_value=np.nan)
    for i in at:
        kinds[i] = collective_kind(ops[i])
        w = None if size[i] != size[i] else int(size[i])
        listed = ranks.get(names[i])
        if w and w > 1 and (not listed or len(listed) != w):
            guessed.add(str(names[i]) or "unnamed")
            listed = None
        seconds[i] = collective_cost(kinds[i], message[i], w, gpu, gpus_per_node, a, listed)[0]
    return seconds, kinds, sorted(guessed)


def simulate(rows, op_s, comm_s, kinds, overlap="prefetch"):
    """{step: (step seconds, compute seconds, communication seconds)} by the overlap model above."""
    inputs = cell_objects(rows, "input_storage_ids")
    outputs = cell_objects(rows, "output_storage_ids")
    steps = rows["step"].to_numpy()
    out = {}
    for step in np.unique(steps):
        t_c = t_m = gate = busy = spent = 0.0
        ready, unconsumed = {}, set()
        for i in np.flatnonzero(steps == step):
            if kinds[i]:
                if overlap == "none":
                    start = max(t_m, t_c)
                elif kinds[i] == "all_gather":
                    start = max(t_m, gate)
                else:
                    start = max(t_m, t_c)
                t_m = start + comm_s[i]
                spent += comm_s[i]
                for s in outputs[i] if outputs[i] is not None else ():
                    ready[int(s)] = t_m
                    if kinds[i] == "all_gather":
                        unconsumed.add(int(s))
                if overlap == "none":
                    t_c = t_m
                continue
            if op_s[i] <= 0 and not ready:
                continue
            ids = [int(s) for s in inputs[i]] if inputs[i] is not None else []
            wait = max((ready.get(s, 0.0) for s in ids), default=0.0)
            t_c = max(t_c, wait)
            if unconsumed and unconsumed.intersection(ids):
                gate = t_c  # the compute stream has begun using an all-gather's output: the next may start
                unconsumed.difference_update(ids)
            t_c += op_s[i]
            busy += op_s[i]
        out[int(step)] = (max(t_c, t_m), busy, spent)
    return out
