"""N and T for the 2·N·T / 4·N·T / 6·N·T heuristic, and each run's rows with their roles.

N, chosen with `n`:
  "matmul"         (default) the parameters whose storage enters a matmul in the
                   forward phase as a multiplied operand (not addmm's bias); tied
                   weights share one storage and count once. The output head counts.
  "total"          every parameter (metadata params.total), embeddings included
  "non_embedding"  params.total minus the nn.Embedding tables (a tied output head
                   is then left out too)
  an int           your own N
Parameters of modules outside `model=` (a frozen teacher) are never part of N.

N_active, the parameters a token actually uses (a mixture of experts routes each token to
k of E experts): each weight W in N counts its numel x its share, the tokens it multiplied
per step over T (capped at 1: a weight used twice per token is still one weight):

  share(W) = forward weight-matmul FLOPs of W per step / (2 · numel(W) · T)

A stacked expert weight [E, K, N] used by t_e tokens per expert does 2·K·N·Σt_e FLOPs, so
its share is Σt_e / (E·T) = k/E with top-k routing, whatever the routing: N_active =
N - Σ numel(W)·(1 - share(W)) is exact for any routing, and equals N in a dense model. Only
the forward rows of training count (reports.roles: evaluation passes under no_grad are left
out, by the grad_mode column where the trace has it); a forward-only trace uses all of them. The optimizer updates all N parameters.

T is the run's tokens per step (metadata `tokens`, set by Tracer(tokens=...)) unless
`tokens` is given.

Distributed runs: N is always the whole model's (`N_model`), whatever a rank holds. The
heuristic of one rank uses the N its matmuls multiply by: the same N under DDP and FSDP2
(FSDP2 gathers whole weights for the forward and backward), the rank's shards under tensor
parallelism (`Account.N`). The optimizer updates the parameters the rank holds (`n_local`:
its shard under FSDP2 and tensor parallelism).
"""

import re
from typing import NamedTuple

import numpy as np

from reports.errors import ReportError
from reports.flops.roles import Roles
from reports.flops.rows import Rows, per_step, require

__all__ = ["N_CHOICES", "Account", "analyse", "name_pattern", "routing"]

N_CHOICES = ("matmul", "total", "non_embedding")
_COLUMNS = ("run", "step", "phase", "op", "flops", "flop_kind", "input_storage_ids", "output_storage_ids")


class Account(NamedTuple):
    """One run's rows, metadata, roles, the N and T it is measured against and its step count."""

    run: str
    rows: Rows
    meta: dict
    roles: Roles
    n_kind: str  # "matmul", "total", "non_embedding" or "given"
    N: int
    T: int
    steps: int
    n_active: float  # the parameters a token uses: N less the unused share of routed weights (see above)
    shares: dict  # per weight storage in N: tokens it multiplied per step / T (uncapped)
    N_model: int  # N of the whole model: N itself, except under tensor parallelism (N is then the rank's shards)
    n_local: int  # parameters this rank holds and its optimizer updates (a shard under FSDP2 or tensor parallelism)


def _check_n(n, what):
    if isinstance(n, str) and n in N_CHOICES:
        return
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        return
    raise ReportError(f"{what}: n must be one of {', '.join(map(repr, N_CHOICES))} or a positive int, got {n!r}")


def _n_value(n, meta, roles, what):
    """N of the whole model: whole parameters, also when this rank holds shards of them."""
    params = meta.get("params") or {}
    if n == "matmul":
        return sum(roles.model_numel[s] for s in roles.matmul_params)
    if n in ("total", "non_embedding"):
        if "total" not in params:
            raise ReportError(
                f"{what}: run {meta.get('run_name')!r} has no parameter counts; "
                "trace it with Tracer(model=...) or pass n=<int>"
            )
        return int(params["total"]) - (int(params.get("embedding", 0)) if n == "non_embedding" else 0)
    return int(n)


def _n_rank(N_model, kind, roles):
    """N this rank's matmuls multiply by: N_model, except under tensor parallelism, where each rank multiplies
    its shards of the weights (FSDP2 gathers whole ones: its unsharded parameters have the whole numel)."""
    multiplied = sum(roles.numel[s] for s in roles.matmul_params)
    whole = sum(roles.model_numel[s] for s in roles.matmul_params)
    if kind == "given" or not whole or multiplied == whole:
        return N_model
    return multiplied if kind == "matmul" else round(N_model * multiplied / whole)


def _n_local(meta, roles):
    """Parameters this rank holds (each storage once): what its optimizer updates."""
    held = {}
    for p in (meta.get("parameters") or {}).values():
        held[int(p["storage_id"])] = int(p["numel"])
    return sum(held.values())


def traced_tokens(meta):
    """The tokens per step of a metered run's traced steps, as `meter.step(tokens=)` gave them (tracer.metering.meter): their
    mean (an int when whole; the per-step figures are means over the traced steps), or None."""
    try:
        steps, traces = meta["meter"]["steps"], meta["meter"]["traces"]
        picked = [
            t
            for t, traced, i in zip(steps["tokens"], steps["traced"], steps["trace"])
            if traced is True
            and isinstance(i, int)
            and 0 <= i < len(traces)
            and traces[i].get("trace_steps") is not None
        ]
    except (TypeError, KeyError, AttributeError):
        return None
    if not picked or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in picked):
        return None
    mean = sum(picked) / len(picked)
    return int(mean) if mean.is_integer() else mean


def _tokens(tokens, meta, what):
    if tokens is not None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise ReportError(f"{what}: tokens must be a positive int (tokens per training step), got {tokens!r}")
        return tokens
    metered = traced_tokens(meta)  # a Meter re-traces a step of another length: its steps' own tokens, not tokens=
    if metered:
        return metered
    t = meta.get("tokens")
    if not t:
        raise ReportError(
            f"{what}: run {meta.get('run_name')!r} has no tokens per step in its metadata; pass tokens=<tokens per "
            "training step> or trace with Tracer(..., tokens=batch*seq_len)"
        )
    return int(t)


def analyse(frame, n, tokens, what, columns=()):
    """[Account] per run of `frame` (a reports.flops.rows.Frame), after checking `n`, `tokens` and the columns
    `what` needs."""
    _check_n(n, what)
    require(frame.column_names, (*_COLUMNS, *columns), what)
    out = []
    for run, rows in frame.split():
        meta = frame.runs[run]
        roles = Roles(rows, meta)
        kind = n if isinstance(n, str) else "given"
        N_model, T = _n_value(n, meta, roles, what), _tokens(tokens, meta, what)
        N = _n_rank(N_model, kind, roles)
        shares = _shares(rows, roles, T, kind)
        inactive = sum(roles.numel[s] * max(0.0, 1.0 - share) for s, share in shares.items())
        out.append(
            Account(
                run,
                rows,
                meta,
                roles,
                kind,
                N,
                T,
                rows.count_steps(),
                max(0.0, N - inactive),
                shares,
                N_model,
                _n_local(meta, roles),
            )
        )
    return out


def _shares(rows, roles, T, n_kind):
    """{weight storage in N: its forward weight-matmul FLOPs per step / (2 · numel · T)} over training rows."""
    weights = [s for s in roles.matmul_params if not (n_kind == "non_embedding" and roles.embedding.get(s))]
    if not weights:
        return {}
    phase = rows.labels("phase")
    fwd = phase.eq("forward") & (roles.param >= 0)
    if phase.eq("backward").any():  # frozen weights' rows count whether or not a backward reads them
        frozen = np.isin(
            roles.param, np.array([s for s in weights if not roles.trainable.get(s, True)], dtype=np.int64)
        )
        fwd &= (roles.training | frozen) & ~roles.evaluation
    flops = per_step(rows, mask=fwd, by=roles.param)
    return {s: float(flops.get(s, 0.0)) / (2 * roles.numel[s] * T) for s in weights}


def name_pattern(name):
    """'model.layers.1.mlp.experts.3.w1' -> 'model.layers.*.mlp.experts.*.w1': one name per kind of weight."""
    return re.sub(r"(?<=\.)\d+(?=\.)", "*", name)


def routing(roles, sid, routed):
    """(E, k) of a routed weight: a stacked [E, K, N] weight shared by k/E of the tokens, or one of E
    sibling expert weights (names that differ by an index) whose shares add up to k; k is 0 when it is not
    a whole number (routing by capacity, dropped tokens)."""
    shape = roles.shape.get(sid, ())
    if len(shape) >= 3:
        e, k = shape[0], routed[sid] * shape[0]
    else:
        key = _siblings(roles.label(sid))
        group = [s for s in routed if _siblings(roles.label(s)) == key]
        e, k = len(group), sum(routed[s] for s in group)
    return e, (round(k) if abs(k - round(k)) < 1e-6 and round(k) > 0 else 0)


def _siblings(name):
    """'layers.1.experts.3.w1' -> 'layers.1.experts.*.w1': the last index of a name replaced, so that the E experts
    of one layer share a key."""
    return re.sub(r"\.\d+\.(?!.*\.\d+\.)", ".*.", name)
