"""Collectives of a distributed trace: bytes moved, time, bandwidth, and their share of a step.

    comm_bytes          the message size S as nccl-tests defines it: all-reduce and
                        broadcast the tensor; all-gather and reduce-scatter the full
                        array (per-rank size x ranks)
    duration_s          time from the launch until the collective's work completed,
                        waiting for the slowest rank included (tracer.recording.distributed)
    algbw_bytes_per_s   S / duration
    busbw_bytes_per_s   algbw x the nccl-tests factor for n ranks: all-reduce
                        2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n;
                        broadcast, reduce, send and recv 1. It is the bandwidth each
                        link carried, comparable across collectives and rank counts.

Collective rows are those with a `comm_bytes` value; the kind comes from the op name. The collectives table
(reports.collectives) is reports.distributed.sql_ranks's, over ranks.sql's view collective_calls; comm_split and
per_step_traffic run views.sql's comm_split and collective_totals, over a trace's files (a reports.sql.engine.Trace,
as `optrace report` opens one) or over the rows of a DataFrame or pyarrow Table (reports.sql.frame).
"""

import math

import numpy as np

from reports._util import empty_frame

__all__ = [
    "COLLECTIVE_COLUMNS",
    "collective_rows",
    "traffic_records",
    "shape_collectives",
    "comm_split",
    "collective_kind",
    "bus_factor",
    "traffic",
    "per_step_traffic",
    "FAKE_BACKENDS",
]

# Process groups that move no data (torch's fake process group for simulated jobs): their times mean nothing.
FAKE_BACKENDS = frozenset({"fake"})

# op-name fragment -> kind, first match wins (reduce_scatter before reduce)
_KINDS = (
    ("reduce_scatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
)
_RING = {"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"}  # (n-1)/n


def collective_kind(op):
    """'c10d.allreduce_.default' -> 'all_reduce'; 'other' for a name no kind matches."""
    name = str(op).split(".")[1] if str(op).count(".") >= 1 else str(op)
    for fragment, kind in _KINDS:
        if fragment in name:
            return kind
    return "other"


def bus_factor(kind, n):
    """nccl-tests' bus bandwidth factor of a collective kind on n ranks."""
    if n is None or n != n or n < 1:
        return float("nan")
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in _RING:
        return (n - 1) / n
    return 1.0


# the kinds whose traffic depends on which rank is the root, which the trace does not record: traffic() gives the
# most any rank moves (broadcast, reduce) or the root's side (gather, scatter), a bound for this rank
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def traffic(kind, n):
    """(sent, received) bytes per byte of message S for one rank, by the algorithm NCCL's rings use.

    all-reduce 2(n-1)/n each way (a reduce-scatter then an all-gather); all-gather,
    reduce-scatter and all-to-all (n-1)/n each way; broadcast and reduce S each way
    (a pipelined ring: every rank but the root receives S, every rank but the last
    forwards it; the figure is the most any rank moves); gather and scatter (n-1)/n
    (the root's side); send S out, recv S in; a barrier nothing."""
    if n is None or n != n or n < 1:
        return float("nan"), float("nan")
    ring = (n - 1) / n
    if kind == "all_reduce":
        return 2 * ring, 2 * ring
    if kind in _RING:
        return ring, ring
    if kind in ("broadcast", "reduce"):
        return (1.0, 1.0) if n > 1 else (0.0, 0.0)
    return {"send": (1.0, 0.0), "recv": (0.0, 1.0)}.get(kind, (0.0, 0.0))


COLLECTIVE_COLUMNS = {
    "run": object,
    "rank": "int64",
    "collective": object,
    "op": object,
    "process_group": object,
    "group_size": "int64",
    "comm_bytes": "int64",
    "calls": "int64",
    "duration_s": "float64",
    "algbw_bytes_per_s": "float64",
    "busbw_bytes_per_s": "float64",
}


def shape_collectives(out):
    """The collectives table from its groups in order of first appearance (run, rank, collective, op,
    process_group, group_size, comm_bytes, calls, total: summed duration_ns); reports.distributed.sql_ranks
    gives the groups from SQL."""
    import pandas as pd

    return pd.DataFrame(collective_rows(out.to_dict("records")), columns=list(COLLECTIVE_COLUMNS)).astype(
        COLLECTIVE_COLUMNS
    )


def collective_rows(groups):
    """shape_collectives of its groups as [{column: value}] ([{run, rank, collective, op, process_group, group_size,
    comm_bytes, calls, total}]): sorted by run, rank, then total time, largest first (ties in their order)."""
    if not groups:
        return []
    total = np.asarray([g["total"] for g in groups], dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        duration = total / np.asarray([g["calls"] for g in groups], dtype=np.int64) / 1e9
        algbw = np.asarray([g["comm_bytes"] for g in groups], dtype=np.float64) / np.where(
            duration > 0, duration, np.nan
        )
    busbw = algbw * np.asarray([bus_factor(g["collective"], g["group_size"]) for g in groups], dtype=np.float64)
    out = [
        {**g, "duration_s": d, "algbw_bytes_per_s": a, "busbw_bytes_per_s": b}
        for g, d, a, b in zip(groups, duration.tolist(), algbw.tolist(), busbw.tolist())
    ]
    out.sort(key=lambda r: (r["run"], r["rank"], -r["total"]))
    return [{c: r[c] for c in COLLECTIVE_COLUMNS} for r in out]


_SPLIT = {
    "run": object,
    "rank": "int64",
    "step": "int64",
    "compute_s": "float64",
    "comm_s": "float64",
    "comm_bytes": "int64",
    "comm_pct": "float64",
}


def comm_split(df):
    """Compute against communication, per run, rank and step.

    compute_s: summed time of the ops that are not collectives; comm_s: summed time of
    the collectives (to completion, so an async collective that overlapped compute
    counts in both); comm_pct: comm_s / (compute_s + comm_s) x 100. A run's rank is
    its `rank` column's (reports.load's of a distributed trace), else 0."""
    from reports.sql.frame import trace_of

    with trace_of(df, "comm_split", ("step", "comm_bytes", "duration_ns")) as trace:
        table = trace.sql("SELECT * FROM comm_split ORDER BY run_index, step")
        if not len(table):
            return empty_frame(_SPLIT)
        table["rank"] = [int(trace.ranks[i] or 0) for i in table["run_index"]]
        return table[list(_SPLIT)].astype(_SPLIT)


TRAFFIC_COLUMNS = {
    "run": object,
    "rank": "int64",
    "collective": object,
    "process_group": object,
    "group_size": "int64",
    "calls_per_step": "float64",
    "message_bytes_per_step": "float64",
    "sent_bytes_per_step": "float64",
    "received_bytes_per_step": "float64",
}
_PHASE_ORDER = ("forward", "backward", "optimizer", "other")


def per_step_traffic(df):
    """What one rank sends and receives per training step, per run, collective kind and group.

    calls_per_step and message_bytes_per_step (the nccl-tests message size S, summed),
    sent_bytes_per_step and received_bytes_per_step: S times `traffic`'s factors for
    the kind and group size, the bytes this rank puts on and takes off its links.
    Needs no timing, so it holds for a rank of a simulated job (a fake process group).
    Each phase's totals are divided by the steps it ran in (reports.steps.per_step)."""
    from reports.sql.frame import trace_of

    required = ("step", "phase", "op", "comm_bytes", "group_size", "process_group")
    with trace_of(df, "per_step_traffic", required) as trace:
        out = traffic_records(trace)
    import pandas as pd

    return pd.DataFrame(out, columns=list(TRAFFIC_COLUMNS)).astype(TRAFFIC_COLUMNS)


def traffic_records(trace):
    """per_step_traffic's rows of a reports.sql.engine.Trace as [{column: value}], in its order: by run, then the
    most bytes sent first (ties in order of first appearance, a NaN last)."""
    totals = trace.arrow(
        "SELECT * REPLACE (CAST(message_bytes AS DOUBLE) AS message_bytes) FROM collective_totals "
        "ORDER BY run_index, first_seq"
    ).to_pylist()
    steps = trace.phase_steps()
    out = []
    for i, run in enumerate(trace.runs):
        mine = [r for r in totals if r["run_index"] == i]
        if mine:
            out += _traffic_rows(run, int(trace.ranks[i] or 0), mine, steps[i])
    return sorted(out, key=lambda r: (r["run"], math.isnan(r["sent_bytes_per_step"]), -r["sent_bytes_per_step"]))


def _traffic_rows(run, rank, totals, steps):
    """per_step_traffic's records of one run from its collective_totals rows and {phase: steps}."""
    figures = {}
    for r in totals:
        kind = collective_kind(r["op"])
        sent, received = traffic(kind, int(r["group_size"]))
        key = (kind, r["process_group"], int(r["group_size"]))
        f = figures.setdefault(key, {"first": r["first_seq"], **{p: [0, 0.0, 0.0, 0.0] for p in steps}})
        f["first"] = min(f["first"], r["first_seq"])
        acc = f[r["phase"]]
        acc[0] += int(r["calls"])
        acc[1] += float(r["message_bytes"])
        acc[2] += float(r["message_bytes"]) * sent
        acc[3] += float(r["message_bytes"]) * received
    order = sorted(steps, key=lambda p: _PHASE_ORDER.index(p) if p in _PHASE_ORDER else len(_PHASE_ORDER))
    out = []
    for (kind, group, n), f in sorted(figures.items(), key=lambda kv: kv[1]["first"]):
        per = [0.0, 0.0, 0.0, 0.0]
        for p in order:
            per = [a + b / steps[p] for a, b in zip(per, f[p])]
        out.append(
            {
                "run": run,
                "rank": rank,
                "collective": kind,
                "process_group": group,
                "group_size": n,
                "calls_per_step": per[0],
                "message_bytes_per_step": per[1],
                "sent_bytes_per_step": per[2],
                "received_bytes_per_step": per[3],
            }
        )
    return out
