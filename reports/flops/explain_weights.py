"""The explanation's terms about the weight matmuls: what 2·N·T and 4·N·T predict against what the weights did.

Mixture of experts (N_active, the parameters a token uses), the forward weight matmuls (weights that multiply more
than T tokens, and what that says of tokens=), forward work no backward reads (an evaluation, frozen weights), and the
backward weight matmuls (input gradients skipped, frozen weights, a backward above 4·N·T). Each term is a function of
one run's reports.flops.explain `_Run` (its masks and per-step sums) that adds its lines to `run.out`.
"""

import numpy as np

from reports._util import tokens_text
from reports.flops.accounting import name_pattern, routing
from reports.flops.explain_text import cell_text, figure


def experts(run):
    """Mixture of experts: the parameters a token uses (N_active) against all of them."""
    if not run.routed:
        return
    acc, roles, T = run.acc, run.roles, run.T
    routed = {s: v for s, v in acc.shares.items() if v < 1 - 1e-9}
    kinds = {routing(roles, s, routed) for s in routed}
    moe = any(k and e > 1 for e, k in kinds)
    ((e, k),) = kinds if len(kinds) == 1 else ((0, 0),)
    names = sorted({name_pattern(roles.label(s)) for s in routed})
    line = (
        f"{'Mixture of experts' if moe else 'Weights partly used'}: N = {run.N:,} parameters, of which each "
        f"token uses N_active = {acc.n_active:,.0f}{f' (top-{k} of {e} experts)' if moe and k else ''}: "
        f"{'each routed weight' if moe else 'a weight that multiplies fewer than T tokens, or only a slice of which enters a matmul,'} "
        f"counts its parameters x the share of the T tokens it multiplied "
        f"({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}). Forward weight matmuls = 2·N_active·T = "
        f"{figure(2 * acc.n_active * T)} FLOPs, backward 4·N_active·T, all phases 6·N_active·T = "
        f"{figure(6 * acc.n_active * T)}; the optimizer updates all {run.n_total():,} parameters."
    )
    if (
        "flops_bound" in run.rows
        and (
            run.train_fwd
            & np.isin(run.roles.param, np.array(list(routed), dtype=np.int64))
            & run.rows.flag("flops_bound")
        ).any()
    ):
        line += (
            " N_active is an upper bound: the routed weights' forward FLOPs it is measured from are upper "
            "bounds (flops_bound: their group sizes could not be read, meta or fake tensors), exact only "
            "if every row of their operands is routed."
        )
    if len(routed) == len(acc.shares) > 1 and len({round(v, 9) for v in routed.values()}) == 1:
        line += " Every weight multiplied the same fewer tokens than T: is tokens= the tokens per step?"
    run.out.append(line)


def forward_weights(run):
    n_mm, T, roles = run.n_mm(), run.T, run.roles
    if not n_mm:
        return
    fwd_wm = run.ps(run.train_fwd & run.cat["weight_matmul"])
    if run.routed:
        line = (
            f"Forward weight matmuls: {figure(fwd_wm)} FLOPs = {fwd_wm / (run.acc.n_active * T):.2f}·N_active·T "
            f"= {fwd_wm / (n_mm * T):.2f}·N·T: each token multiplies the N_active = {run.acc.n_active:,.0f} "
            f"parameters it uses once, a multiply and an add."
        )
    else:
        line = (
            f"Forward weight matmuls: {figure(fwd_wm)} FLOPs = {fwd_wm / (n_mm * T):.2f}·N·T with the {n_mm:,} "
            f"parameters that enter a matmul: each weight multiplies each token once, a multiply and an add."
        )
    shared = {s: v for s, v in run.acc.shares.items() if v > 1 + 1e-9}
    if shared and round(fwd_wm) > 2 * run.acc.n_active * T:
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
        line += _tokens_hint(run, shared)
    run.out.append(line)


def _tokens_hint(run, shared):
    """When most of N multiplied one same token count above T, that count is likely the tokens per step."""
    counts = {round(v * run.T) for v in shared.values()}
    n_shared = sum(run.roles.numel[s] for s in shared)
    if len(counts) != 1 or 2 * n_shared <= run.n_mm():
        return ""
    count = counts.pop()
    k = int(count // run.T) if count % run.T == 0 else 0  # a whole multiple of T: a layer called k times fits too
    called = ""
    if k:
        called = f", or is each of them called {k} times a step (a layer shared across depth"
        if run.no_backward:  # without a backward or an optimizer step, a step ends only at Tracer.step()
            called += f", or {k} forward passes in one step: call Tracer.step() after each pass"
        called += ")"
    return (
        f" {n_shared:,} of the N = {run.n_mm():,} parameters multiplied {count:,} tokens per step "
        f"each: is tokens= ({tokens_text(run.T)}) the tokens per step{called}?"
    )


def no_grad_forward(run):
    """Forward weight matmuls no backward reads: an evaluation (grad mode off: the grad_mode column), frozen
    weights with inputs that need no gradient."""
    evaluation, cat = run.roles.evaluation, run.cat
    if not run.no_backward:
        _evaluation_pass(run)
    idle_rows = run.idle_fwd & ~evaluation
    idle = run.ps(idle_rows & cat["weight_matmul"])
    if not idle:
        return
    frozen = all(not run.roles.trainable.get(s, True) for s in run.roles.param[idle_rows].tolist())
    known = "grad_mode" in run.rows and run.rows.labels("grad_mode").notna()[idle_rows].all()
    why = (
        "frozen weights whose inputs need no gradient: autograd records nothing for them"
        if frozen
        else "run in grad mode (the grad_mode column): frozen weights whose inputs need no gradient, or a forward "
        "whose output no backward reaches"
        if known
        else "an evaluation pass under no_grad or eval, or frozen weights whose inputs need no gradient"
    )
    run.out.append(
        f"Forward work without a backward: {figure(idle)} FLOPs per step of forward weight matmuls that no backward "
        f"reads ({why}); they are in the forward total above, but not in training's 2·N·T: the 6·N·T heuristic "
        f"counts a forward that is differentiated."
    )


def _evaluation_pass(run):
    """Forward work with grad mode off in a trace that trains: an evaluation, by the grad_mode column."""
    # the matmul and attention rows only: the SQL engine's frame sums the other rows without their grad mode
    cat = run.cat
    matmuls = run.roles.evaluation & run.is_fwd & (cat["weight_matmul"] | cat["attention"])
    weights, attention = run.ps(matmuls & cat["weight_matmul"]), run.ps(matmuls & cat["attention"])
    if not (weights or attention):
        return
    modes = " or ".join(sorted(set(map(cell_text, run.rows.labels("grad_mode").strings(matmuls)))))
    parts = [f"weight matmuls {figure(weights)}"] + ([f"attention {figure(attention)}"] if attention else [])
    run.out.append(
        f"Evaluation: {figure(weights + attention)} FLOPs per step of forward matmuls ran with grad mode off "
        f"(grad_mode {modes}; {', '.join(parts)}): an evaluation pass, which no backward follows. They are in the "
        f"forward total above, not in training's 2·N·T, and no weight counts the tokens it saw as training's."
    )


def backward_weights(run):
    """dL/dW for every trainable weight, dL/dx only where x needs a gradient."""
    roles, n_mm, T = run.roles, run.n_mm(), run.T
    if not n_mm:
        return
    if run.no_backward:  # no dL/dx was skipped, none was asked for
        run.out.append(
            "Backward weight matmuls: none, the trace ran no backward (inference or evaluation): "
            "4·N·T and 6·N·T describe a training step."
        )
        return
    bwd_wm = run.ps(run.is_bwd & run.cat["weight_matmul"])
    has_param = (roles.param >= 0) & ~run.recompute
    fwd_by_param = run.ps(run.train_fwd & has_param, by=roles.param)
    dx_by_param = run.ps(run.is_bwd & has_param, by=roles.param)
    skipped = {
        s: fwd_by_param[s] - dx_by_param.get(s, 0.0)
        for s in fwd_by_param
        if fwd_by_param[s] - dx_by_param.get(s, 0.0) > 0
    }
    frozen = [s for s in roles.matmul_params if not roles.trainable.get(s, True)]
    expected = 4 * run.acc.n_active * T
    if abs(bwd_wm - expected) < 0.5 and not frozen:
        run.out.append(
            f"Backward weight matmuls: {figure(bwd_wm)} FLOPs = 4·N{'_active' if run.acc.n_active < n_mm else ''}·T: "
            f"for each y = x @ W, dL/dx = dL/dy @ Wᵀ and dL/dW = xᵀ @ dL/dy, each as large as the forward matmul."
        )
        return
    n, name = (run.acc.n_active, "N_active") if run.routed else (n_mm, "N")
    line = f"Backward weight matmuls: {figure(bwd_wm)} FLOPs = {bwd_wm / (n * T):.2f}·{name}·T, not 4·{name}·T ({figure(4 * n * T)})."
    if skipped:
        parts = [f"{roles.label(s)} ({roles.numel[s]:,} parameters: {figure(v)} FLOPs)" for s, v in skipped.items()]
        line += (
            f" {figure(sum(skipped.values()))} FLOPs of input gradients dL/dx = dL/dy @ Wᵀ are never computed "
            f"because the input x needs no gradient: it is data (or comes from layers that need no "
            f"gradient), so autograd skips it. Skipped: {'; '.join(parts)}. "
            f"For the lecture's y = x @ w with x not requiring grad, the backward is 2·N·T, not 4·N·T."
        )
    if frozen:
        step = run.rows["step"]
        fwd_all = run.ps(run.is_fwd & has_param & np.isin(step, step[run.is_bwd]) & ~roles.evaluation, by=roles.param)
        parts = [
            f"{roles.label(s)} ({roles.numel[s]:,} parameters: {figure(fwd_all.get(s, 0.0))} FLOPs)" for s in frozen
        ]
        line += (
            f" Frozen weights (requires_grad=False) skip dL/dW = xᵀ @ dL/dy, as large as their forward "
            f"matmuls: {'; '.join(parts)}."
        )
    if bwd_wm > expected + 0.5:  # each cause the trace shows, else the two it cannot tell apart
        redo = run.ps(run.is_bwd & run.cat["weight_matmul"] & run.recompute)
        causes = (
            [f"forward matmuls re-run in the backward by activation checkpointing ({figure(redo)} FLOPs)"]
            if redo
            else []
        )
        if any(v > 1 + 1e-9 for v in run.acc.shares.values()):
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
    run.out.append(line)
