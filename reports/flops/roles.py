"""What each matmul row of a run multiplies: a model weight, a weight outside the model, or activations.

weight_matmul    a model parameter is a multiplied operand: y = x @ W and dL/dx = dL/dy @ Wᵀ.
                 Also a view of one (a slice, split, chunk, select, `t`, expand: views
                 share the parameter's storage), a cast copy (autocast's bf16 weight) and
                 a gathered copy of a stacked expert weight [E, K, N] (`w[expert_ids]`
                 before a bmm: index/index_select of a parameter of 3 dims or more).
                 Or the row computes a weight gradient dL/dW = xᵀ @ dL/dy: its output
                 becomes a `gradient` storage directly, or through adds, the ops that
                 place a gradient piece into a larger gradient (the backward of a slice,
                 select, index or chunk: slice_backward, select_backward, index_put,
                 index_add, cat, stack, *_scatter) and at most one cast (a bf16 dW cast to
                 fp32; the dW of every use of a weight summed: tied weights, a module
                 called twice, an unrolled RNN, a loss with several terms; an accumulated
                 micro-batch added in). Adds only sum contributions and the placing ops
                 only move them, so the walk follows any number of them, and nothing else:
                 an activation x activation matmul whose result flows through another op
                 (embedding_dense_backward, say) into a gradient is not one. Gradients
                 that never become a `.grad` (torch.func.grad, vmap per-sample
                 gradients, autograd.grad): a backward matmul that reads the input x of a
                 forward matmul with weight W and whose output has W's matrix shape
                 ([..., K, N] or its transpose) is W's dW.
external_weight  an operand is a parameter of a module outside `model=` (metadata
                 storage_roles["external_parameter"]; absent in older traces): a
                 frozen teacher's forward. Or the dW of such a weight, when it is trained
                 (a GAN's discriminator with model=G): a row that becomes a gradient and reads
                 an activation that a forward multiplied by an external weight and by no model
                 weight. Or a weight-only quantized matmul whose packed
                 weight is no parameter (a buffer: tracer.rules.PACKED_WEIGHT). Never
                 part of N, never attention.
attention        the other matmuls (two activations: q @ kᵀ, softmax(·) @ v and their
                 backward) and fused attention kernels (flop_kind "attention")
other            everything else, and a weight times a buffer vector of the model (`mv`; the
                 buffer or a copy of it: storage_roles["buffer"]), which multiplies no token:
                 spectral_norm's power iteration W v and Wᵀ u. Not in N. (A buffer multiplied
                 as a matrix, positions or coordinates, is token work: a weight matmul.)
"""

import re
from math import prod

import numpy as np

from reports._util import ids, packet, unique
from reports.errors import ReportError
from reports.flops.evaluation import evaluation_rows
from reports.flops.rows import as_rows
from reports.flops.walks import NO_ID, copies_of, gradient_ids, member, ordered_unique, take_rows
from tracer.rules import ADD_FIRST as _ADD_FIRST  # ops whose first tensor input is added, not multiplied (bias + a @ b)
from tracer.rules import PACKED_WEIGHT

__all__ = ["CATEGORIES", "Roles", "operands", "skipped_inputs"]

CATEGORIES = ("weight_matmul", "external_weight", "attention", "other")
EXTERNAL_ROLE = "external_parameter"
BUFFER_ROLE = "buffer"  # the model's buffers (storage_roles; absent in older traces)


_NO_PARAM = -1


def operands(op, input_ids):
    """The two multiplied inputs of a matmul row (addmm's bias is skipped)."""
    values = ids(input_ids)
    start = 1 if packet(op) in _ADD_FIRST else 0
    return values[start : start + 2]


def skipped_inputs(packets):
    """Per row of op packets (Labels): how many leading inputs are added, not multiplied (1 for addmm, else 0)."""
    return packets.isin(_ADD_FIRST).astype(np.int64)


_INNER_PRODUCTS = frozenset({"aten.dot", "aten.vdot"})  # (spectral_norm's u · W v): "other" unless a weight's
_VECTOR_PRODUCTS = frozenset({"aten.mv"})  # a matrix times a vector: a weight times a buffer vector is "other"


def _recomputed(rows):
    """Boolean array: the rows activation checkpointing re-ran (the `recompute` column; none without it)."""
    return rows.flag("recompute")


def _matmul_operands(packets, offsets, ids):
    """The two multiplied input storages of each row in (offsets, ids), NO_ID where a row has fewer (see `operands`)."""
    start = offsets[:-1] + skipped_inputs(packets)
    pair = np.full((len(start), 2), NO_ID, dtype=np.int64)
    for k in range(2):
        ok = start + k < offsets[1:]
        pair[ok, k] = ids[start[ok] + k]
    return pair


def _step_keys(step, lists, at):
    """(offsets, keys) of the storages the rows at `at` list in `lists` (offsets, ids), each keyed with its row's
    step: step << 32 | storage id."""
    offsets, ids = take_rows(lists, at)
    return offsets, np.repeat(step[at], np.diff(offsets)) << 32 | (ids & 0xFFFFFFFF)


def _lookup(mapping, keys):
    """mapping[key] for each key of an int array, NO_ID where absent."""
    if not mapping:
        return np.full(keys.shape, NO_ID, dtype=np.int64)
    known = np.fromiter(mapping, dtype=np.int64, count=len(mapping))
    order = np.argsort(known)
    known, values = known[order], np.fromiter(mapping.values(), dtype=np.int64, count=len(mapping))[order]
    at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    return np.where(known[at] == keys, values[at], NO_ID)


class Roles:
    """The parameters of one run and the category (CATEGORIES) of each of its rows.

    names, numel, embedding, trainable, shape: per parameter storage id (tied weights share one).
    param: per row, the model parameter storage a matmul multiplies by (-1: none).
    category_codes: per row, the index of its category in CATEGORIES (category: their names).
    activation: per weight matmul row, the storage it multiplies the weight with.
    category: per row, one of CATEGORIES. matmul_params: the parameter storages that
    enter a forward matmul (the default N). external: storages of parameters outside
    the model. evaluation: per row, forward work with grad mode off (evaluation_rows). training:
    per row, a forward weight matmul whose work the backward of its step uses (_feeds_backward),
    never an evaluation row."""

    def __init__(self, rows, meta):
        rows = as_rows(rows)
        params = meta.get("parameters")
        if not params:
            raise ReportError(
                f"run {meta.get('run_name')!r} has no parameter metadata, so weight matmuls cannot be told "
                "from activation matmuls; trace it with Tracer(..., model=model)"
            )
        self.names, self.numel, self.embedding, self.trainable, self.shape = {}, {}, {}, {}, {}
        self.model_numel = {}  # per storage: the whole parameter's numel (a DTensor shard's global_shape)
        unsharded = meta.get("unsharded_parameters") or {}  # FSDP2's full parameters, built for the forward
        for name, p in [*params.items(), *unsharded.items()]:
            sid = int(p["storage_id"])
            self.names.setdefault(sid, []).append(name)
            self.numel[sid] = max(self.numel.get(sid, 0), int(p["numel"]))
            whole = prod(int(d) for d in p["global_shape"]) if p.get("global_shape") is not None else int(p["numel"])
            self.model_numel[sid] = max(self.model_numel.get(sid, 0), whole, self.numel[sid])
            self.embedding[sid] = self.embedding.get(sid, False) or bool(p.get("embedding"))
            self.trainable[sid] = self.trainable.get(sid, False) or bool(p.get("trainable", True))
            if p.get("shape") is not None and int(p["numel"]) >= self.numel[sid]:
                self.shape[sid] = tuple(int(d) for d in p["shape"])
        roles = meta.get("storage_roles") or {}
        self.external = {int(s) for s in roles.get(EXTERNAL_ROLE, [])} - set(self.names)
        packets = rows.labels("op").map(packet)
        ins, outs = rows.flat("input_storage_ids"), rows.flat("output_storage_ids")
        stacked = {s for s, shape in self.shape.items() if len(shape) >= 3}  # stacked experts [E, K, N]
        alias = self.alias = copies_of(rows, packets, set(self.names), ins, outs, stacked)  # storage -> its parameter
        external = copies_of(rows, packets, self.external, ins, outs)
        to_grad = gradient_ids(rows, packets, np.asarray(roles.get("gradient", []), dtype=np.int64), ins, outs)

        kind, phase = rows.labels("flop_kind"), rows.labels("phase")
        mm = kind.eq("matmul")
        at = np.flatnonzero(mm)
        mm_packets = packets.take(at)
        pair = _matmul_operands(mm_packets, *take_rows(ins, at))
        hit = _lookup(alias, pair)
        param = np.where(hit[:, 0] != NO_ID, hit[:, 0], hit[:, 1])
        # the multiplied activation of each weight matmul: the operand that is not the weight
        act = np.where(hit[:, 0] != NO_ID, pair[:, 1], pair[:, 0])
        # a weight times a buffer vector of the model (or a copy of one), not times tokens: spectral_norm's power
        # iteration W v, Wᵀ u. A buffer of positions or coordinates multiplied as a matrix (mm) is token work.
        buffers = copies_of(rows, packets, {int(s) for s in roles.get(BUFFER_ROLE, [])}, ins, outs)
        by_buffer = (param != NO_ID) & mm_packets.isin(_VECTOR_PRODUCTS) & (_lookup(buffers, act) != NO_ID)
        param[by_buffer] = NO_ID
        no_hit = param == NO_ID
        ext = no_hit & (
            np.isin(pair, np.fromiter(external, dtype=np.int64, count=len(external))).any(axis=1)
            | mm_packets.isin(PACKED_WEIGHT)
        )
        out_offsets, out_ids = take_rows(outs, at)
        writes_grad = np.zeros(len(at), dtype=bool)
        out_rows = np.repeat(np.arange(len(at)), np.diff(out_offsets))
        writes_grad[out_rows[member(out_ids, to_grad)]] = True
        grad = no_hit & ~ext & writes_grad
        forward, backward = phase.eq("forward"), phase.eq("backward")
        # a trained module outside model= (a GAN's discriminator, a head): its dW = xᵀ @ dL/dy also becomes a
        # gradient, and reads the x its forward multiplied by its external weight, which no model weight multiplied
        model_acts = act[~no_hit & forward[at]]
        ext_fwd = ext & forward[at]
        is_ext = np.isin(pair[ext_fwd], np.fromiter(external, dtype=np.int64, count=len(external)))
        ext_acts = np.where(is_ext[:, 0], pair[ext_fwd][:, 1], pair[ext_fwd][:, 0]) if len(is_ext) else pair[:0, 0]
        theirs = np.zeros(len(at), dtype=bool)
        if len(ext_acts) and grad.any():  # else none: a model without external weights (the lookups skipped)
            theirs = (
                grad
                & np.isin(pair, np.setdiff1d(ext_acts, model_acts)).any(axis=1)
                & ~np.isin(pair, model_acts).any(axis=1)
            )
        grad, ext = grad & ~theirs, ext | theirs
        act[no_hit] = NO_ID
        grad |= self._unstored_weight_gradients(
            rows, at, pair, no_hit & ~ext & ~grad & backward[at], model_acts, param[~no_hit & forward[at]]
        )

        self.param = np.full(len(rows), _NO_PARAM, dtype=np.int64)
        self.param[at] = np.where(no_hit, _NO_PARAM, param)
        self.activation = np.full(len(rows), NO_ID, dtype=np.int64)  # weight matmuls: the activation operand
        self.activation[at] = act
        code = np.full(len(rows), CATEGORIES.index("other"), dtype=np.int8)
        code[kind.eq("attention")] = CATEGORIES.index("attention")
        weight = ~no_hit | grad
        inner = mm_packets.isin(_INNER_PRODUCTS)  # two vectors: never attention's scores or values
        code[at] = np.select(
            [weight, ext, inner | by_buffer],
            [CATEGORIES.index("weight_matmul"), CATEGORIES.index("external_weight"), CATEGORIES.index("other")],
            CATEGORIES.index("attention"),
        )
        self.category_codes = code  # into CATEGORIES
        fwd = mm & forward & (self.param >= 0)
        used = set(self.param[fwd].tolist())
        self.matmul_params = sorted(used | self._idle_siblings(used))
        self.evaluation = evaluation_rows(rows, self.param)
        self.training = self._feeds_backward(rows, np.flatnonzero(fwd), at[backward[at]], ins) & ~self.evaluation
        self.attention_training = self._attention_trained(rows, ins) & ~self.evaluation

    @property
    def category(self):
        """Per row, its category's name (a string array; the sections compare category_codes)."""
        return np.array(CATEGORIES)[self.category_codes]

    def _attention_trained(self, rows, ins):
        """Per row: a forward attention row whose inputs (q and k, the probabilities and v) an attention row of the
        backward of its step reads: training, where an evaluation pass under no_grad saves nothing. In a step that
        re-ran checkpointed work the backward reads the re-run's storages: all of its attention counts as training."""
        out = np.zeros(len(rows), dtype=bool)
        attention, phase = self.category_codes == CATEGORIES.index("attention"), rows.labels("phase")
        fwd = np.flatnonzero(attention & phase.eq("forward"))
        if not len(fwd):
            return out
        step = rows["step"]
        bwd = np.flatnonzero(attention & phase.eq("backward"))
        read = ordered_unique(_step_keys(step, ins, bwd)[1])  # sorted (step, storage)
        f_off, keys = _step_keys(step, ins, fwd)
        hit = member(keys, read)
        read_by = np.zeros(len(fwd), dtype=bool)
        np.logical_or.at(read_by, np.repeat(np.arange(len(fwd)), np.diff(f_off)), hit)
        out[fwd] = read_by | np.isin(step[fwd], step[_recomputed(rows)])
        return out

    def _feeds_backward(self, rows, at, bwd, ins):
        """Per row: a forward weight matmul (rows `at`) whose work a backward matmul of the same step
        (rows `bwd`) uses: grad mode, training.

        A row whose grad_mode says grad mode was off is never training (Roles.evaluation); for the others
        (grad mode on, or a trace before v4 that does not say) this reads it from the storages: in grad mode,
        y = x @ W saves x for dL/dW = xᵀ @ dL/dy (a backward matmul that reads x when W is
        trained) or W for dL/dx = dL/dy @ Wᵀ (one that reads W: a frozen weight whose input
        needs a gradient). A row whose activation (or frozen weight) no backward matmul of its
        step reads computed nothing the backward needs: an evaluation pass under no_grad, or a
        frozen weight whose input needs no gradient. Activation checkpointing saves no
        activations and re-runs the forward in the backward on new storages: in a step with
        recomputed rows, a forward row is training work when a recomputed row multiplies by the
        same weight or a backward matmul reads that weight (the dL/dx of the layers its early
        stop did not re-run). NB: in a trace before v4 (no grad_mode), an evaluation on the very
        batch the step trains on counts its first layer (whose input is that batch) as training
        work, and so does an evaluation in a checkpointed step."""
        out = np.zeros(len(rows), dtype=bool)
        if not len(at):
            return out
        step = rows["step"]
        _, read = _step_keys(step, ins, bwd)
        # a copy of a weight the backward reads is the weight: under autocast a checkpoint's re-run casts it
        # again, and the dL/dx of a layer its early stop did not re-run reads that new cast
        source = _lookup(self.alias, read & 0xFFFFFFFF)
        copied = source != NO_ID
        read = ordered_unique(np.concatenate([read, (read[copied] >> 32) << 32 | (source[copied] & 0xFFFFFFFF)]))
        param = self.param
        frozen = [s for s, trained in self.trainable.items() if not trained]
        by_weight = np.isin(param[at], np.array(frozen, dtype=np.int64))  # a frozen weight: its dL/dx reads it
        again = _recomputed(rows)
        redo = step[again & (param >= 0)] << 32 | (param[again & (param >= 0)] & 0xFFFFFFFF)
        by_weight |= np.isin(step[at], step[again])  # checkpointed steps: a weight the backward reads was trained
        keyed = [np.where(v != NO_ID, step[at] << 32 | (v & 0xFFFFFFFF), -1) for v in (self.activation[at], param[at])]
        used = member(keyed[0], read) | (by_weight & member(keyed[1], read)) | np.isin(keyed[1], redo)
        out[at] = used
        return out

    def _unstored_weight_gradients(self, rows, at, pair, candidates, acts, params):
        """Among `candidates` (positions into `at`): the dW of a gradient that never becomes a `.grad`
        (torch.func.grad and its vmap per-sample gradients, autograd.grad). Such a row reads the input x
        of a forward matmul with weight W and its output has W's matrix shape [..., K, N] (or [..., N, K])."""
        found = np.zeros(len(at), dtype=bool)
        if not candidates.any() or not len(acts) or "output_shapes" not in rows:
            return found
        # the forward rows whose weight is a matrix (2 dims or more), each weight's shape looked up once
        weights = unique(params)
        by_matrix = weights[[len(self.shape.get(p, ())) >= 2 for p in weights.tolist()]]
        mine = np.isin(params, by_matrix)
        acts, params = acts[mine], params[mine]
        reads = np.isin(pair, acts).any(axis=1) & candidates
        picked = np.flatnonzero(reads)
        if not len(picked):
            return found
        mine = np.isin(acts, pair[picked])  # only the activations the picked rows read
        matrix = {}  # activation storage -> the matrix shapes of the weights it multiplies
        for a, p in zip(acts[mine].tolist(), params[mine].tolist()):
            shape = self.shape[p]
            matrix.setdefault(a, set()).update({shape[-2:], shape[-2:][::-1]})
        for k, shapes in zip(picked.tolist(), rows.cells("output_shapes", at[picked])):
            out = tuple(int(d) for d in shapes[0]) if shapes is not None and len(shapes) else ()
            found[k] = len(out) >= 2 and any(out[-2:] in matrix.get(a, ()) for a in pair[k].tolist())
        return found

    def _idle_siblings(self, used):
        """Parameters that enter no matmul but are named like one that does, up to its last index, with its
        shape: an expert that no token was routed to in the step (a loop over experts skips it) is still one
        of the model's E experts, in N with a share of 0 tokens."""

        def key(sid, name):
            return re.sub(r"\.\d+\.(?!.*\.\d+\.)", ".*.", name), self.shape.get(sid)

        keys = {key(s, n) for s in used for n in self.names.get(s, ()) if re.search(r"\.\d+\.", n)}
        return {
            s
            for s, names in self.names.items()
            if s not in used and self.shape.get(s) is not None and any(key(s, n) in keys for n in names)
        }

    def label(self, sid):
        return " = ".join(self.names.get(sid, [f"storage {sid}"]))
