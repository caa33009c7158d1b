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
(reports.collectives) is reports/distributed/sql_ranks.py's, over ranks.sql's view collective_calls.
"""

import pandas as pd

from reports.loading.load import require
from reports.tables import split_runs

__all__ = [
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


_OUT = {
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


def _ranked(df):
    return df if "rank" in df.columns else df.assign(rank=0)


def shape_collectives(out):
    """The collectives table from its groups in order of first appearance (run, rank, collective, op,
    process_group, group_size, comm_bytes, calls, total: summed duration_ns); reports/distributed/sql_ranks.py
    gives the groups from SQL."""
    if not len(out):
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _OUT.items()})
    out["duration_s"] = out["total"] / out["calls"] / 1e9
    algbw = out["comm_bytes"].astype("float64") / out["duration_s"].where(out["duration_s"] > 0)
    out["algbw_bytes_per_s"] = algbw
    factors = [bus_factor(k, n) for k, n in zip(out["collective"], out["group_size"])]
    out["busbw_bytes_per_s"] = algbw * pd.Series(factors, index=out.index, dtype="float64")
    out = out.sort_values(["run", "rank", "total"], ascending=[True, True, False], kind="stable")
    return out[list(_OUT)].astype(_OUT).reset_index(drop=True)


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
    counts in both); comm_pct: comm_s / (compute_s + comm_s) x 100."""
    require(df, ("run", "step", "comm_bytes", "duration_ns"), "comm_split")
    frames = []
    for run, rows in split_runs(_ranked(df)):
        is_comm = rows["comm_bytes"].notna()
        table = (
            pd.DataFrame(
                {
                    "rank": rows["rank"],
                    "step": rows["step"],
                    "compute": rows["duration_ns"].where(~is_comm, 0),
                    "comm": rows["duration_ns"].where(is_comm, 0),
                    "comm_bytes": rows["comm_bytes"].fillna(0),
                }
            )
            .groupby(["rank", "step"], sort=True)
            .sum()
            .reset_index()
        )
        table.insert(0, "run", run)
        frames.append(table)
    if not frames or not sum(len(f) for f in frames):
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _SPLIT.items()})
    out = pd.concat(frames, ignore_index=True)
    out["compute_s"] = out["compute"] / 1e9
    out["comm_s"] = out["comm"] / 1e9
    total = out["compute_s"] + out["comm_s"]
    out["comm_pct"] = 100.0 * out["comm_s"] / total.where(total > 0)
    return out[list(_SPLIT)].astype(_SPLIT)


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


def per_step_traffic(df):
    """What one rank sends and receives per training step, per run, collective kind and group.

    calls_per_step and message_bytes_per_step (the nccl-tests message size S, summed),
    sent_bytes_per_step and received_bytes_per_step: S times `traffic`'s factors for
    the kind and group size, the bytes this rank puts on and takes off its links.
    Needs no timing, so it holds for a rank of a simulated job (a fake process group)."""
    from reports.steps import per_step

    require(df, ("run", "step", "phase", "op", "comm_bytes", "group_size", "process_group"), "per_step_traffic")
    out = []
    for run, rows in split_runs(_ranked(df)):
        comm = rows["comm_bytes"].notna().to_numpy()
        if not comm.any():
            continue
        kinds = rows["op"].astype(object).map(collective_kind)
        size = rows["group_size"].fillna(1).astype("int64")
        group = rows["process_group"].astype(object)
        message = rows["comm_bytes"].fillna(0).astype("float64")
        factors = [traffic(k, n) for k, n in zip(kinds[comm], size[comm])]
        sent = pd.Series(0.0, index=rows.index)
        received = pd.Series(0.0, index=rows.index)
        sent[comm] = message[comm].to_numpy() * [f[0] for f in factors]
        received[comm] = message[comm].to_numpy() * [f[1] for f in factors]
        key = kinds.where(comm, "") + "|" + group + "|" + size.astype(str)
        key = key.where(comm)
        calls = per_step(rows, pd.Series(comm.astype("int64"), index=rows.index), by=key)
        figures = {
            name: per_step(rows, values, by=key)
            for name, values in (("message", message), ("sent", sent), ("received", received))
        }
        rank = int(rows["rank"].iloc[0])
        for k in calls.index:
            kind, name, n = k.split("|")
            out.append(
                {
                    "run": run,
                    "rank": rank,
                    "collective": kind,
                    "process_group": name,
                    "group_size": int(n),
                    "calls_per_step": float(calls[k]),
                    "message_bytes_per_step": float(figures["message"][k]),
                    "sent_bytes_per_step": float(figures["sent"][k]),
                    "received_bytes_per_step": float(figures["received"][k]),
                }
            )
    table = pd.DataFrame(out, columns=list(TRAFFIC_COLUMNS)).astype(TRAFFIC_COLUMNS)
    return table.sort_values(["run", "sent_bytes_per_step"], ascending=[True, False], kind="stable").reset_index(
        drop=True
    )
