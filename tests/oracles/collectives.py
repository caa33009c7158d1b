"""The pandas implementation of reports.comm_split and reports.distributed.collectives.per_step_traffic, kept as a
test oracle of views.sql's comm_split and collective_totals as reports.distributed.collectives runs them
(tests/reports/sql/test_library_views.py; tests/oracles/ranks.py reads per_step_traffic for the job summary).
"""

import pandas as pd

from reports.distributed.collectives import _SPLIT, TRAFFIC_COLUMNS, collective_kind, traffic
from reports.loading.load import require
from reports.tables import split_runs

__all__ = ["comm_split", "per_step_traffic"]


def _ranked(df):
    return df if "rank" in df.columns else df.assign(rank=0)


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
