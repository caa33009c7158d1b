"""The distributed sections of `optrace report` from the SQL views of reports/sql/ranks.sql: each takes a
reports.sql.engine.Trace (of every rank: one run per rank) and returns what its pandas reference (tests.oracles.ranks,
over a loaded frame) returns: is_multi_rank, ranks, imbalance, job_summary (the first run's per_step_traffic) and
collectives (reports.collectives).

SQL sums each run's rows per phase and per step (one row per run and phase, per run and step, per
collective group), so what Python holds is the size of the result, not of the trace. Per-step figures
divide each phase's total by the steps it ran in and add the phases in reports.steps's order, as
per_step does; integer totals are exact, so the figures are the reference's to the last bit.
"""

import weakref

import numpy as np
import pyarrow as pa

from reports.arrays import array_of, numpy_of, values_of
from reports.distributed.ranks import (
    IMBALANCE_COLUMNS,
    PHASE_ORDER,
    RANK_COLUMNS,
    imbalance_records,
    job_object,
    trace_of,
)
from reports.sql import frame
from reports.sql.tables import count_steps, fetch_arrow

__all__ = [
    "collectives",
    "imbalance",
    "imbalance_table",
    "is_multi_rank",
    "job_summary",
    "lowest_rank_collectives",
    "ranks",
    "ranks_table",
]
_KINDS = {object: pa.string(), "int64": pa.int64(), "float64": pa.float64()}


def _frame(records, types):
    """[{column: value}] as the library's DataFrame of `types` ({column: dtype})."""
    import pandas as pd

    return pd.DataFrame(records, columns=list(types)).astype(types)


def _table(records, types):
    """[{column: value}] as the report's pyarrow Table of `types` ({column: dtype})."""
    return pa.table({c: array_of([r[c] for r in records], _KINDS[kind]) for c, kind in types.items()})


def is_multi_rank(trace):
    """Whether the trace holds more than one rank (reports.load's `rank` column takes two values or more)."""
    return len({int(r or 0) for r in trace.ranks}) > 1 and any(r is not None for r in trace.ranks)


def _rank(trace, i):
    return int(trace.ranks[i] or 0)


_COLUMNS = ("step", "phase", "flops", "duration_ns", "start_ns", "comm_bytes")  # and `run`, for a frame
_DONE = weakref.WeakKeyDictionary()  # Trace -> its per-rank figures: ranks and imbalance share one scan of the rows


def _per_rank(trace):
    """(totals per run and phase [{column: value}], per-step figures {run_index: {column: figure}}, step times
    {run_index: seconds}), from one scan of every rank's rows (view rank_step_phase, kept as a temporary table of one
    row per run, step and phase)."""
    if trace in _DONE:
        return _DONE[trace]
    trace.db.execute("CREATE TEMP TABLE IF NOT EXISTS rank_step_phase_once AS SELECT * FROM rank_step_phase")
    sums = ("ops", "flops", "comm_bytes", "comm_ops", "comm_ns", "compute_ns", "duration_ns")
    totals = fetch_arrow(
        trace,
        f"(SELECT run, run_index, phase, {', '.join(f'sum({c}) AS {c}' for c in sums)}, "
        "min(first_seq) AS first_seq FROM rank_step_phase_once GROUP BY run, run_index, phase)",
        "first_seq",
        sums,
    )
    figures = {
        i: {c: float(v[0]) for c, v in found.items()}
        for i, (_, found) in trace.per_step_arrow(totals, ["flops", "comm_bytes", "comm_ns", "compute_ns"]).items()
    }
    spans = trace.arrow(
        "SELECT run_index, step, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM rank_step_phase_once "
        "GROUP BY run_index, step ORDER BY run_index, step"
    )
    run_index = numpy_of(spans.column("run_index"))
    seconds = (values_of(spans.column("end_ns")) - values_of(spans.column("start_ns"))) / 1e9
    times = {}
    for i in np.unique(run_index).tolist():
        mine = seconds[run_index == i]
        known = int(np.count_nonzero(~np.isnan(mine)))  # as _step_times(rows).mean(): a NaN left out
        times[int(i)] = float(np.where(np.isnan(mine), 0.0, mine).sum() / known) if known else float("nan")
    _DONE[trace] = totals.to_pylist(), figures, times
    return _DONE[trace]


def ranks(rows):
    """One row per run (a rank): FLOPs, communication bytes and time, compute time and
    step time, each per step (averaged over the run's steps). `rows`: a Trace, a loaded frame or an Arrow table."""
    with frame.trace_of(rows, "ranks", _COLUMNS, ["rank"]) as trace:
        return _frame(_ranks(trace), RANK_COLUMNS)


def ranks_table(trace):
    """ranks of a Trace as a pyarrow Table (the report's)."""
    return _table(_ranks(trace), RANK_COLUMNS)


def _ranks(trace):
    totals, figures, times = _per_rank(trace)
    out = []
    for i, run in enumerate(trace.runs):
        if i not in times:  # a run without rows
            continue
        f = figures[i]
        out.append(
            {
                "run": run,
                "rank": _rank(trace, i),
                "steps": count_steps(trace, i),
                "flops_per_step": float(f["flops"]),
                "comm_bytes_per_step": float(f["comm_bytes"]),
                "comm_s_per_step": float(f["comm_ns"]) / 1e9,
                "compute_s_per_step": float(f["compute_ns"]) / 1e9,
                "step_time_s": times[i],
            }
        )
    return out


def imbalance(rows):
    """Per distributed trace and phase (forward, backward, optimizer, other, then `step`):
    the mean and the largest time per step over the ranks, imbalance = max / mean
    (1.0: balanced), and the slowest rank. A phase's time is the summed time of its
    ops (collectives to their completion, so waiting for a slower rank shows up in the
    waiting rank's collectives); `step` is the wall time of a step. `rows`: as ranks takes them."""
    with frame.trace_of(rows, "imbalance", _COLUMNS, ["rank"]) as trace:
        return _frame(_imbalance(trace), IMBALANCE_COLUMNS)


def imbalance_table(trace):
    """imbalance of a Trace as a pyarrow Table (the report's)."""
    return _table(_imbalance(trace), IMBALANCE_COLUMNS)


def _imbalance(trace):
    totals, _, times = _per_rank(trace)
    steps = trace.phase_steps()
    per_rank = []
    for i, run in enumerate(trace.runs):
        if i not in times:
            continue
        mine = {r["phase"]: r for r in totals if r["run_index"] == i}
        # per_step(rows, "duration_ns", mask=phase == p): that phase's total over its steps (0.0 + x / steps)
        entry = {
            p: (0.0 + float(np.float64(mine[p]["duration_ns"]) / steps[i][p])) / 1e9 for p in PHASE_ORDER if p in mine
        }
        entry["step"] = times[i]
        per_rank.append((trace_of(run), _rank(trace, i), entry))
    return imbalance_records(per_rank)


def job_summary(trace, present):
    """reports.distributed.ranks job_summary: the first run standing for its job; None outside a process group."""
    (run, meta), *_ = trace.runs.items()
    if meta.get("world_size") is None:
        return None
    from reports.distributed.collectives import traffic_records

    return job_object(meta, present, [r for r in traffic_records(trace) if r["run"] == run])


def collectives(rows, run_indices=None):
    """One row per run, rank, collective kind, op, group and message size, of the runs `run_indices` (default: all).

    calls: how many there were; duration_s: their mean time; algbw and busbw from the
    mean time (see reports.distributed.collectives). Sorted by run, rank, then total time, largest first.
    `rows`: a Trace, a loaded frame or an Arrow table (ranks.sql's view collective_calls over its rows)."""
    from reports.distributed.collectives import COLLECTIVE_COLUMNS

    with frame.trace_of(rows, "collectives", _CALL_COLUMNS, ["rank"]) as trace:
        return _frame(_collectives(trace, run_indices), COLLECTIVE_COLUMNS)


_CALL_COLUMNS = ("step", "op", "comm_bytes", "group_size", "process_group", "duration_ns")  # and `run`, for a frame


def _collectives(trace, run_indices):
    where = None if run_indices is None else f"run_index IN ({', '.join(str(int(i)) for i in run_indices) or 'NULL'})"
    from reports.distributed.collectives import collective_kind, collective_rows

    groups = fetch_arrow(trace, "collective_calls", "first_seq", ("calls", "total_ns"), where=where).to_pylist()
    out = [
        {
            "run": g["run"],
            "rank": _rank(trace, int(g["run_index"])),
            "collective": collective_kind(g["op"]),
            "op": g["op"],
            "process_group": g["process_group"],
            "group_size": g["group_size"],
            "comm_bytes": g["comm_bytes"],
            "calls": int(g["calls"]),
            "total": int(g["total_ns"]),
        }
        for g in groups
    ]
    return collective_rows(out)


def lowest_rank_collectives(trace):
    """collectives of the lowest rank that ran any (what the report's rank section prints) as a pyarrow Table,
    reading only its runs' collective rows: which runs ran collectives comes from rank_step_phase's counts."""
    from reports.distributed.collectives import COLLECTIVE_COLUMNS

    totals, _, _ = _per_rank(trace)
    with_comm = sorted({int(r["run_index"]) for r in totals if r["comm_ops"] > 0})
    low = min((_rank(trace, i) for i in with_comm), default=None)
    return _table(_collectives(trace, [i for i in with_comm if _rank(trace, i) == low]), COLLECTIVE_COLUMNS)
