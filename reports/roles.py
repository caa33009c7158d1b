"""What each matmul row of a run multiplies: a model weight, a weight outside the model, or activations.

  weight_matmul    a model parameter (or a cast copy of one, autocast's bf16 weight) is
                   a multiplied operand: y = x @ W and dL/dx = dL/dy @ Wᵀ; or the row
                   computes a weight gradient dL/dW = xᵀ @ dL/dy: its output becomes a
                   `gradient` storage directly, or through adds and at most one cast (a
                   bf16 dW cast to fp32; the dW of every use of a weight summed: tied
                   weights, a module called twice, an unrolled RNN, a loss with several
                   terms; an accumulated micro-batch added in). Adds only sum
                   contributions, so the walk follows any number of them, and nothing
                   else: an activation x activation matmul whose result flows through
                   another op (embedding_dense_backward, say) into a gradient is not one.
  external_weight  an operand is a parameter of a module outside `model=` (metadata
                   storage_roles["external_parameter"]; absent in older traces): a
                   frozen teacher's forward. Never part of N, never attention.
  attention        the other matmuls (two activations: q @ kᵀ, softmax(·) @ v and their
                   backward) and fused attention kernels (flop_kind "attention")
  other            everything else
"""

import pandas as pd

from reports._util import ONE_TO_ONE_COPIES, ids, packet
from reports.errors import ReportError

__all__ = ["CATEGORIES", "Roles", "operands"]

CATEGORIES = ("weight_matmul", "external_weight", "attention", "other")
EXTERNAL_ROLE = "external_parameter"

# Ops whose first tensor input is added to the product, not multiplied (bias + a @ b).
_ADD_FIRST = frozenset(
    "aten.addmm aten.addmm_ aten.addmv aten.addmv_ aten.addr aten.addr_ "
    "aten.baddbmm aten.baddbmm_ aten.addbmm aten.addbmm_".split()
)
_ADDS = frozenset({"aten.add", "aten.add_"})
_NO_PARAM = -1


def operands(op, input_ids):
    """The two multiplied inputs of a matmul row (addmm's bias is skipped)."""
    values = ids(input_ids)
    start = 1 if packet(op) in _ADD_FIRST else 0
    return values[start : start + 2]


def _copies(rows, packets, sources):
    """{storage: source} for `sources` and every one-to-one copy (cast) made of them, transitively."""
    alias = {sid: sid for sid in sources}
    mask = packets.isin(ONE_TO_ONE_COPIES)
    for op, ins, outs in zip(packets[mask], rows.loc[mask, "input_storage_ids"], rows.loc[mask, "output_storage_ids"]):
        ins, outs = ids(ins), ids(outs)
        src = ins[1] if op == "aten.copy_" and len(ins) > 1 else (ins[0] if ins else None)
        if src in alias:
            for o in outs:
                alias.setdefault(o, alias[src])
    return alias


_GRADIENT_MOVES = frozenset(("fsdp.chunk_cat", "aten._chunk_cat"))


def gradient_sources(rows, packets, gradients):
    """Storages that become a gradient directly or through adds and at most one cast (backward/other rows).

    A collective (DDP's all-reduce, FSDP2's reduce-scatter) and FSDP2's packing of gradients
    into its flat reduce buffer (`chunk_cat`) move a gradient without computing on it, and
    gradient accumulation (`add_` into a storage that already is a gradient: the 2nd..kth
    micro-batch) adds into it in place: they pass states through unchanged."""
    reach = {sid: {0} for sid in gradients}  # storage -> {casts used on the way to a gradient}
    moved = packets.isin(_GRADIENT_MOVES)
    if "flop_kind" in rows:
        moved |= rows["flop_kind"].astype(object) == "collective"
    hop = rows["phase"].isin(("backward", "other")) & (packets.isin(ONE_TO_ONE_COPIES) | packets.isin(_ADDS) | moved)
    kinds = moved[hop]
    hops = list(zip(packets[hop], kinds, rows.loc[hop, "input_storage_ids"], rows.loc[hop, "output_storage_ids"]))
    for op, collective, ins, outs in reversed(hops):  # the last op first: cast -> add -> gradient is followed back
        states = set().union(*(reach.get(o, set()) for o in ids(outs)))
        if collective or op in _ADDS:
            after = states
        else:  # a cast: at most one on the way
            after = {c + 1 for c in states if c == 0}
        for sid in ids(ins) if after else ():
            reach.setdefault(sid, set()).update(after)
    return set(reach)


class Roles:
    """The parameters of one run and the category (CATEGORIES) of each of its rows.

    names, numel, embedding, trainable: per parameter storage id (tied weights share one).
    param: per row, the model parameter storage a matmul multiplies by (-1: none).
    category: per row, one of CATEGORIES. matmul_params: the parameter storages that
    enter a forward matmul (the default N). external: storages of parameters outside
    the model."""

    def __init__(self, rows, meta):
        params = meta.get("parameters")
        if not params:
            raise ReportError(
                f"run {meta.get('run_name')!r} has no parameter metadata, so weight matmuls cannot be told "
                "from activation matmuls; trace it with Tracer(..., model=model)"
            )
        self.names, self.numel, self.embedding, self.trainable = {}, {}, {}, {}
        unsharded = meta.get("unsharded_parameters") or {}  # FSDP2's full parameters, built for the forward
        for name, p in [*params.items(), *unsharded.items()]:
            sid = int(p["storage_id"])
            self.names.setdefault(sid, []).append(name)
            self.numel[sid] = max(self.numel.get(sid, 0), int(p["numel"]))
            self.embedding[sid] = self.embedding.get(sid, False) or bool(p.get("embedding"))
            self.trainable[sid] = self.trainable.get(sid, False) or bool(p.get("trainable", True))
        roles = meta.get("storage_roles") or {}
        self.external = {int(s) for s in roles.get(EXTERNAL_ROLE, [])} - set(self.names)
        packets = rows["op"].astype(object).map(packet)
        alias = _copies(rows, packets, set(self.names))
        external = _copies(rows, packets, self.external)
        to_grad = gradient_sources(rows, packets, {int(s) for s in roles.get("gradient", [])})

        kind = rows["flop_kind"].astype(object)
        mm = kind == "matmul"
        param, ext, grad = [], [], []
        for op, ins, outs in zip(rows.loc[mm, "op"], rows.loc[mm, "input_storage_ids"],
                                 rows.loc[mm, "output_storage_ids"]):
            pair = operands(op, ins)
            hit = [alias[s] for s in pair if s in alias]
            param.append(hit[0] if hit else _NO_PARAM)
            ext.append(not hit and any(s in external for s in pair))
            grad.append(not hit and not ext[-1] and bool(to_grad.intersection(ids(outs))))
        self.param = pd.Series(_NO_PARAM, index=rows.index, dtype="int64")
        self.param[mm] = pd.Series(param, index=rows.index[mm], dtype="int64")
        weight_grad = pd.Series(False, index=rows.index)
        weight_grad[mm] = pd.Series(grad, index=rows.index[mm], dtype=bool)
        outside = pd.Series(False, index=rows.index)
        outside[mm] = pd.Series(ext, index=rows.index[mm], dtype=bool)
        weight = mm & ((self.param >= 0) | weight_grad)
        self.category = pd.Series("other", index=rows.index, dtype=object)
        self.category[(mm & ~weight & ~outside) | (kind == "attention")] = "attention"
        self.category[outside] = "external_weight"
        self.category[weight] = "weight_matmul"
        fwd = mm & (rows["phase"] == "forward") & (self.param >= 0)
        self.matmul_params = sorted(set(self.param[fwd]))

    def label(self, sid):
        return " = ".join(self.names.get(sid, [f"storage {sid}"]))
