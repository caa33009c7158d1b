"""Several ranks of one distributed trace side by side: per-rank figures and imbalance.

A distributed trace is a directory with one `rank=R` directory of parts per rank
(hive layout). `reports.load` reads each rank as its own run, named
`<run name>/rank=R`, and adds a `rank` column, so every per-run report (breakdown,
mfu, memory) is already per rank; this module compares the ranks.

Times are traced times (tracing slows every op alike), good for comparing ranks
with each other, not for measuring speed.

The tables (reports.ranks, reports.imbalance) are reports.distributed.sql_ranks's, over the views of ranks.sql;
this module holds what they share with the report: the columns, the imbalance of per-rank figures, the --json objects.
"""

__all__ = [
    "IMBALANCE_COLUMNS",
    "PHASE_ORDER",
    "RANK_COLUMNS",
    "imbalance_of",
    "imbalance_records",
    "job_object",
    "summary_records",
    "trace_of",
]

RANK_SEPARATOR = "/rank="
PHASE_ORDER = ("forward", "backward", "optimizer", "other")


def trace_of(run):
    """'gpt/rank=1' -> 'gpt': the distributed trace a rank's run belongs to."""
    return str(run).split(RANK_SEPARATOR, 1)[0]


RANK_COLUMNS = {
    "run": object,
    "rank": "int64",
    "steps": "int64",
    "flops_per_step": "float64",
    "comm_bytes_per_step": "float64",
    "comm_s_per_step": "float64",
    "compute_s_per_step": "float64",
    "step_time_s": "float64",
}
IMBALANCE_COLUMNS = {
    "trace": object,
    "phase": object,
    "ranks": "int64",
    "mean_s": "float64",
    "max_s": "float64",
    "imbalance": "float64",
    "slowest_rank": "int64",
}


def imbalance_of(per_rank):
    """The imbalance table (a DataFrame) from [(trace, rank, {phase: seconds per step, "step": step time})], one per
    run in load order (reports.distributed.sql_ranks gives the same entries from SQL)."""
    import pandas as pd

    return pd.DataFrame(imbalance_records(per_rank), columns=list(IMBALANCE_COLUMNS)).astype(IMBALANCE_COLUMNS)


def imbalance_records(per_rank):
    """imbalance_of's rows as [{column: value}]."""
    out = []
    for trace in dict.fromkeys(t for t, _, _ in per_rank):
        members = [(rank, entry) for t, rank, entry in per_rank if t == trace]
        for phase in (*PHASE_ORDER, "step"):
            values = [(entry[phase], rank) for rank, entry in members if phase in entry]
            if not values:
                continue
            mean = sum(v for v, _ in values) / len(values)
            top, slowest = max(values)
            out.append(
                {
                    "trace": trace,
                    "phase": phase,
                    "ranks": len(values),
                    "mean_s": mean,
                    "max_s": top,
                    "imbalance": top / mean if mean > 0 else float("nan"),
                    "slowest_rank": slowest,
                }
            )
    return out


# --- for `optrace report` ------------------------------------------------------------------------
def summary_records(ranks_table, imbalance_table):
    """rank_summary's object from the ranks and imbalance tables."""

    def records(frame):
        return [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in frame.to_dict("records")
        ]

    return {"ranks": records(ranks_table), "imbalance": records(imbalance_table)}


def job_object(meta, present, table):
    """job_summary's object from the run's metadata and its per_step_traffic table (a DataFrame, or its rows as
    [{column: value}])."""
    from reports.distributed.collectives import FAKE_BACKENDS, ROOTED

    return {
        "rank": meta.get("rank"),
        "world_size": int(meta["world_size"]),
        "backend": meta.get("backend"),
        "ranks_present": int(present),
        "fake_process_group": meta.get("backend") in FAKE_BACKENDS,
        # collectives timed to their launch only (gloo's reduce-scatter reports no completion): their time is a lower
        # bound, their bandwidth an upper one; null for a trace whose metadata lacks the count
        "collectives_untimed": meta.get("collectives_untimed"),
        "collectives": [
            {
                **{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items() if k not in ("run", "rank")},
                # sent and received are a bound: the most any rank moves, the trace recording no root
                "traffic_bound": row["collective"] in ROOTED,
            }
            for row in (table if isinstance(table, list) else table.to_dict("records"))
        ],
    }
