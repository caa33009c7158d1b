"""The pandas implementations of reports.ranks, reports.imbalance and the report's rank helpers (is_multi_rank,
first_rank, job_summary), kept as test oracles of reports/distributed/sql_ranks.py
(tests/reports/sql/test_sql_sections.py, tests/tracer/distributed/test_distributed.py)."""

import pandas as pd

from reports.distributed.collectives import COLLECTIVE_COLUMNS, collective_kind, shape_collectives
from reports.distributed.ranks import PHASE_ORDER, RANK_COLUMNS, imbalance_of, job_object, summary_records, trace_of
from reports.loading.columns import SharedRuns
from reports.loading.load import require
from reports.steps import count_steps, per_step
from reports.tables import split_runs
from tests.oracles.collectives import per_step_traffic

_COLUMNS = ("run", "step", "phase", "flops", "duration_ns", "start_ns", "comm_bytes")

__all__ = ["collectives", "first_rank", "imbalance", "is_multi_rank", "job_summary", "rank_summary", "ranks"]


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
        entry = {
            p: float(per_step(rows, "duration_ns", mask=phase == p)) / 1e9 for p in PHASE_ORDER if (phase == p).any()
        }
        entry["step"] = float(_step_times(rows).mean())
        per_rank.append((trace_of(run), _rank_of(rows), entry))
    return imbalance_of(per_rank)


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


def job_summary(df, present):
    """One rank standing for its job: {rank, world_size, backend, ranks_present, fake_process_group,
    collectives: per_step_traffic of the first run as records}; None for a trace of no process group."""

    (run, meta), *_ = df.attrs["runs"].items()
    world = meta.get("world_size")
    if world is None:
        return None
    return job_object(meta, present, per_step_traffic(df[df["run"] == run] if "run" in df.columns else df))


_CALL_COLUMNS = ("run", "step", "op", "comm_bytes", "group_size", "process_group", "duration_ns")


def collectives(df):
    """One row per run, rank, collective kind, op, group and message size.

    calls: how many there were; duration_s: their mean time; algbw and busbw from the
    mean time (see the module docstring). Sorted by run, rank, then total time, largest first."""
    require(df, _CALL_COLUMNS, "collectives")
    rows = df if "rank" in df.columns else df.assign(rank=0)
    rows = rows[rows["comm_bytes"].notna()]
    if not len(rows):
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLLECTIVE_COLUMNS.items()})
    rows = rows.assign(
        collective=rows["op"].astype(object).map(collective_kind),
        op=rows["op"].astype(object),
        process_group=rows["process_group"].astype(object),
        run=rows["run"].astype(object),
    )
    keys = ["run", "rank", "collective", "op", "process_group", "group_size", "comm_bytes"]
    g = rows.groupby(keys, sort=False, dropna=False)
    return shape_collectives(g["duration_ns"].agg(calls="size", total="sum").reset_index())
