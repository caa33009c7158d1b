"""Measured FLOPs per phase against the 2·N·T / 4·N·T / 6·N·T heuristic, and the residual in words.

The heuristic (CS336 lecture 2): a training step over T tokens of a model with N
parameters costs 2·N·T FLOPs forward (each weight multiplies each token once: a
multiply and an add) and 4·N·T backward (per weight matmul y = x @ W, the input
gradient dL/dx = dL/dy @ Wᵀ and the weight gradient dL/dW = xᵀ @ dL/dy), 6·N·T
in all. `breakdown` sets the traced FLOPs beside it and splits them three ways:

  weight_matmul_flops  matmul rows that multiply by a parameter (forward y = x @ W
                       and backward dL/dx = dL/dy @ Wᵀ: a parameter, or a cast copy
                       of one under autocast, is an operand) or that compute a
                       parameter's gradient (dL/dW = xᵀ @ dL/dy: the output becomes,
                       directly or through one cast/add, a `gradient` storage)
  attention_flops      the other matmul rows, which multiply two activations
                       (q @ kᵀ, softmax(...) @ v and their backward), plus fused
                       attention kernels (flop_kind "attention")
  other_flops          everything else: elementwise, normalisation, softmax, loss,
                       convolutions, the optimizer's _foreach ops

N, chosen with `n`:
  "matmul"         (default) the parameters whose storage enters a matmul in the
                   forward phase as a multiplied operand (not addmm's bias); tied
                   weights share one storage and count once. The output head counts.
  "total"          every parameter (metadata params.total), embeddings included
  "non_embedding"  params.total minus the nn.Embedding tables (a tied output head
                   is then left out too)
  an int           your own N

T is the run's tokens per step (metadata `tokens`, set by Tracer(tokens=...)) unless
`tokens` is given. All FLOP columns are per training step: the traced totals
divided by `steps`, the number of steps with forward or backward ops.
"""

import pandas as pd

from reports.errors import ReportError
from reports.load import require, runs_of
from reports.tables import combine, count_steps, several_runs, split_runs, step_divisor

__all__ = ["breakdown", "explain"]

N_CHOICES = ("matmul", "total", "non_embedding")
_COLUMNS = ("run", "step", "phase", "op", "flops", "flop_kind", "input_storage_ids", "output_storage_ids")

# Ops whose first tensor input is added to the product, not multiplied (bias + a @ b).
_ADD_FIRST = frozenset(
    "aten.addmm aten.addmm_ aten.addmv aten.addmv_ aten.addr aten.addr_ "
    "aten.baddbmm aten.baddbmm_ aten.addbmm aten.addbmm_".split()
)
# Ops that copy a tensor into a new storage: a parameter's copy (autocast's bf16 weight) is still the weight.
_COPY_OPS = frozenset("aten._to_copy aten.clone aten.copy_ aten._to_dtype".split())


def _packet(op):
    return str(op).rsplit(".", 1)[0]


def _ids(x):
    return [int(i) for i in x] if x is not None else []


def operands(op, input_ids):
    """The two multiplied inputs of a matmul row (addmm's bias is skipped)."""
    ids = _ids(input_ids)
    start = 1 if _packet(op) in _ADD_FIRST else 0
    return ids[start : start + 2]


class _Roles:
    """Which matmul rows of one run multiply by a weight or compute a weight's gradient."""

    def __init__(self, rows, meta):
        params = meta.get("parameters")
        if not params:
            raise ReportError(
                f"run {meta.get('run_name')!r} has no parameter metadata, so weight matmuls cannot be told "
                "from activation matmuls; trace it with Tracer(..., model=model)"
            )
        self.names = {}  # storage id -> parameter names
        self.numel = {}
        self.embedding = {}
        self.trainable = {}
        unsharded = meta.get("unsharded_parameters") or {}  # FSDP2's full parameters in the forward
        for name, p in [*params.items(), *unsharded.items()]:
            sid = int(p["storage_id"])
            self.names.setdefault(sid, []).append(name)
            self.numel[sid] = max(self.numel.get(sid, 0), int(p["numel"]))
            self.embedding[sid] = self.embedding.get(sid, False) or bool(p.get("embedding"))
            self.trainable[sid] = self.trainable.get(sid, False) or bool(p.get("trainable", True))
        gradients = set((meta.get("storage_roles") or {}).get("gradient", []))
        packets = rows["op"].astype(object).map(_packet)

        # Copies of parameters (autocast casts each weight to bf16 before its matmul).
        self.alias = {sid: sid for sid in self.names}
        copies = packets.isin(_COPY_OPS)
        for op, ins, outs in zip(packets[copies], rows.loc[copies, "input_storage_ids"],
                                 rows.loc[copies, "output_storage_ids"]):
            ins, outs = _ids(ins), _ids(outs)
            src = ins[1] if op == "aten.copy_" and len(ins) > 1 else (ins[0] if ins else None)
            if src in self.alias:
                for o in outs:
                    self.alias.setdefault(o, self.alias[src])

        # Storages that become a gradient through one cast or add (bf16 dW cast to fp32, tied weights summed).
        hop = rows["phase"].isin(("backward", "other")) & rows["flop_kind"].isin(("none", "elementwise", "collective"))
        to_grad = set(gradients)
        hops = list(zip(rows.loc[hop, "input_storage_ids"], rows.loc[hop, "output_storage_ids"]))
        for ins, outs in reversed(hops):  # last op first: a chain cast -> add -> gradient is followed back
            if to_grad.intersection(_ids(outs)):
                to_grad.update(_ids(ins))

        # Per matmul row: the parameter it multiplies by (or -1) and whether it makes a weight gradient.
        mm = rows["flop_kind"].astype(object) == "matmul"
        param, grad = [], []
        for op, ins, outs in zip(rows.loc[mm, "op"], rows.loc[mm, "input_storage_ids"],
                                 rows.loc[mm, "output_storage_ids"]):
            hit = [self.alias[s] for s in operands(op, ins) if s in self.alias]
            param.append(hit[0] if hit else -1)
            grad.append(not hit and bool(to_grad.intersection(_ids(outs))))
        self.param = pd.Series(-1, index=rows.index, dtype="int64")
        self.param[mm] = pd.Series(param, index=rows.index[mm], dtype="int64")
        self.weight_grad = pd.Series(False, index=rows.index)
        self.weight_grad[mm] = pd.Series(grad, index=rows.index[mm], dtype=bool)
        weight = mm & ((self.param >= 0) | self.weight_grad)
        attention = (mm & ~weight) | (rows["flop_kind"].astype(object) == "attention")
        self.category = pd.Series("other", index=rows.index, dtype=object)
        self.category[weight] = "weight_matmul"
        self.category[attention] = "attention"
        fwd = mm & (rows["phase"] == "forward") & (self.param >= 0)
        self.matmul_params = sorted(set(self.param[fwd]))

    def label(self, sid):
        return " = ".join(self.names.get(sid, [f"storage {sid}"]))


def _n_value(n, meta, roles, what):
    params = meta.get("params") or {}
    if n == "matmul":
        return sum(roles.numel[s] for s in roles.matmul_params)
    if n in ("total", "non_embedding"):
        if "total" not in params:
            raise ReportError(f"{what}: run {meta.get('run_name')!r} has no parameter counts; "
                              "trace it with Tracer(model=...) or pass n=<int>")
        return int(params["total"]) - (int(params.get("embedding", 0)) if n == "non_embedding" else 0)
    return int(n)


def _check_n(n, what):
    if isinstance(n, str) and n in N_CHOICES:
        return
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        return
    raise ReportError(f"{what}: n must be one of {', '.join(map(repr, N_CHOICES))} or a positive int, got {n!r}")


def _tokens(tokens, meta, what):
    if tokens is not None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise ReportError(f"{what}: tokens must be a positive int (tokens per training step), got {tokens!r}")
        return tokens
    t = meta.get("tokens")
    if not t:
        raise ReportError(
            f"{what}: run {meta.get('run_name')!r} has no tokens per step in its metadata; pass tokens=<tokens per "
            "training step> or trace with Tracer(..., tokens=batch*seq_len)"
        )
    return int(t)


def _analyse(df, n, tokens, what):
    """Per run: (run, rows, meta, roles, N, T, steps)."""
    _check_n(n, what)
    require(df, _COLUMNS, what)
    runs = runs_of(df)
    out = []
    for run, rows in split_runs(df):
        meta = runs[run]
        roles = _Roles(rows, meta)
        n_value, t_value = _n_value(n, meta, roles, what), _tokens(tokens, meta, what)
        out.append((run, rows, meta, roles, n_value, t_value, count_steps(rows)))
    return out


_EXPECT = {"forward": 2, "backward": 4, "total": 6}
_FLOAT_COLS = ("flops", "weight_matmul_flops", "attention_flops", "other_flops")


def breakdown(df, n="matmul", tokens=None):
    """One row per phase (forward, backward, optimizer, other when present, total) per run.

    Columns (FLOPs per training step): flops (measured), expected_flops (2·N·T, 4·N·T,
    6·N·T; NaN for the optimizer and other phases), ratio (flops / expected_flops),
    weight_matmul_flops + attention_flops + other_flops (= flops), then steps (traced
    steps the totals were divided by), n_params (N), n_kind (which N: "matmul",
    "total", "non_embedding" or "given") and tokens (T, tokens per step).
    See the module docstring for N, T and the split."""
    columns = ["phase", *_FLOAT_COLS[:1], "expected_flops", "ratio", *_FLOAT_COLS[1:], "steps", "n_params",
               "n_kind", "tokens"]
    dtypes = {"phase": object, **{c: "float64" for c in _FLOAT_COLS}, "expected_flops": "float64", "ratio": "float64",
              "steps": "int64", "n_params": "int64", "n_kind": object, "tokens": "int64"}
    frames = []
    for run, rows, meta, roles, N, T, steps in _analyse(df, n, tokens, "breakdown"):
        phases = ["forward", "backward", "optimizer"] + (["other"] if (rows["phase"] == "other").any() else [])
        records = []
        # each phase over the steps it ran in: a trace cut mid-step has fewer backward than forward steps
        ph = rows["phase"].astype(object)
        divisor = step_divisor(rows)
        for phase in phases + ["total"]:
            sel = rows if phase == "total" else rows[ph == phase]
            cat = roles.category[sel.index]
            f = sel["flops"] / divisor[sel.index]
            rec = {"phase": phase, "flops": f.sum()}
            for c in ("weight_matmul", "attention", "other"):
                rec[f"{c}_flops"] = f[cat == c].sum()
            k = _EXPECT.get(phase)
            rec["expected_flops"] = float(k * N * T) if k else float("nan")
            rec["ratio"] = rec["flops"] / rec["expected_flops"] if k and N * T else float("nan")
            rec.update(steps=steps, n_params=N, n_kind=n if isinstance(n, str) else "given", tokens=T)
            records.append(rec)
        frames.append((run, pd.DataFrame.from_records(records)))
    return combine(frames, columns, dtypes, several_runs(df))


# the residual in words ------------------------------------------------------------------------
def attention_recompute_flops(rows):
    """FLOPs the fused attention backward kernels spend recomputing the scores q @ kᵀ.

    The tracer counts such a backward as 2·b·h·s_q·s_k·(3·d_qk + 2·d_v): five
    score-sized matmuls where four are needed (dP = dO @ vᵀ, dV = Pᵀ @ dO, dQ = dS @ k,
    dK = dSᵀ @ q); the fifth, 2·b·h·s_q·s_k·d_qk, recomputes q @ kᵀ. Every backward
    kernel takes (grad_out, q, k, v, ...), all with the head dimension last."""
    bwd = rows[(rows["flop_kind"].astype(object) == "attention") & (rows["phase"] == "backward")]
    total = 0
    for flops, shapes in zip(bwd["flops"], bwd["input_shapes"] if "input_shapes" in bwd else [None] * len(bwd)):
        flops = int(flops)
        try:
            d_qk, d_v = int(shapes[1][-1]), int(shapes[3][-1])
            total += flops * d_qk // (3 * d_qk + 2 * d_v)
        except (TypeError, IndexError, ValueError, ZeroDivisionError):
            total += flops // 5  # d_qk == d_v: one of five score-sized matmuls
    return total


def _f(x):
    return f"{x:,.0f}"


def _x(part, whole):
    return f"{part / whole:.3f}" if whole else "n/a"


def _pct(part, whole):
    return f"{100 * part / whole:.1f}%" if whole else "n/a"


def explain(df, n="matmul", tokens=None):
    """The gap between the traced FLOPs and 6·N·T, in sentences with the figures (per step).

    One block of lines per run, its first line starting with the run name: the totals
    against the heuristic, then the residual term by term: attention (activation x
    activation matmuls, the 12·L·d·S·T-like term), the fused attention backward's
    recomputation, the output head, inputs that need no gradient, embeddings and
    other parameters outside N, the optimizer, and the remaining elementwise ops."""
    require(df, ["input_shapes"], "explain")
    lines = []
    for run, rows, meta, roles, N, T, steps in _analyse(df, n, tokens, "explain"):
        lines.extend(_explain_run(run, rows, meta, roles, n, N, T, steps))
    return lines


def _explain_run(run, rows, meta, roles, n, N, T, k):
    ph = rows["phase"].astype(object)
    cat = roles.category
    flops = rows["flops"] / step_divisor(rows)  # per step, each phase over its own steps

    def per_step(mask):
        return flops[mask].sum()

    fwd, bwd, opt = per_step(ph == "forward"), per_step(ph == "backward"), per_step(ph == "optimizer")
    total = flops.sum()
    not_opt = ph != "optimizer"
    wm = per_step(not_opt & (cat == "weight_matmul"))
    att = per_step(not_opt & (cat == "attention"))
    other = per_step(not_opt & (cat == "other"))
    n_desc = {
        "matmul": "parameters that multiply activations in a matmul (tied weights once)",
        "total": "parameters in all",
        "non_embedding": "non-embedding parameters",
    }.get(n, "parameters (given)")
    out = [
        f"{run}: per training step ({k} step{'s' if k != 1 else ''} traced; T = {T:,} tokens per step; "
        f"N = {N:,} {n_desc}): forward {_f(fwd)} FLOPs = {_x(fwd, 2 * N * T)} x 2·N·T, backward {_f(bwd)} = "
        f"{_x(bwd, 4 * N * T)} x 4·N·T, all phases {_f(total)} = {_x(total, 6 * N * T)} x 6·N·T."
    ]
    out.append(
        f"Residual: all phases - 6·N·T = {_f(total - 6 * N * T)} FLOPs = weight matmuls - 6·N·T "
        f"({_f(wm - 6 * N * T)}) + attention ({_f(att)}) + other ops ({_f(other)}) + the optimizer ({_f(opt)})."
    )

    # Weight matmuls, forward: 2 FLOPs per weight per token.
    mm_params = roles.matmul_params
    n_mm = sum(roles.numel[s] for s in mm_params)
    is_fwd, is_bwd = ph == "forward", ph == "backward"
    fwd_wm = per_step(is_fwd & (cat == "weight_matmul"))
    if n_mm:
        line = (
            f"Forward weight matmuls: {_f(fwd_wm)} FLOPs = {fwd_wm / (n_mm * T):.2f}·N·T with the {n_mm:,} parameters "
            f"that enter a matmul: each weight multiplies each token once, a multiply and an add."
        )
        if round(fwd_wm) > 2 * n_mm * T:
            line += " Above 2·N·T: some weight enters more than one matmul per token (shared, or called twice)."
        out.append(line)

    # Backward weight matmuls: dL/dW for every trainable weight, dL/dx only where x needs a gradient.
    bwd_wm = per_step(is_bwd & (cat == "weight_matmul"))
    if n_mm:
        fwd_by_param = flops[is_fwd & (roles.param >= 0)].groupby(roles.param[is_fwd & (roles.param >= 0)]).sum() / k
        dx_by_param = flops[is_bwd & (roles.param >= 0)].groupby(roles.param[is_bwd & (roles.param >= 0)]).sum() / k
        skipped = {s: fwd_by_param[s] - dx_by_param.get(s, 0) for s in fwd_by_param.index
                   if fwd_by_param[s] - dx_by_param.get(s, 0) > 0}
        frozen = [s for s in mm_params if not roles.trainable.get(s, True)]
        if abs(bwd_wm - 4 * n_mm * T) < 0.5:
            out.append(
                f"Backward weight matmuls: {_f(bwd_wm)} FLOPs = 4·N·T: for each y = x @ W, dL/dx = dL/dy @ Wᵀ "
                f"and dL/dW = xᵀ @ dL/dy, each as large as the forward matmul."
            )
        else:
            line = (
                f"Backward weight matmuls: {_f(bwd_wm)} FLOPs = {bwd_wm / (n_mm * T):.2f}·N·T, not 4·N·T "
                f"({_f(4 * n_mm * T)})."
            )
            if skipped:
                parts = [f"{roles.label(s)} ({roles.numel[s]:,} parameters: {_f(v)} FLOPs)" for s, v in skipped.items()]
                line += (
                    f" {_f(sum(skipped.values()))} FLOPs of input gradients dL/dx = dL/dy @ Wᵀ are never computed "
                    f"because the input x needs no gradient: it is data (or comes from layers that need no "
                    f"gradient), so autograd skips it. Skipped: {'; '.join(parts)}. "
                    f"For the lecture's y = x @ w with x not requiring grad, the backward is 2·N·T, not 4·N·T."
                )
            if frozen:
                line += (f" Frozen weights (requires_grad=False) skip dL/dW: "
                         f"{', '.join(roles.label(s) for s in frozen)}.")
            if bwd_wm > 4 * n_mm * T:
                line += (" Above 4·N·T: forward matmuls run again in the backward (activation checkpointing) "
                         "or a weight is used more than once.")
            out.append(line)

    # Attention: activation x activation matmuls and fused kernels.
    att_fwd = per_step(is_fwd & (cat == "attention"))
    att_bwd = per_step(is_bwd & (cat == "attention"))
    if att_fwd or att_bwd:
        lsd = att_fwd / (4 * T)
        out.append(
            f"Attention: {_f(att_fwd + att_bwd)} FLOPs ({_pct(att_fwd + att_bwd, fwd + bwd)} of forward + backward) "
            f"multiply activations by activations (q @ kᵀ and softmax(·) @ v), so no parameter accounts for them "
            f"and 6·N·T leaves them out: forward {_f(att_fwd)} = 4·T·(L·S·d) with L·S·d = {lsd:,.0f} (layers x "
            f"sequence length x width), backward {_f(att_bwd)} ({_x(att_bwd, att_fwd)} x forward). With a backward "
            f"of twice the forward this is the 12·L·d·S·T term; it grows with the sequence length S."
        )
        kernels = rows[(rows["flop_kind"].astype(object) == "attention")]
        k_fwd, k_bwd = kernels["flops"][kernels["phase"] == "forward"].sum() / k, \
            kernels["flops"][kernels["phase"] == "backward"].sum() / k
        if k_bwd:
            recompute = attention_recompute_flops(rows) / k
            ops = ", ".join(sorted(set(kernels.loc[kernels["phase"] == "backward", "op"].astype(str))))
            out.append(
                f"Recomputation: the fused attention backward ({ops}) counts {_x(k_bwd, k_fwd)} x its forward "
                f"({_f(k_bwd)} vs {_f(k_fwd)} FLOPs) because it keeps no score matrix and recomputes q @ kᵀ: "
                f"{_f(recompute)} FLOPs of recomputation, which reports.mfu leaves out of the model FLOPs "
                f"(a backward needs 2x the forward, this one does 2.5x)."
            )
        causal = rows["causal"].astype("boolean").fillna(False) if "causal" in rows else None
        if causal is not None and causal[rows["flop_kind"].astype(object) == "attention"].any():
            out.append("Causal attention: the full score matrix is counted (as PaLM does), though a causal kernel "
                       "can skip the masked half.")

    # The output head: the last weight matmul of the forward.
    fwd_w = rows[is_fwd & (roles.param >= 0)]
    if len(set(roles.param[fwd_w.index])) > 1:
        head = int(roles.param[fwd_w.index[-1]])
        head_f = per_step(is_fwd & (roles.param == head))
        tied = roles.embedding.get(head, False)
        line = (
            f"Output head: {roles.label(head)} ({roles.numel[head]:,} parameters{', tied to the embedding' if tied else ''}) "
            f"costs {_f(head_f)} FLOPs forward ({_pct(head_f, fwd)} of the forward) and about twice that backward."
        )
        if n == "non_embedding" and tied:
            line += (f" n='non_embedding' leaves the embedding out of N, and with it this head: its "
                     f"{_f(3 * head_f)} FLOPs per step are above 6·N·T.")
        elif n == "non_embedding":
            line += " It is not an embedding, so the non-embedding N counts it."
        elif n in ("matmul", "total"):
            line += " It is counted in N."
        out.append(line)

    # Parameters in N that do no matmul (embeddings, biases, norms), and matmul weights N leaves out.
    if n in ("total", "non_embedding") and N != n_mm:
        in_mm = set(mm_params)
        emb = sum(v for s, v in roles.numel.items() if s not in in_mm and roles.embedding.get(s))
        rest = sum(v for s, v in roles.numel.items() if s not in in_mm and not roles.embedding.get(s))
        left_out = [s for s in mm_params if roles.embedding.get(s)] if n == "non_embedding" else []
        parts = []
        if emb and n == "total":
            parts.append(f"+{emb:,} embedding parameters, looked up rather than multiplied (0 matmul FLOPs)")
        if rest:
            parts.append(f"+{rest:,} parameters of biases and norms, added or multiplied elementwise (a few "
                         "FLOPs per token each, in the other ops)")
        if left_out:
            parts.append(f"-{sum(roles.numel[s] for s in left_out):,} parameters of "
                         f"{', '.join(roles.label(s) for s in left_out)}, an embedding that also multiplies in "
                         "a matmul (a tied output head), which n='non_embedding' leaves out")
        if parts:
            out.append(f"N = {N:,}, not the {n_mm:,} parameters that enter a matmul: {'; '.join(parts)}. "
                       f"So 6·N·T differs from 6·T x the matmul parameters by {_f(6 * (N - n_mm) * T)} FLOPs.")

    # The optimizer.
    if opt:
        total_params = (meta.get("params") or {}).get("total") or sum(roles.numel.values())
        out.append(
            f"Optimizer: {_f(opt)} FLOPs per step ({opt / total_params:.1f} per parameter, whatever T is), outside "
            f"6·N·T; its _foreach ops count 1 FLOP per element (tracer/flops.py), so this is a lower bound."
        )
    elif not (ph == "optimizer").any():
        out.append("Optimizer: no optimizer step in the trace.")

    # Everything else.
    other_mask = (is_fwd | is_bwd) & (cat == "other")
    other_fb = per_step(other_mask)
    if other_fb:
        kinds = (flops[other_mask].groupby(rows.loc[other_mask, "flop_kind"].astype(object)).sum() / k)
        kinds = kinds[kinds > 0].sort_values(ascending=False)
        out.append(
            f"Other ops: {_f(other_fb)} FLOPs in forward + backward ({_pct(other_fb, fwd + bwd)} of them; "
            f"{', '.join(f'{kind} {_f(v)}' for kind, v in kinds.items())}), outside the matmul heuristic"
            + (": convolutions reuse each weight at every position, so their weights are not in the matmul N."
               if "conv" in kinds.index else ".")
        )
    return out
