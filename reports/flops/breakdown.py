"""Measured FLOPs per phase against the 2·N·T / 4·N·T / 6·N·T heuristic.

The heuristic (CS336 lecture 2): a training step over T tokens of a model with N
parameters costs 2·N·T FLOPs forward (each weight multiplies each token once: a
multiply and an add) and 4·N·T backward (per weight matmul y = x @ W, the input
gradient dL/dx = dL/dy @ Wᵀ and the weight gradient dL/dW = xᵀ @ dL/dy), 6·N·T
in all. `breakdown` sets the traced FLOPs beside it and splits them four ways
(reports.flops.roles says how a row is told apart):

  weight_matmul_flops    matmuls that multiply by a model parameter or compute its gradient
  attention_flops        matmuls of two activations, and fused attention kernels
  external_weight_flops  matmuls with a parameter of a module outside model= (a frozen
                         teacher's forward): outside N and outside the ratio
  other_flops            everything else: elementwise, normalisation, softmax, loss,
                         convolutions, the optimizer's _foreach ops

For a mixture of experts, where a token uses N_active of the N parameters (k of E experts:
reports.flops.accounting), the same FLOPs are also set against 2·N_active·T, 4·N_active·T and
6·N_active·T (expected_active_flops, active_ratio); in a dense model N_active = N.

N and T: see reports.flops.accounting. All FLOP columns are per training step, through
reports.steps (each phase's total over the steps it ran in). `explain` (reports.flops.explain)
says the same in words.
"""

import numpy as np
import pyarrow as pa

from reports.flops.accounting import N_CHOICES, analyse
from reports.flops.explain import explain
from reports.flops.roles import CATEGORIES
from reports.flops.rows import Labels, frame_of, per_step, runs_table, to_frame

__all__ = ["N_CHOICES", "breakdown", "breakdown_table", "explain"]

_EXPECT = {"forward": 2, "backward": 4, "total": 6}
_SPLIT = ("weight_matmul", "attention", "external_weight", "other")
_FLOAT_COLS = ("flops", *(f"{c}_flops" for c in _SPLIT))


def breakdown(df, n="matmul", tokens=None, accounts=None):
    """One row per phase (forward, backward, optimizer, other when present, total) per run.

    Columns (FLOPs per training step): flops (measured), expected_flops (2·N·T, 4·N·T,
    6·N·T; NaN for the optimizer and other phases), ratio ((flops - external_weight_flops)
    / expected_flops: the model's own FLOPs), expected_active_flops and active_ratio (the
    same with N_active), weight_matmul_flops + attention_flops + external_weight_flops +
    other_flops (= flops), then steps (the run's training steps), n_params (N, all the
    parameters counted: N_total, of the whole model also when a rank holds shards), n_rank
    (the N the expected figures use: the parameters this rank's matmuls multiply by, N
    except under tensor parallelism, where it is the rank's shards), n_active (N_active, the parameters a token uses, of
    n_rank's; n_rank in a dense model), n_kind (which N: "matmul", "total", "non_embedding" or "given") and
    tokens (T, tokens per step). See the module docstring for N, T and the split.
    `accounts`: what reports.flops.accounting.analyse(df, n, tokens, ...) returned, to share
    one analysis of the rows with `explain` (the CLI does); n and tokens are then unused."""
    frame = frame_of(df) if accounts is None else None
    return to_frame(breakdown_table(frame, n, tokens, accounts))


def breakdown_table(frame, n="matmul", tokens=None, accounts=None):
    """`breakdown` of a reports.flops.rows.Frame (or of `accounts`), as a pyarrow.Table."""
    floats = ("expected_flops", "ratio", "expected_active_flops", "active_ratio", *_FLOAT_COLS[1:])
    types = {
        "phase": pa.string(),
        "flops": pa.float64(),
        **dict.fromkeys(floats, pa.float64()),
        "steps": pa.int64(),
        "n_params": pa.int64(),
        "n_rank": pa.int64(),
        "n_active": pa.float64(),
        "n_kind": pa.string(),
        "tokens": pa.int64(),
    }
    frames = []
    accounts = analyse(frame, n, tokens, "breakdown") if accounts is None else accounts
    if not all(float(acc.T).is_integer() for acc in accounts):  # a metered run's steps of several lengths: their mean
        types["tokens"] = pa.float64()
    for acc in accounts:
        rows, N, T = acc.rows, acc.N, acc.T
        ph = rows.labels("phase")
        phases = ["forward", "backward", "optimizer"] + (["other"] if ph.eq("other").any() else [])
        by_category = per_step(rows, by=_keys(acc.roles.category_codes, ph))
        records = []
        for phase in phases + ["total"]:
            rec = {"phase": phase}
            for c in _SPLIT:
                rec[f"{c}_flops"] = _pick(by_category, c, phase)
            rec["flops"] = per_step(rows, mask=None if phase == "total" else ph.eq(phase))
            k = _EXPECT.get(phase)
            rec["expected_flops"] = float(k * N * T) if k else float("nan")
            own = rec["flops"] - rec["external_weight_flops"]
            rec["ratio"] = own / rec["expected_flops"] if k and N * T else float("nan")
            rec["expected_active_flops"] = float(k * acc.n_active * T) if k else float("nan")
            rec["active_ratio"] = own / rec["expected_active_flops"] if k and acc.n_active * T else float("nan")
            rec.update(
                steps=acc.steps, n_params=acc.N_model, n_rank=N, n_active=acc.n_active, n_kind=acc.n_kind, tokens=T
            )
            records.append(rec)
        frames.append((acc.run, records))
    several = len(frame.runs) > 1 if frame is not None else len(accounts) > 1
    return runs_table(frames, types, several)


def _keys(category, phase):
    """ "category|phase" per row as Labels (null where the phase is missing), from the category codes (into
    CATEGORIES) and the phase Labels, without a string per row."""
    n = len(phase.words)
    labels = [f"{c}|{p}" for c in CATEGORIES for p in phase.words]
    c, p = category.astype(np.int64), phase.codes
    return Labels(np.where((c >= 0) & (p >= 0), c * n + p, -1), labels)


def _pick(figures, category, phase):
    """Sum of per-step figures keyed "category|phase" for one phase, or every phase for "total"."""
    keys = [k for k in figures if k.startswith(category + "|") and (phase == "total" or k.endswith("|" + phase))]
    return float(sum((figures[k] for k in keys), 0.0))
