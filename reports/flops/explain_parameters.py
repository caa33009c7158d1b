"""The explanation's terms about what N counts: weights outside the model, the output head, parameters that do no
matmul (embeddings, biases, norms) and matmul weights N leaves out, and convolution weights (a patch embedding among
them). Each term is a function of one run's reports.flops.explain `_Run` that adds its lines to `run.out`.
"""

import numpy as np

from reports.flops.explain_text import cell_text, figure, percent


def external(run):
    ext = run.ps(run.cat["external_weight"])
    if not ext:
        return
    ext_fwd = run.ps(run.is_fwd & run.cat["external_weight"])
    run.out.append(
        f"Weights outside the model: {figure(ext)} FLOPs per step ({figure(ext_fwd)} forward) multiply by parameters of "
        f"modules not in model= (a frozen teacher, say) or by quantized weights held as buffers: not in N, not "
        f"attention, left out of the ratios to 2·N·T, 4·N·T and 6·N·T above."
    )


def head(run):
    """A language model's output head: the last weight matmul of the forward, in a model
    with an embedding (without one, the last layer is just a layer)."""
    roles, acc = run.roles, run.acc
    fwd_w = np.flatnonzero(run.is_fwd & (roles.param >= 0))
    if len(set(roles.param[fwd_w].tolist())) <= 1 or not any(roles.embedding.values()):
        return
    head = int(roles.param[fwd_w[-1]])
    head_f = run.ps(run.is_fwd & (roles.param == head))
    tied = roles.embedding.get(head, False)
    module = cell_text(run.rows.labels("module").strings(fwd_w[-1:])[0]) if "module" in run.rows else ""
    weight = roles.label(head)
    name = f"{module} (its weight {weight}" if module and not weight.startswith(module + ".") else f"{weight} ("
    name += ", " if name.endswith(weight) else ""
    line = (
        f"Output head: {name}{roles.numel[head]:,} parameters{', tied to the embedding' if tied else ''}) "
        f"costs {figure(head_f)} FLOPs forward ({percent(head_f, run.ps(run.is_fwd))} of the forward) and about twice "
        f"that backward."
    )
    if acc.n_kind == "non_embedding" and tied:
        line += (
            f" n='non_embedding' leaves the embedding out of N, and with it this head: its "
            f"{figure(3 * head_f)} FLOPs per step are above 6·N·T."
        )
    elif acc.n_kind == "non_embedding":
        line += " It is not an embedding, so the non-embedding N counts it."
    elif acc.n_kind in ("matmul", "total"):
        line += " It is counted in N."
    run.out.append(line)


def n_parts(run):
    """Parameters in N that do no matmul (embeddings, biases, norms), and matmul weights N leaves out."""
    roles, n, N, T = run.roles, run.acc.n_kind, run.N, run.T
    n_mm = run.n_mm()
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
        run.out.append(
            f"N = {N:,}, not the {n_mm:,} parameters that enter a matmul: {'; '.join(parts)}. "
            f"So 6·N·T differs from 6·T x the matmul parameters by {figure(6 * (N - n_mm) * T)} FLOPs."
        )


def conv_weights(run):
    """Convolution weights: not in the matmul N; a patch embedding (stride = kernel) is a matmul on patches."""
    rows, roles = run.rows, run.roles
    conv = run.is_fwd & run.kind.eq("conv")
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
    counted = run.acc.n_kind in ("total", "non_embedding")
    line = (
        f"Convolution weights: {', '.join(roles.label(s) for s in weights)} ({sum(weights.values()):,} "
        f"parameters) {'are in N (n=' + repr(run.acc.n_kind) + ')' if counted else 'are not in N'}: a "
        f"convolution multiplies each weight at every output position, so its FLOPs are 2 x weights x "
        f"positions, not 2·N·T; they are in the other ops."
    )
    if patches:
        line += (
            f" {', '.join(roles.label(s) for s in patches)}: stride = kernel, a patch embedding: each weight "
            f"meets each patch once, a matmul on patches (2·weights·patches FLOPs); with T = patches per step "
            f"it fits 2·N·T, and n={run.n_mm() + sum(weights[s] for s in patches)} counts it."
        )
    run.out.append(line)
