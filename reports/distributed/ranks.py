"""Several ranks of one distributed trace side by side: per-rank figures and imbalance.

A distributed trace is a directory with one `rank=R` directory of parts per rank
(hive layout). `reports.load` reads each rank as its own run, named
`<run name>/rank=R`, and adds a `rank` column, so every per-run report (breakdown,
mfu, memory) is already per rank; this module compares the ranks.

Times are traced times (tracing slows every op alike), good for comparing ranks
with each other, not for measuring speed.
"""

import pandas as pd

from reports.loading.columns import SharedRuns
from reports.loading.load import require
from reports.steps import count_steps, per_step
from reports.tables import split_runs

__all__ = ["ranks", "imbalance", "imbalance_of", "first_rank", "is_multi_rank", "rank_summary", "job_summary", "job_object",
           "summary_records"]

RANK_SEPARATOR = "/rank="
PHASE_ORDER = ("forward", "backward", "optimizer", "other")


def trace_of(run):
    """'gpt/rank=1' -> 'gpt': the distributed trace a rank's run belongs to."""
    return str(run).split(RANK_SEPARATOR, 1)[0]


RANK_COLUMNS = {
    "run": object, "rank": "int64", "steps": "int64", "flops_per_step": "float64",
    "comm_bytes_per_step": "float64", "comm_s_per_step": "float64", "compute_s_per_step": "float64",
    "step_time_s": "float64",
}
_COLUMNS = ("run", "step", "phase", "flops", "duration_ns", "start_ns", "comm_bytes")


def _rank_of(rows):
    return int(rows["rank"].iloc[0]) if "rank" in rows.columns and len(rows) else 0


def _step_times(rows):
    """Wall time of each step: first op start to last op end, from start_ns (seconds)."""
    start = rows["start_ns"].astype("float64")
    end = start + rows["duration_ns"].astype("float64")
    spans = pd.DataFrame({"step": rows["step"], "start": start, "end": end}).groupby("step")
    return (spans["end"].max() - spans["start"].min()) / 1e9


def ranks(df):
    """One row per run (a rank): FLOPs, communication bytes and time, compute time and
    step time, each per step (averaged over the run's steps)."""
    require(df, _COLUMNS, "ranks")
    out = []
    for run, rows in split_runs(df):
        if not len(rows):
            continue
        comm = rows["comm_bytes"].notna()
        comm_bytes = rows["comm_bytes"].fillna(0).astype("int64")
        out.append({
            "run": run, "rank": _rank_of(rows), "steps": count_steps(rows),
            "flops_per_step": float(per_step(rows)),
            "comm_bytes_per_step": float(per_step(rows, comm_bytes, mask=comm)),
            "comm_s_per_step": float(per_step(rows, "duration_ns", mask=comm)) / 1e9,
            "compute_s_per_step": float(per_step(rows, "duration_ns", mask=~comm)) / 1e9,
            "step_time_s": float(_step_times(rows).mean()),
        })  # fmt: skip
    return pd.DataFrame(out, columns=list(RANK_COLUMNS)).astype(RANK_COLUMNS)


_IMBALANCE = {
    "trace": object, "phase": object, "ranks": "int64", "mean_s": "float64", "max_s": "float64",
    "imbalance": "float64", "slowest_rank": "int64",
}


def imbalance(df):
    """Per distributed trace and phase (forward, backward, optimizer, other, then `step`):
    the mean and the largest time per step over the ranks, imbalance = max / mean
    (1.0: balanced), and the slowest rank. A phase's time is the summed time of its
    ops (collectives to their completion, so waiting for a slower rank shows up in the
    waiting rank's collectives); `step` is the wall time of a step."""
    require(df, _COLUMNS, "imbalance")
    per_rank = []
    for run, rows in split_runs(df):
        if not len(rows):
            continue
        phase = rows["phase"].astype(object)
        entry = {p: float(per_step(rows, "duration_ns", mask=phase == p)) / 1e9 for p in PHASE_ORDER if (phase == p).any()}
        entry["step"] = float(_step_times(rows).mean())
        per_rank.append((trace_of(run), _rank_of(rows), entry))
    return imbalance_of(per_rank)


def imbalance_of(per_rank):
    """The imbalance table from [(trace, rank, {phase: seconds per step, "step": step time})], one per run
    in load order (reports/distributed/sql_ranks.py gives the same entries from SQL)."""
    out = []
    for trace in dict.fromkeys(t for t, _, _ in per_rank):
        members = [(rank, entry) for t, rank, entry in per_rank if t == trace]
        for phase in (*PHASE_ORDER, "step"):
            values = [(entry[phase], rank) for rank, entry in members if phase in entry]
            if not values:
                continue
            mean = sum(v for v, _ in values) / len(values)
            top, slowest = max(values)
            out.append({
                "trace": trace, "phase": phase, "ranks": len(values), "mean_s": mean, "max_s": top,
                "imbalance": top / mean if mean > 0 else float("nan"), "slowest_rank": slowest,
            })  # fmt: skip
    return pd.DataFrame(out, columns=list(_IMBALANCE)).astype(_IMBALANCE)


# --- for `optrace report` ------------------------------------------------------------------------
def is_multi_rank(df):
    return "rank" in df.columns and df["rank"].nunique() > 1


def first_rank(df):
    """The rows of the first run (rank 0 of a distributed trace), as `load` would return them alone."""
    runs = df.attrs["runs"]
    first = next(iter(runs))
    rows = df[df["run"] == first].copy()
    rows["run"] = rows["run"].cat.set_categories([first])
    rows.attrs["runs"] = SharedRuns({first: runs[first]})  # shared, never deep-copied by pandas
    return rows


def rank_summary(df):
    """{"ranks": [one object per rank], "imbalance": [one object per phase]} for `report --json`."""
    return summary_records(ranks(df), imbalance(df))


def summary_records(ranks_table, imbalance_table):
    """rank_summary's object from the ranks and imbalance tables."""
    def records(frame):
        return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in frame.to_dict("records")]

    return {"ranks": records(ranks_table), "imbalance": records(imbalance_table)}


def job_summary(df, present):
    """One rank standing for its job: {rank, world_size, backend, ranks_present, fake_process_group,
    collectives: per_step_traffic of the first run as records}; None for a trace of no process group."""
    from reports.distributed.collectives import per_step_traffic

    (run, meta), *_ = df.attrs["runs"].items()
    world = meta.get("world_size")
    if world is None:
        return None
    return job_object(meta, present, per_step_traffic(df[df["run"] == run] if "run" in df.columns else df))


def job_object(meta, present, table):
    """job_summary's object from the run's metadata and its per_step_traffic table."""
    from reports.distributed.collectives import FAKE_BACKENDS

    return {
        "rank": meta.get("rank"), "world_size": int(meta["world_size"]), "backend": meta.get("backend"),
        "ranks_present": int(present), "fake_process_group": meta.get("backend") in FAKE_BACKENDS,
        "collectives": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items() if k not in ("run", "rank")}
            for row in table.to_dict("records")
        ],
    }  # fmt: skip
