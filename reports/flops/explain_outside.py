"""The explanation's terms for the FLOPs no parameter accounts for: attention (activation x activation matmuls, the
12·L·d·S·T term) and the fused attention backward's recomputation, activation checkpointing's re-run forward work, the
optimizer, the other (elementwise) ops, and ops without a FLOP formula. Each term is a function of one run's
reports.flops.explain `_Run` that adds its lines to `run.out`.
"""

from reports.flops.attention_words import causal_line, kernel_words
from reports.flops.explain_text import cell_text, figure, percent, times
from reports.flops.recompute import attention_recompute


def attention(run):
    """Activation x activation matmuls and fused kernels, and the fused backward's recomputation."""
    T, cat, rows = run.T, run.cat, run.rows
    # the forward attention a backward reads (an evaluation under no_grad is left out of L·S·d: roles.py)
    trained = run.is_fwd & cat["attention"] & (run.roles.attention_training | run.no_backward)
    att_fwd = run.ps(trained)
    att_bwd = run.ps(run.is_bwd & cat["attention"])
    att_eval = run.ps(run.is_fwd & cat["attention"] & ~trained)
    if not (att_fwd or att_bwd):
        if att_eval:
            run.out.append(
                f"Attention: {figure(att_eval)} FLOPs per step in forward passes that no backward reads "
                f"(an evaluation under no_grad), outside 6·N·T."
            )
        return
    fb = run.ps(run.is_fwd | run.is_bwd)
    if not att_fwd:  # activation x activation matmuls that only the backward runs: no L·S·d to speak of
        run.out.append(
            f"Activation x activation matmuls in the backward only: {figure(att_bwd)} FLOPs "
            f"({percent(att_bwd, fb)} of forward + backward), no parameter accounts for them, so 6·N·T leaves them "
            f"out (a double backward, say, as a gradient penalty runs)."
        )
        return
    label, what = kernel_words(rows, trained, run.kernel)
    run.out.append(
        f"{label}: {figure(att_fwd + att_bwd)} FLOPs ({percent(att_fwd + att_bwd, fb)} of forward + backward) "
        f"multiply activations by activations ({what}), so no parameter accounts for them "
        f"and 6·N·T leaves them out: forward {figure(att_fwd)} = 4·T·(L·S·d) with L·S·d = {att_fwd / (4 * T):,.0f} "
        f"(layers x sequence length x width; where q·k and v heads differ in width, d is the mean of the two), backward {figure(att_bwd)} ({times(att_bwd, att_fwd)} x forward). In "
        f"attention, with a backward of twice the forward, this is the 12·L·d·S·T term; it grows with the sequence length S."
        + (
            f" Another {figure(att_eval)} FLOPs per step of attention ran in forward passes that no backward reads (an "
            f"evaluation under no_grad): in the forward total, not in L·S·d."
            if att_eval
            else ""
        )
    )
    k_fwd = run.ps(run.kernel & run.is_fwd & ~run.recompute)
    k_bwd = run.ps(run.kernel & run.is_bwd & ~run.recompute)
    if k_bwd:
        recompute = run.ps(values=attention_recompute(rows))
        ops = ", ".join(
            sorted(set(map(cell_text, rows.labels("op").strings(run.kernel & run.is_bwd & ~run.recompute))))
        )
        run.out.append(
            f"Recomputation: the fused attention backward ({ops}) counts {times(k_bwd, k_fwd)} x its forward "
            f"({figure(k_bwd)} vs {figure(k_fwd)} FLOPs) because it keeps no score matrix and recomputes q @ kᵀ: "
            f"{figure(recompute)} FLOPs of recomputation, which reports.mfu leaves out of the model FLOPs "
            f"(a backward needs 2x the forward, this one does 2.5x)."
        )
    line = causal_line(rows, run.kernel & run.is_fwd & ~run.recompute)
    if line:
        run.out.append(line)


def checkpointing(run):
    again = run.ps(run.recompute)
    if not again:
        return
    weights = run.ps(run.recompute & run.cat["weight_matmul"])
    run.out.append(
        f"Activation checkpointing: {figure(again)} FLOPs per step re-run forward work in the backward (rows "
        f"flagged recompute; {figure(weights)} of them weight matmuls, counted in the backward above). reports.mfu "
        f"leaves them out of the model FLOPs (rematerialisation is not model work); HFU counts them."
    )


def optimizer(run):
    opt = run.ps(run.is_opt)
    if opt:
        updated = run.acc.meta.get("optimizer_params")  # the parameter elements its steps updated (tracer)
        total_params = updated or run.acc.n_local or run.n_total()  # older traces: what this rank holds
        ops = set(map(cell_text, run.rows.labels("op").strings(run.is_opt & (run.rows["flops"] > 0))))
        fused = sorted(o for o in ops if o.startswith("aten._fused_"))
        if fused:
            how = (
                f"the fused kernel ({', '.join(fused)}) counts what the same optimizer's _foreach ops count for its "
                f"flags, 1 FLOP per element each (tracer.flops.optimizers), so this is a lower bound"
            )
        elif any(o.startswith("aten._foreach_") for o in ops):
            how = (
                "its _foreach ops (foreach=True) count 1 FLOP per element each (tracer.flops.formulas), so this is "
                "a lower bound"
            )
        else:
            how = "its per-parameter elementwise ops count 1 FLOP per element (tracer.flops.formulas)"
        run.out.append(
            f"Optimizer: {figure(opt)} FLOPs per step ({opt / total_params:.1f} per parameter over "
            f"{_updated_text(run, updated, total_params)}, whatever T is), outside 6·N·T; {how}."
        )
    elif not run.is_opt.any():
        run.out.append("Optimizer: no optimizer step in the trace.")


def _updated_text(run, updated, n):
    if updated:
        return f"the {n:,} parameters its steps updated"
    return f"the {n:,} parameters this rank holds" if n < run.n_total() else f"all {n:,} parameters"


def other_ops(run):
    mask = (run.is_fwd | run.is_bwd) & run.cat["other"]
    other_fb = run.ps(mask)
    if not other_fb:
        return
    kinds = run.ps(mask, by="flop_kind")
    kinds = dict(
        sorted(((k, v) for k, v in kinds.items() if v > 0), key=lambda kv: -kv[1])
    )  # most first, ties in order
    run.out.append(
        f"Other ops: {figure(other_fb)} FLOPs in forward + backward ({percent(other_fb, run.ps(run.is_fwd | run.is_bwd))} "
        f"of them; {', '.join(f'{kind} {figure(v)}' for kind, v in kinds.items())}), outside the matmul heuristic."
    )


def uncounted(run):
    """Ops without a FLOP formula (flop_kind "unknown": nn.LSTM's fused kernels, say) count 0."""
    if (run.kind.eq("unknown") & (run.is_fwd | run.is_bwd | run.is_opt)).any():  # not bookkeeping
        run.out.append(
            "Ops without a FLOP formula ran (flop_kind unknown; the report lists them with their share of op "
            "time): they count 0 FLOPs, so every figure above leaves their work out, and a weight only they "
            "multiply is not in N."
        )
