"""Context parallelism planned over a traced rank: ring attention's communication and memory.

With a context-parallel degree c, each of c ranks holds seq / c tokens of every sequence: the
work and the activations that grow with the tokens are 1/c of the traced rank's (reports/plan/
plan.py prices the rank at 1/c of the micro-batch; causal attention balanced over the ranks, as
the load-balanced ring attention implementations order the chunks, so that each rank computes
1/c of the scores). Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers
for Near-Infinite Context", arXiv:2310.01889) passes the K/V blocks of the other c - 1 ranks
around the ring, one block per step, while each step's attention runs on the block received
before it:

  K/V block    2 x b x (seq / c) x heads_kv x head_dim x dtype bytes (K and V of b sequences'
               seq / c tokens; the key's shape [b, heads_kv, seq, head_dim] of the traced
               attention kernel, its dtype, b scaled to the planned micro-batch)
  forward      per attention kernel (a layer), c - 1 sends of one block:
               2 x (c-1) x (seq/c) x heads_kv x head_dim x dtype bytes per sequence
  backward     per attention backward kernel, c - 1 sends of the K/V block and of its dK/dV
               (twice the bytes of the forward)
  time         each send priced on the link to the next rank of the ring (reports.plan.comm.
               collective_cost: a two-rank broadcast, one hop; the ring's ranks tp apart, as
               torchtitan's mesh [..., cp, tp] and Megatron-LM's order tp-cp-ep-dp-pp place them,
               so on one node while c x tp <= GPUs per node, else its slowest hop crosses nodes
               on one GPU's NIC); overlapped with the attention on the block before it, a 1/c share of
               the kernel's priced time: exposed per kernel (c - 1) x max(0, send - kernel / c)
  memory       the traced rank's growing bytes / c (plan.py's fit at 1/c of the micro-batch),
               plus the blocks in flight: one K/V block received while the attention runs on
               another in the forward, and with it its dK/dV in the backward: 2 K/V blocks at
               the peak (the backward's)
"""

import numpy as np

from reports.errors import ReportError
from reports.memory.lifetimes import dtype_sizes
from reports.plan.comm import collective_cost
from reports.plan.rows import plan_rows

__all__ = ["kv_block_bytes", "ring"]

_KERNEL = "scaled_dot_product"


def kv_block_bytes(batch, seq, cp, heads_kv, head_dim, dtype_bytes):
    """Bytes of one K/V block of ring attention: 2 (K and V) x batch x seq / cp x heads_kv x head_dim x dtype bytes."""
    return 2 * batch * (seq // cp) * heads_kv * head_dim * dtype_bytes


def _slowest_hop(cp, tp, gpus_per_node):
    """Two neighbours of the ring of ranks 0, tp, ..., (cp - 1) tp: a pair on two nodes if there is one."""
    members = [i * tp for i in range(cp)]
    pairs = list(zip(members, members[1:] + members[:1]))
    return list(next((p for p in pairs if p[0] // gpus_per_node != p[1] // gpus_per_node), pairs[0]))


def _attention_rows(rows):
    """Indices of the rows of fused attention kernels (forward and backward) and whether each is a backward."""
    ops = rows.words("op")
    kind = rows.objects("flop_kind")
    at = np.flatnonzero((kind == "attention") & np.char.find(ops.astype(str), _KERNEL).__ge__(0))
    return at, np.char.find(ops[at].astype(str), "_backward") >= 0


def ring(rows, meta, seconds, cp, k, gpu, gpus_per_node, a, tp=1):
    """(per-row exposed seconds of the ring, as `seconds` are per row; figures per step) of context
    parallelism `cp` over the priced `rows` (op `seconds` at 1/cp of the micro-batch; `k` the planned
    micro-batch over the traced one; `tp` the tensor-parallel degree, the ring's stride)."""
    rows = plan_rows(rows)
    at, backward = _attention_rows(rows)
    if not len(at):
        raise ReportError(
            "plan: cp needs the trace's attention kernels (scaled_dot_product_attention's fused kernels); it has none"
        )
    size = dtype_sizes(meta)
    shapes = rows.cell_objects("input_shapes", at)
    dtypes = rows.cell_objects("input_dtypes", at)
    exposed, spent, sent, block_max = np.zeros(len(rows)), 0.0, 0.0, 0.0
    seq = heads_kv = head_dim = None
    ranks = _slowest_hop(cp, tp, gpus_per_node)
    for i, back, shape, dtype in zip(at, backward, shapes, dtypes):
        key = tuple(shape[2 if back else 1])
        if len(key) != 4:
            raise ReportError(f"plan: cp needs attention on [batch, heads, seq, head_dim] keys; got {key}")
        b, heads_kv, seq, head_dim = key
        if seq % cp:
            raise ReportError(f"plan: cp {cp} must divide the sequence length, {seq} tokens")
        block = kv_block_bytes(b * k, seq, cp, heads_kv, head_dim, size.get(dtype[2 if back else 1], 0))
        block_max = max(block_max, block)
        message = block * (2 if back else 1)  # the backward passes dK/dV with the K/V block
        send = collective_cost("broadcast", message, 2, gpu, gpus_per_node, a, ranks=ranks)[0]
        exposed[i] = (cp - 1) * max(0.0, send - seconds[i] / cp)
        spent += (cp - 1) * send
        sent += (cp - 1) * message
    steps = max(1, int(np.unique(rows.ints("step")[at]).size))
    figures = {
        "cp": cp,
        "seq": int(seq),
        "heads_kv": int(heads_kv),
        "head_dim": int(head_dim),
        "kv_block_bytes": float(block_max),
        "kv_in_flight_bytes": float(2 * block_max),
        "ring_bytes": float(sent / steps),
        "ring_s": float(spent / steps),
        "ring_exposed_s": float(exposed.sum() / steps),
        "attention_kernels": int(len(at)),
    }
    return exposed, figures
