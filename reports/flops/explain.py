"""The gap between the traced FLOPs and 6·N·T, in sentences with the figures (per step).

Every figure here is a per-step figure from reports.steps.per_step, so a trace of k
identical steps says exactly what a trace of one says (but for the step count).
"""

import numpy as np

from reports._util import pct, tokens_text
from reports.flops.accounting import analyse, name_pattern, routing
from reports.flops.attention_words import causal_line, kernel_words
from reports.flops.recompute import attention_recompute, checkpoint_recompute
from reports.flops.roles import CATEGORIES
from reports.flops.rows import frame_of, per_step

__all__ = ["explain"]

_N_DESC = {
    "matmul": "parameters that multiply activations in a matmul (tied weights once)",
    "total": "parameters in all",
    "non_embedding": "non-embedding parameters",
    "given": "parameters (given)",
}


def _text(value):
    """A string cell as pandas' astype(str) writes it: "nan" for a null."""
    return "nan" if value is None else str(value)


def _f(x):
    return f"{x:,.0f}"


def _x(part, whole):
    return f"{part / whole:.3f}" if whole else "n/a"


def _pct(part, whole):
    return f"{pct(part, whole):.1f}%" if whole else "n/a"


def explain(df, n="matmul", tokens=None, accounts=None):
    """The gap between the traced FLOPs and 6·N·T, in sentences with the figures (per step).

    One block of lines per run, its first line starting with the run name: the totals
    against the heuristic, then the residual term by term: attention (activation x
    activation matmuls, the 12·L·d·S·T-like term), the fused attention backward's
    recomputation, activation checkpointing, weights outside the model, the output
    head, inputs that need no gradient, embeddings and other parameters outside N,
    the optimizer, and the remaining elementwise ops. `accounts`: as for `breakdown`."""
    return explain_lines(frame_of(df) if accounts is None else None, n, tokens, accounts)


def explain_lines(frame, n="matmul", tokens=None, accounts=None):
    """`explain` of a reports.flops.rows.Frame (or of `accounts`)."""
    lines = []
    for acc in analyse(frame, n, tokens, "explain", columns=("input_shapes",)) if accounts is None else accounts:
        lines.extend(_Run(acc).lines())
    return lines


def cycles_note(meta):
    """The sentence for a trace whose forward/backward cycles no step boundary split (tracer.recording.steps), or None."""
    cycles = meta.get("cycles_without_step") or 0
    if cycles < 2:
        return None
    return (
        f"{cycles} forward/backward cycles were seen with no optimizer step: call tr.step() once per iteration "
        f"(or step an optimizer) so that a step is one iteration."
    )


class _Run:
    """One run's explanation; each method adds the lines of one term."""

    def __init__(self, acc):
        self.acc, self.rows, self.roles = acc, acc.rows, acc.roles
        self.N, self.T = acc.N, acc.T
        ph = self.rows.labels("phase")
        self.cat = {name: self.roles.category_codes == i for i, name in enumerate(CATEGORIES)}  # a mask per category
        self.is_fwd, self.is_bwd, self.is_opt = ph.eq("forward"), ph.eq("backward"), ph.eq("optimizer")
        self.recompute = checkpoint_recompute(self.rows)
        self.kind = self.rows.labels("flop_kind")
        self.kernel = self.kind.eq("attention")
        self.out = []
        self.routed = acc.n_active < self._n_mm() - 0.5  # some weights multiply fewer than T tokens: experts
        # forward weight matmuls of training (grad mode: a backward of their step reads them), reports/flops/roles.py
        self.train_fwd = self.is_fwd & self.roles.training
        self.idle_fwd = self.is_fwd & (self.roles.param >= 0) & ~self.roles.training
        self.no_backward = not self.is_bwd.any()  # an inference or evaluation trace
        if self.no_backward:  # a forward-only trace: all of its forward is the forward
            self.train_fwd, self.idle_fwd = self.is_fwd & (self.roles.param >= 0), self.is_fwd & False

    def ps(self, mask=None, by=None, values="flops"):
        return per_step(self.rows, values=values, mask=mask, by=by)

    def lines(self):
        unsplit = cycles_note(self.acc.meta)
        if unsplit:  # several iterations in one step: the excess over 6·N·T is theirs, not worth explaining
            self.totals()
            self.out.append(unsplit)
            return self.out
        # One method per term, in the order they are said; a new term is a method added here.
        for term in (
            self.totals,
            self.experts,
            self.forward_weights,
            self.no_grad_forward,
            self.backward_weights,
            self.attention,
            self.checkpointing,
            self.external,
            self.head,
            self.n_parts,
            self.conv_weights,
            self.optimizer,
            self.other_ops,
            self.uncounted,
        ):
            term()
        return self.out

    def totals(self):
        acc, N, T, cat = self.acc, self.N, self.T, self.cat
        not_opt = ~self.is_opt
        fwd, bwd, total = self.ps(self.is_fwd), self.ps(self.is_bwd), self.ps()
        ext_fwd, ext_bwd = self.ps(self.is_fwd & cat["external_weight"]), self.ps(self.is_bwd & cat["external_weight"])
        ext = self.ps(cat["external_weight"])
        wm, att = self.ps(not_opt & cat["weight_matmul"]), self.ps(not_opt & cat["attention"])
        other, opt = self.ps(not_opt & cat["other"]), self.ps(self.is_opt)
        k = acc.steps
        own = " of the model's own (less the weights outside it)" if ext else ""
        self.out.append(
            f"{acc.run}: per training step ({k} step{'s' if k != 1 else ''} traced; T = {tokens_text(T)} tokens per step; "
            f"N = {N:,} {_N_DESC[acc.n_kind]}): forward {_f(fwd - ext_fwd)} FLOPs{own} = {_x(fwd - ext_fwd, 2 * N * T)} x 2·N·T, "
            f"backward {_f(bwd - ext_bwd)} = {_x(bwd - ext_bwd, 4 * N * T)} x 4·N·T, all phases {_f(total - ext)} = "
            f"{_x(total - ext, 6 * N * T)} x 6·N·T."
        )
        if acc.N_model != N:
            self.out.append(
                f"Tensor parallelism: the model has N = {acc.N_model:,} parameters; this rank's matmuls multiply by its "
                f"shards of them, N = {N:,} ({N / acc.N_model:.3g} of the model), so its figures are set against "
                f"2·N·T with that N."
            )
        outside = f" + weights outside the model ({_f(ext)})" if ext else ""
        n_a = acc.n_active
        weights = (
            f"weight matmuls - 6·N_active·T ({_f(wm - 6 * n_a * T)}) - 6·(N - N_active)·T for the parameters "
            f"a token does not use ({_f(6 * (N - n_a) * T)})"
            if self.routed
            else f"weight matmuls - 6·N·T ({_f(wm - 6 * N * T)})"
        )
        self.out.append(
            f"Residual: all phases - 6·N·T = {_f(total - 6 * N * T)} FLOPs = {weights} + attention ({_f(att)}){outside} + other ops ({_f(other)}) + the optimizer "
            f"({_f(opt)})."
        )

    def experts(self):
        """Mixture of experts: the parameters a token uses (N_active) against all of them."""
        if not self.routed:
            return
        acc, roles, T = self.acc, self.roles, self.T
        routed = {s: v for s, v in acc.shares.items() if v < 1 - 1e-9}
        kinds = {routing(roles, s, routed) for s in routed}
        moe = any(k and e > 1 for e, k in kinds)
        ((e, k),) = kinds if len(kinds) == 1 else ((0, 0),)
        names = sorted({name_pattern(roles.label(s)) for s in routed})
        line = (
            f"{'Mixture of experts' if moe else 'Weights partly used'}: N = {self.N:,} parameters, of which each "
            f"token uses N_active = {acc.n_active:,.0f}{f' (top-{k} of {e} experts)' if moe and k else ''}: "
            f"{'each routed weight' if moe else 'a weight that multiplies fewer than T tokens, or only a slice of which enters a matmul,'} "
            f"counts its parameters x the share of the T tokens it multiplied "
            f"({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}). Forward weight matmuls = 2·N_active·T = "
            f"{_f(2 * acc.n_active * T)} FLOPs, backward 4·N_active·T, all phases 6·N_active·T = "
            f"{_f(6 * acc.n_active * T)}; the optimizer updates all {self._n_total():,} parameters."
        )
        if (
            "flops_bound" in self.rows
            and (
                self.train_fwd
                & np.isin(self.roles.param, np.array(list(routed), dtype=np.int64))
                & self.rows.flag("flops_bound")
            ).any()
        ):
            line += (
                " N_active is an upper bound: the routed weights' forward FLOPs it is measured from are upper "
                "bounds (flops_bound: their group sizes could not be read, meta or fake tensors), exact only "
                "if every row of their operands is routed."
            )
        if len(routed) == len(acc.shares) > 1 and len({round(v, 9) for v in routed.values()}) == 1:
            line += " Every weight multiplied the same fewer tokens than T: is tokens= the tokens per step?"
        self.out.append(line)

    def _n_total(self):
        return int((self.acc.meta.get("params") or {}).get("total") or sum(self.roles.numel.values()))

    def _n_mm(self):
        return sum(self.roles.numel[s] for s in self.roles.matmul_params)

    def forward_weights(self):
        n_mm, T, roles = self._n_mm(), self.T, self.roles
        if not n_mm:
            return
        fwd_wm = self.ps(self.train_fwd & self.cat["weight_matmul"])
        if self.routed:
            line = (
                f"Forward weight matmuls: {_f(fwd_wm)} FLOPs = {fwd_wm / (self.acc.n_active * T):.2f}·N_active·T "
                f"= {fwd_wm / (n_mm * T):.2f}·N·T: each token multiplies the N_active = {self.acc.n_active:,.0f} "
                f"parameters it uses once, a multiply and an add."
            )
        else:
            line = (
                f"Forward weight matmuls: {_f(fwd_wm)} FLOPs = {fwd_wm / (n_mm * T):.2f}·N·T with the {n_mm:,} "
                f"parameters that enter a matmul: each weight multiplies each token once, a multiply and an add."
            )
        shared = {s: v for s, v in self.acc.shares.items() if v > 1 + 1e-9}
        if shared and round(fwd_wm) > 2 * self.acc.n_active * T:
            parts = [
                f"{roles.label(s)} {v:.2f}x ({v * T:,.0f} tokens)"
                for s, v in sorted(shared.items(), key=lambda kv: -kv[1])[:5]
            ]
            line += (
                f" Above 2·N·T: some weights multiply more than T = {tokens_text(T)} tokens per step in training's forward "
                f"(shared or called several times, or tokens= counts fewer tokens than they see: a [CLS] token "
                f"beside the patches, an encoder's source tokens beside the decoder's): "
                f"{', '.join(parts)}{' ...' if len(shared) > 5 else ''}."
            )
            line += self._tokens_hint(shared)
        self.out.append(line)

    def _tokens_hint(self, shared):
        """When most of N multiplied one same token count above T, that count is likely the tokens per step."""
        counts = {round(v * self.T) for v in shared.values()}
        n_shared = sum(self.roles.numel[s] for s in shared)
        if len(counts) != 1 or 2 * n_shared <= self._n_mm():
            return ""
        count = counts.pop()
        k = int(count // self.T) if count % self.T == 0 else 0  # a whole multiple of T: a layer called k times fits too
        called = ""
        if k:
            called = f", or is each of them called {k} times a step (a layer shared across depth"
            if self.no_backward:  # without a backward or an optimizer step, a step ends only at Tracer.step()
                called += f", or {k} forward passes in one step: call Tracer.step() after each pass"
            called += ")"
        return (
            f" {n_shared:,} of the N = {self._n_mm():,} parameters multiplied {count:,} tokens per step "
            f"each: is tokens= ({tokens_text(self.T)}) the tokens per step{called}?"
        )

    def no_grad_forward(self):
        """Forward weight matmuls no backward reads: an evaluation (grad mode off: the grad_mode column), frozen
        weights with inputs that need no gradient."""
        evaluation, cat = self.roles.evaluation, self.cat
        if not self.no_backward:
            self.evaluation_pass()
        idle_rows = self.idle_fwd & ~evaluation
        idle = self.ps(idle_rows & cat["weight_matmul"])
        if not idle:
            return
        frozen = all(not self.roles.trainable.get(s, True) for s in self.roles.param[idle_rows].tolist())
        known = "grad_mode" in self.rows and self.rows.labels("grad_mode").notna()[idle_rows].all()
        why = (
            "frozen weights whose inputs need no gradient: autograd records nothing for them"
            if frozen
            else "run in grad mode (the grad_mode column): frozen weights whose inputs need no gradient, or a forward "
            "whose output no backward reaches"
            if known
            else "an evaluation pass under no_grad or eval, or frozen weights whose inputs need no gradient"
        )
        self.out.append(
            f"Forward work without a backward: {_f(idle)} FLOPs per step of forward weight matmuls that no backward "
            f"reads ({why}); they are in the forward total above, but not in training's 2·N·T: the 6·N·T heuristic "
            f"counts a forward that is differentiated."
        )

    def evaluation_pass(self):
        """Forward work with grad mode off in a trace that trains: an evaluation, by the grad_mode column."""
        # the matmul and attention rows only: the SQL engine's frame sums the other rows without their grad mode
        cat = self.cat
        matmuls = self.roles.evaluation & self.is_fwd & (cat["weight_matmul"] | cat["attention"])
        weights, attention = self.ps(matmuls & cat["weight_matmul"]), self.ps(matmuls & cat["attention"])
        if not (weights or attention):
            return
        modes = " or ".join(sorted(set(map(_text, self.rows.labels("grad_mode").strings(matmuls)))))
        parts = [f"weight matmuls {_f(weights)}"] + ([f"attention {_f(attention)}"] if attention else [])
        self.out.append(
            f"Evaluation: {_f(weights + attention)} FLOPs per step of forward matmuls ran with grad mode off "
            f"(grad_mode {modes}; {', '.join(parts)}): an evaluation pass, which no backward follows. They are in the "
            f"forward total above, not in training's 2·N·T, and no weight counts the tokens it saw as training's."
        )

    def backward_weights(self):
        """dL/dW for every trainable weight, dL/dx only where x needs a gradient."""
        roles, n_mm, T = self.roles, self._n_mm(), self.T
        if not n_mm:
            return
        if self.no_backward:  # no dL/dx was skipped, none was asked for
            self.out.append(
                "Backward weight matmuls: none, the trace ran no backward (inference or evaluation): "
                "4·N·T and 6·N·T describe a training step."
            )
            return
        bwd_wm = self.ps(self.is_bwd & self.cat["weight_matmul"])
        has_param = (roles.param >= 0) & ~self.recompute
        fwd_by_param = self.ps(self.train_fwd & has_param, by=roles.param)
        dx_by_param = self.ps(self.is_bwd & has_param, by=roles.param)
        skipped = {
            s: fwd_by_param[s] - dx_by_param.get(s, 0.0)
            for s in fwd_by_param
            if fwd_by_param[s] - dx_by_param.get(s, 0.0) > 0
        }
        frozen = [s for s in roles.matmul_params if not roles.trainable.get(s, True)]
        expected = 4 * self.acc.n_active * T
        if abs(bwd_wm - expected) < 0.5 and not frozen:
            self.out.append(
                f"Backward weight matmuls: {_f(bwd_wm)} FLOPs = 4·N{'_active' if self.acc.n_active < n_mm else ''}·T: "
                f"for each y = x @ W, dL/dx = dL/dy @ Wᵀ and dL/dW = xᵀ @ dL/dy, each as large as the forward matmul."
            )
            return
        n, name = (self.acc.n_active, "N_active") if self.routed else (n_mm, "N")
        line = f"Backward weight matmuls: {_f(bwd_wm)} FLOPs = {bwd_wm / (n * T):.2f}·{name}·T, not 4·{name}·T ({_f(4 * n * T)})."
        if skipped:
            parts = [f"{roles.label(s)} ({roles.numel[s]:,} parameters: {_f(v)} FLOPs)" for s, v in skipped.items()]
            line += (
                f" {_f(sum(skipped.values()))} FLOPs of input gradients dL/dx = dL/dy @ Wᵀ are never computed "
                f"because the input x needs no gradient: it is data (or comes from layers that need no "
                f"gradient), so autograd skips it. Skipped: {'; '.join(parts)}. "
                f"For the lecture's y = x @ w with x not requiring grad, the backward is 2·N·T, not 4·N·T."
            )
        if frozen:
            step = self.rows["step"]
            fwd_all = self.ps(
                self.is_fwd & has_param & np.isin(step, step[self.is_bwd]) & ~roles.evaluation, by=roles.param
            )
            parts = [
                f"{roles.label(s)} ({roles.numel[s]:,} parameters: {_f(fwd_all.get(s, 0.0))} FLOPs)" for s in frozen
            ]
            line += (
                f" Frozen weights (requires_grad=False) skip dL/dW = xᵀ @ dL/dy, as large as their forward "
                f"matmuls: {'; '.join(parts)}."
            )
        if bwd_wm > expected + 0.5:  # each cause the trace shows, else the two it cannot tell apart
            redo = self.ps(self.is_bwd & self.cat["weight_matmul"] & self.recompute)
            causes = (
                [f"forward matmuls re-run in the backward by activation checkpointing ({_f(redo)} FLOPs)"]
                if redo
                else []
            )
            if any(v > 1 + 1e-9 for v in self.acc.shares.values()):
                causes.append("a weight multiplies more than T tokens (see the forward's line)")
            line += (
                " Above 4·N·T: "
                + (
                    "; ".join(causes)
                    or (
                        "a weight is used more than once, or a backward ran through the backward's own graph (a gradient "
                        "penalty: autograd.grad(..., create_graph=True), then backward)"
                    )
                )
                + "."
            )
        self.out.append(line)

    def attention(self):
        """Activation x activation matmuls and fused kernels, and the fused backward's recomputation."""
        T, cat, rows = self.T, self.cat, self.rows
        # the forward attention a backward reads (an evaluation under no_grad is left out of L·S·d: roles.py)
        trained = self.is_fwd & cat["attention"] & (self.roles.attention_training | self.no_backward)
        att_fwd = self.ps(trained)
        att_bwd = self.ps(self.is_bwd & cat["attention"])
        att_eval = self.ps(self.is_fwd & cat["attention"] & ~trained)
        if not (att_fwd or att_bwd):
            if att_eval:
                self.out.append(
                    f"Attention: {_f(att_eval)} FLOPs per step in forward passes that no backward reads "
                    f"(an evaluation under no_grad), outside 6·N·T."
                )
            return
        fb = self.ps(self.is_fwd | self.is_bwd)
        if not att_fwd:  # activation x activation matmuls that only the backward runs: no L·S·d to speak of
            self.out.append(
                f"Activation x activation matmuls in the backward only: {_f(att_bwd)} FLOPs "
                f"({_pct(att_bwd, fb)} of forward + backward), no parameter accounts for them, so 6·N·T leaves them "
                f"out (a double backward, say, as a gradient penalty runs)."
            )
            return
        label, what = kernel_words(rows, trained, self.kernel)
        self.out.append(
            f"{label}: {_f(att_fwd + att_bwd)} FLOPs ({_pct(att_fwd + att_bwd, fb)} of forward + backward) "
            f"multiply activations by activations ({what}), so no parameter accounts for them "
            f"and 6·N·T leaves them out: forward {_f(att_fwd)} = 4·T·(L·S·d) with L·S·d = {att_fwd / (4 * T):,.0f} "
            f"(layers x sequence length x width; where q·k and v heads differ in width, d is the mean of the two), backward {_f(att_bwd)} ({_x(att_bwd, att_fwd)} x forward). In "
            f"attention, with a backward of twice the forward, this is the 12·L·d·S·T term; it grows with the sequence length S."
            + (
                f" Another {_f(att_eval)} FLOPs per step of attention ran in forward passes that no backward reads (an "
                f"evaluation under no_grad): in the forward total, not in L·S·d."
                if att_eval
                else ""
            )
        )
        k_fwd = self.ps(self.kernel & self.is_fwd & ~self.recompute)
        k_bwd = self.ps(self.kernel & self.is_bwd & ~self.recompute)
        if k_bwd:
            recompute = self.ps(values=attention_recompute(rows))
            ops = ", ".join(
                sorted(set(map(_text, rows.labels("op").strings(self.kernel & self.is_bwd & ~self.recompute))))
            )
            self.out.append(
                f"Recomputation: the fused attention backward ({ops}) counts {_x(k_bwd, k_fwd)} x its forward "
                f"({_f(k_bwd)} vs {_f(k_fwd)} FLOPs) because it keeps no score matrix and recomputes q @ kᵀ: "
                f"{_f(recompute)} FLOPs of recomputation, which reports.mfu leaves out of the model FLOPs "
                f"(a backward needs 2x the forward, this one does 2.5x)."
            )
        line = causal_line(rows, self.kernel & self.is_fwd & ~self.recompute)
        if line:
            self.out.append(line)

    def checkpointing(self):
        again = self.ps(self.recompute)
        if not again:
            return
        weights = self.ps(self.recompute & self.cat["weight_matmul"])
        self.out.append(
            f"Activation checkpointing: {_f(again)} FLOPs per step re-run forward work in the backward (rows "
            f"flagged recompute; {_f(weights)} of them weight matmuls, counted in the backward above). reports.mfu "
            f"leaves them out of the model FLOPs (rematerialisation is not model work); HFU counts them."
        )

    def external(self):
        ext = self.ps(self.cat["external_weight"])
        if not ext:
            return
        ext_fwd = self.ps(self.is_fwd & self.cat["external_weight"])
        self.out.append(
            f"Weights outside the model: {_f(ext)} FLOPs per step ({_f(ext_fwd)} forward) multiply by parameters of "
            f"modules not in model= (a frozen teacher, say) or by quantized weights held as buffers: not in N, not "
            f"attention, left out of the ratios to 2·N·T, 4·N·T and 6·N·T above."
        )

    def head(self):
        """A language model's output head: the last weight matmul of the forward, in a model
        with an embedding (without one, the last layer is just a layer)."""
        roles, acc = self.roles, self.acc
        fwd_w = np.flatnonzero(self.is_fwd & (roles.param >= 0))
        if len(set(roles.param[fwd_w].tolist())) <= 1 or not any(roles.embedding.values()):
            return
        head = int(roles.param[fwd_w[-1]])
        head_f = self.ps(self.is_fwd & (roles.param == head))
        tied = roles.embedding.get(head, False)
        module = _text(self.rows.labels("module").strings(fwd_w[-1:])[0]) if "module" in self.rows else ""
        weight = roles.label(head)
        name = f"{module} (its weight {weight}" if module and not weight.startswith(module + ".") else f"{weight} ("
        name += ", " if name.endswith(weight) else ""
        line = (
            f"Output head: {name}{roles.numel[head]:,} parameters{', tied to the embedding' if tied else ''}) "
            f"costs {_f(head_f)} FLOPs forward ({_pct(head_f, self.ps(self.is_fwd))} of the forward) and about twice "
            f"that backward."
        )
        if acc.n_kind == "non_embedding" and tied:
            line += (
                f" n='non_embedding' leaves the embedding out of N, and with it this head: its "
                f"{_f(3 * head_f)} FLOPs per step are above 6·N·T."
            )
        elif acc.n_kind == "non_embedding":
            line += " It is not an embedding, so the non-embedding N counts it."
        elif acc.n_kind in ("matmul", "total"):
            line += " It is counted in N."
        self.out.append(line)

    def n_parts(self):
        """Parameters in N that do no matmul (embeddings, biases, norms), and matmul weights N leaves out."""
        roles, n, N, T = self.roles, self.acc.n_kind, self.N, self.T
        n_mm = self._n_mm()
        if n not in ("total", "non_embedding") or N == n_mm:
            return
        in_mm = set(roles.matmul_params)
        emb = sum(v for s, v in roles.numel.items() if s not in in_mm and roles.embedding.get(s))
        rest = sum(v for s, v in roles.numel.items() if s not in in_mm and not roles.embedding.get(s))
        left_out = [s for s in roles.matmul_params if roles.embedding.get(s)] if n == "non_embedding" else []
        parts = []
        if emb and n == "total":
            parts.append(f"+{emb:,} embedding parameters, looked up rather than multiplied (0 matmul FLOPs)")
        if rest:
            parts.append(
                f"+{rest:,} parameters of biases and norms, added or multiplied elementwise (a few "
                "FLOPs per token each, in the other ops)"
            )
        if left_out:
            parts.append(
                f"-{sum(roles.numel[s] for s in left_out):,} parameters of "
                f"{', '.join(roles.label(s) for s in left_out)}, an embedding that also multiplies in "
                "a matmul (a tied output head), which n='non_embedding' leaves out"
            )
        if parts:
            self.out.append(
                f"N = {N:,}, not the {n_mm:,} parameters that enter a matmul: {'; '.join(parts)}. "
                f"So 6·N·T differs from 6·T x the matmul parameters by {_f(6 * (N - n_mm) * T)} FLOPs."
            )

    def conv_weights(self):
        """Convolution weights: not in the matmul N; a patch embedding (stride = kernel) is a matmul on patches."""
        rows, roles = self.rows, self.roles
        conv = self.is_fwd & self.kind.eq("conv")
        if not conv.any() or "input_shapes" not in rows:
            return
        at = np.flatnonzero(conv)
        outs = rows.cells("output_shapes", at) if "output_shapes" in rows else [None] * len(at)
        weights, patches = {}, {}
        for ids, shapes, out in zip(rows.cells("input_storage_ids", at), rows.cells("input_shapes", at), outs):
            sid = roles.alias.get(int(ids[1]), -1) if ids is not None and len(ids) > 1 else -1  # a cast, w / sigma
            if sid not in roles.numel or shapes is None or len(shapes) < 2:
                continue
            weights[sid] = roles.numel[sid]
            x, w = [int(d) for d in shapes[0]], [int(d) for d in shapes[1]]
            o = [int(d) for d in out[0]] if out is not None and len(out) else []
            if len(o) == len(x) == len(w) and all(o[i] * w[i] == x[i] for i in range(2, len(x))):
                patches[sid] = True
        if not weights:
            return
        counted = self.acc.n_kind in ("total", "non_embedding")
        line = (
            f"Convolution weights: {', '.join(roles.label(s) for s in weights)} ({sum(weights.values()):,} "
            f"parameters) {'are in N (n=' + repr(self.acc.n_kind) + ')' if counted else 'are not in N'}: a "
            f"convolution multiplies each weight at every output position, so its FLOPs are 2 x weights x "
            f"positions, not 2·N·T; they are in the other ops."
        )
        if patches:
            line += (
                f" {', '.join(roles.label(s) for s in patches)}: stride = kernel, a patch embedding: each weight "
                f"meets each patch once, a matmul on patches (2·weights·patches FLOPs); with T = patches per step "
                f"it fits 2·N·T, and n={self._n_mm() + sum(weights[s] for s in patches)} counts it."
            )
        self.out.append(line)

    def optimizer(self):
        opt = self.ps(self.is_opt)
        if opt:
            updated = self.acc.meta.get("optimizer_params")  # the parameter elements its steps updated (tracer)
            total_params = updated or self.acc.n_local or self._n_total()  # older traces: what this rank holds
            ops = set(map(_text, self.rows.labels("op").strings(self.is_opt & (self.rows["flops"] > 0))))
            fused = sorted(o for o in ops if o.startswith("aten._fused_"))
            if fused:
                how = (
                    f"the fused kernel ({', '.join(fused)}) counts 1 FLOP per parameter element, though an Adam "
                    f"update does about 15 (tracer.flops.formulas), so this is a lower bound"
                )
            elif any(o.startswith("aten._foreach_") for o in ops):
                how = (
                    "its _foreach ops (foreach=True) count 1 FLOP per element each (tracer.flops.formulas), so this is "
                    "a lower bound"
                )
            else:
                how = "its per-parameter elementwise ops count 1 FLOP per element (tracer.flops.formulas)"
            self.out.append(
                f"Optimizer: {_f(opt)} FLOPs per step ({opt / total_params:.1f} per parameter over "
                f"{self._updated_text(updated, total_params)}, whatever T is), outside 6·N·T; {how}."
            )
        elif not self.is_opt.any():
            self.out.append("Optimizer: no optimizer step in the trace.")

    def _updated_text(self, updated, n):
        if updated:
            return f"the {n:,} parameters its steps updated"
        return f"the {n:,} parameters this rank holds" if n < self._n_total() else f"all {n:,} parameters"

    def other_ops(self):
        mask = (self.is_fwd | self.is_bwd) & self.cat["other"]
        other_fb = self.ps(mask)
        if not other_fb:
            return
        kinds = self.ps(mask, by="flop_kind")
        kinds = dict(
            sorted(((k, v) for k, v in kinds.items() if v > 0), key=lambda kv: -kv[1])
        )  # most first, ties in order
        self.out.append(
            f"Other ops: {_f(other_fb)} FLOPs in forward + backward ({_pct(other_fb, self.ps(self.is_fwd | self.is_bwd))} "
            f"of them; {', '.join(f'{kind} {_f(v)}' for kind, v in kinds.items())}), outside the matmul heuristic."
        )

    def uncounted(self):
        """Ops without a FLOP formula (flop_kind "unknown": nn.LSTM's fused kernels, say) count 0."""
        if (self.kind.eq("unknown") & (self.is_fwd | self.is_bwd | self.is_opt)).any():  # not bookkeeping
            self.out.append(
                "Ops without a FLOP formula ran (flop_kind unknown; the report lists them with their share of op "
                "time): they count 0 FLOPs, so every figure above leaves their work out, and a weight only they "
                "multiply is not in N."
            )
