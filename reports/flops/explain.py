"""The gap between the traced FLOPs and 6·N·T, in sentences with the figures (per step).

Every figure here is a per-step figure from reports.steps.per_step, so a trace of k
identical steps says exactly what a trace of one says (but for the step count).
"""

from reports._util import tokens_text
from reports.flops.accounting import analyse
from reports.flops.explain_outside import attention, checkpointing, optimizer, other_ops, uncounted
from reports.flops.explain_parameters import conv_weights, external, head, n_parts
from reports.flops.explain_text import figure, times
from reports.flops.explain_weights import backward_weights, experts, forward_weights, no_grad_forward
from reports.flops.recompute import checkpoint_recompute
from reports.flops.roles import CATEGORIES
from reports.flops.rows import frame_of, per_step

__all__ = ["explain"]

_N_DESC = {
    "matmul": "parameters that multiply activations in a matmul (tied weights once)",
    "total": "parameters in all",
    "non_embedding": "non-embedding parameters",
    "given": "parameters (given)",
}


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
    """One run's explanation: its rows' masks (phase, category, recompute, kernel), per-step sums (`ps`) and N,
    which the terms read, and the lines they add (`out`)."""

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
        self.routed = acc.n_active < self.n_mm() - 0.5  # some weights multiply fewer than T tokens: experts
        # forward weight matmuls of training (grad mode: a backward of their step reads them), reports.flops.roles
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
            totals(self)
            self.out.append(unsplit)
            return self.out
        # One function per term, in the order they are said; a new term is a function added here.
        for term in (
            totals,
            experts,
            forward_weights,
            no_grad_forward,
            backward_weights,
            attention,
            checkpointing,
            external,
            head,
            n_parts,
            conv_weights,
            optimizer,
            other_ops,
            uncounted,
        ):
            term(self)
        return self.out

    def n_total(self):
        """All the parameters: the run metadata's count, else those the roles know."""
        return int((self.acc.meta.get("params") or {}).get("total") or sum(self.roles.numel.values()))

    def n_mm(self):
        """The parameters that enter a matmul."""
        return sum(self.roles.numel[s] for s in self.roles.matmul_params)


def totals(run):
    """The forward, backward and all phases against 2·N·T, 4·N·T and 6·N·T, and the residual by category."""
    acc, N, T, cat = run.acc, run.N, run.T, run.cat
    not_opt = ~run.is_opt
    fwd, bwd, total = run.ps(run.is_fwd), run.ps(run.is_bwd), run.ps()
    ext_fwd, ext_bwd = run.ps(run.is_fwd & cat["external_weight"]), run.ps(run.is_bwd & cat["external_weight"])
    ext = run.ps(cat["external_weight"])
    wm, att = run.ps(not_opt & cat["weight_matmul"]), run.ps(not_opt & cat["attention"])
    other, opt = run.ps(not_opt & cat["other"]), run.ps(run.is_opt)
    k = acc.steps
    own = " of the model's own (less the weights outside it)" if ext else ""
    run.out.append(
        f"{acc.run}: per training step ({k} step{'s' if k != 1 else ''} traced; T = {tokens_text(T)} tokens per step; "
        f"N = {N:,} {_N_DESC[acc.n_kind]}): forward {figure(fwd - ext_fwd)} FLOPs{own} = {times(fwd - ext_fwd, 2 * N * T)} x 2·N·T, "
        f"backward {figure(bwd - ext_bwd)} = {times(bwd - ext_bwd, 4 * N * T)} x 4·N·T, all phases {figure(total - ext)} = "
        f"{times(total - ext, 6 * N * T)} x 6·N·T."
    )
    if acc.N_model != N:
        run.out.append(
            f"Tensor parallelism: the model has N = {acc.N_model:,} parameters; this rank's matmuls multiply by its "
            f"shards of them, N = {N:,} ({N / acc.N_model:.3g} of the model), so its figures are set against "
            f"2·N·T with that N."
        )
    outside = f" + weights outside the model ({figure(ext)})" if ext else ""
    n_a = acc.n_active
    weights = (
        f"weight matmuls - 6·N_active·T ({figure(wm - 6 * n_a * T)}) - 6·(N - N_active)·T for the parameters "
        f"a token does not use ({figure(6 * (N - n_a) * T)})"
        if run.routed
        else f"weight matmuls - 6·N·T ({figure(wm - 6 * N * T)})"
    )
    other_fb = run.ps((run.is_fwd | run.is_bwd) & cat["other"])  # the "Other ops" line's (explain_outside.other_ops)
    rest = (
        f" + the other phase's ({figure(other - other_fb)}: outside forward, backward and the optimizer step, "
        "as gradient clipping)"
        if other != other_fb
        else ""
    )
    run.out.append(
        f"Residual: all phases - 6·N·T = {figure(total - 6 * N * T)} FLOPs = {weights} + attention ({figure(att)})"
        f"{outside} + other ops ({figure(other_fb)}){rest} + the optimizer ({figure(opt)})."
    )
