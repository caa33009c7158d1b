"""The distributed sections of `optrace report` from the SQL views of reports/sql/ranks.sql: each takes a
reports.sql.engine.Trace (of every rank: one run per rank) and returns what its pandas reference returns.

    pandas reference (a loaded frame)                    here (a Trace)
    reports/distributed/ranks.py is_multi_rank           is_multi_rank
    ranks, imbalance                                     ranks, imbalance
    job_summary (the first run's per_step_traffic)       job_summary
    collectives.collectives                              collectives

SQL sums each run's rows per phase and per step (one row per run and phase, per run and step, per
collective group), so what Python holds is the size of the result, not of the trace. Per-step figures
divide each phase's total by the steps it ran in and add the phases in reports/steps.py's order, as
per_step does; integer totals are exact, so the figures are the reference's to the last bit.
"""

import numpy as np
import pandas as pd

from reports.distributed.collectives import collective_kind, shape_collectives
from reports.distributed.ranks import _RANKS, PHASE_ORDER, imbalance_of, job_object, trace_of
from reports.sql.tables import count_steps, fetch

__all__ = ["collectives", "imbalance", "is_multi_rank", "job_summary", "ranks"]


def is_multi_rank(trace):
    """Whether the trace holds more than one rank (reports.load's `rank` column takes two values or more)."""
    return len({int(r or 0) for r in trace.ranks}) > 1 and any(r is not None for r in trace.ranks)


def _rank(trace, i):
    return int(trace.ranks[i] or 0)


def _per_rank(trace):
    """(per-step figures {run_index: frame}, step times {run_index: seconds}, phases present {run_index: set})."""
    totals = fetch(trace, "rank_phase_totals", "first_seq", ("flops", "comm_bytes", "comm_ns", "compute_ns", "duration_ns"))
    figures = trace.per_step(totals, ["flops", "comm_bytes", "comm_ns", "compute_ns"])
    spans = trace.sql("SELECT run_index, step, start_ns, end_ns FROM step_spans ORDER BY run_index, step")
    times = {}
    for i, s in spans.groupby("run_index", sort=True):
        times[int(i)] = float(((s["end_ns"] - s["start_ns"]) / 1e9).mean())  # as _step_times(rows).mean()
    return totals, figures, times


def ranks(trace):
    """reports/distributed/ranks.py ranks: one row per run (a rank) with rows."""
    totals, figures, times = _per_rank(trace)
    out = []
    for i, run in enumerate(trace.runs):
        if i not in times:  # a run without rows
            continue
        f = figures[i].iloc[0]
        out.append({
            "run": run, "rank": _rank(trace, i), "steps": count_steps(trace, i),
            "flops_per_step": float(f["flops"]), "comm_bytes_per_step": float(f["comm_bytes"]),
            "comm_s_per_step": float(f["comm_ns"]) / 1e9, "compute_s_per_step": float(f["compute_ns"]) / 1e9,
            "step_time_s": times[i],
        })  # fmt: skip
    return pd.DataFrame(out, columns=list(_RANKS)).astype(_RANKS)


def imbalance(trace):
    """reports/distributed/ranks.py imbalance: each phase's time per step over the ranks, and the step's."""
    totals, _, times = _per_rank(trace)
    steps = trace.phase_steps()
    per_rank = []
    for i, run in enumerate(trace.runs):
        if i not in times:
            continue
        mine = totals[totals["run_index"] == i].set_index("phase")
        # per_step(rows, "duration_ns", mask=phase == p): that phase's total over its steps (0.0 + x / steps)
        entry = {p: (0.0 + float(np.float64(mine.loc[p, "duration_ns"]) / steps[i][p])) / 1e9
                 for p in PHASE_ORDER if p in mine.index}  # fmt: skip
        entry["step"] = times[i]
        per_rank.append((trace_of(run), _rank(trace, i), entry))
    return imbalance_of(per_rank)


def job_summary(trace, present):
    """reports/distributed/ranks.py job_summary: the first run standing for its job; None outside a process group."""
    from reports.sql_report import per_step_traffic

    (run, meta), *_ = trace.runs.items()
    if meta.get("world_size") is None:
        return None
    table = per_step_traffic(trace)
    return job_object(meta, present, table[table["run"] == run].reset_index(drop=True))


def collectives(trace, run_indices=None):
    """reports/distributed/collectives.py collectives of the runs `run_indices` (default: all)."""
    where = None if run_indices is None else f"run_index IN ({', '.join(str(int(i)) for i in run_indices)})"
    groups = fetch(trace, "collective_calls", "first_seq", ("calls", "total_ns"), where=where)
    out = pd.DataFrame({
        "run": groups["run"].astype(object),
        "rank": [_rank(trace, int(i)) for i in groups["run_index"]],
        "collective": groups["op"].astype(object).map(collective_kind),
        "op": groups["op"].astype(object),
        "process_group": groups["process_group"].astype(object),
        "group_size": groups["group_size"],
        "comm_bytes": groups["comm_bytes"],
        "calls": groups["calls"].astype("int64"),
        "total": groups["total_ns"].astype("int64"),
    })  # fmt: skip
    return shape_collectives(out)
