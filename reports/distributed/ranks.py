"""Several ranks of one distributed trace side by side: per-rank figures and imbalance.

A distributed trace is a directory with one `rank=R` directory of parts per rank
(hive layout). `reports.load` reads each rank as its own run, named
`<run name>/rank=R`, and adds a `rank` column, so every per-run report (breakdown,
mfu, memory) is already per rank; this module compares the ranks.

Times are traced times (tracing slows every op alike), good for comparing ranks
with each other, not for measuring speed.
"""

import os
import re

import pandas as pd

from reports.loading.load import require
from reports.steps import count_steps, per_step
from reports.tables import split_runs

__all__ = ["rank_paths", "ranks", "imbalance", "first_rank", "is_multi_rank", "rank_summary", "print_ranks",
           "ranks_present", "job_summary", "print_job"]

_RANK_DIR = re.compile(r"^rank=(\d+)$")
RANK_SEPARATOR = "/rank="
PHASE_ORDER = ("forward", "backward", "optimizer", "other")


def rank_paths(path):
    """[(rank directory, rank)] of a distributed trace in rank order, or [] for any other path."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return []
    found = []
    for name in os.listdir(path):
        match = _RANK_DIR.match(name)
        if match and os.path.isdir(os.path.join(path, name)):
            found.append((os.path.join(path, name), int(match.group(1))))
    return sorted(found, key=lambda item: item[1])


def ranks_present(path):
    """How many ranks' directories a trace path holds: its `rank=R` directories, 1 for a rank's own directory."""
    found = rank_paths(path)
    if found:
        return len(found)
    return 1 if _RANK_DIR.match(os.path.basename(os.path.normpath(os.fspath(path)))) else 0


def trace_of(run):
    """'gpt/rank=1' -> 'gpt': the distributed trace a rank's run belongs to."""
    return str(run).split(RANK_SEPARATOR, 1)[0]


_RANKS = {
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
    return pd.DataFrame(out, columns=list(_RANKS)).astype(_RANKS)


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
    rows.attrs["runs"] = {first: runs[first]}
    return rows


def rank_summary(df):
    """{"ranks": [one object per rank], "imbalance": [one object per phase]} for `report --json`."""
    def records(frame):
        return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in frame.to_dict("records")]

    return {"ranks": records(ranks(df)), "imbalance": records(imbalance(df))}


def job_summary(df, present):
    """One rank standing for its job: {rank, world_size, backend, ranks_present, fake_process_group,
    collectives: per_step_traffic of the first run as records}; None for a trace of no process group."""
    from reports.distributed.collectives import FAKE_BACKENDS, per_step_traffic

    (run, meta), *_ = df.attrs["runs"].items()
    world = meta.get("world_size")
    if world is None:
        return None
    table = per_step_traffic(df[df["run"] == run] if "run" in df.columns else df)
    return {
        "rank": meta.get("rank"), "world_size": int(world), "backend": meta.get("backend"),
        "ranks_present": int(present), "fake_process_group": meta.get("backend") in FAKE_BACKENDS,
        "collectives": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items() if k not in ("run", "rank")}
            for row in table.to_dict("records")
        ],
    }  # fmt: skip


def print_job(df, present, out):
    """The `Distributed` section of `optrace report`: world size, ranks present, and what this rank's
    collectives send and receive per step. Printed for every rank of a process group, one rank or many."""
    from reports.output.cli import _bytes

    job = job_summary(df, present)
    if job is None:
        return
    missing = "" if present >= job["world_size"] else f"; {present} of {job['world_size']} ranks present in the trace"
    print(f"\nDistributed: rank {job['rank']} of world size {job['world_size']} (backend {job['backend']}{missing})", file=out)
    if not job["collectives"]:
        print("  no collectives traced", file=out)
        return
    print(f"Collectives per step of rank {job['rank']} (sent and received: by the ring algorithms of NCCL)", file=out)
    shown = pd.DataFrame({
        "collective": [c["collective"] for c in job["collectives"]],
        "group": [f"{c['process_group'] or '-'} ({c['group_size']})" for c in job["collectives"]],
        "calls": [f"{c['calls_per_step']:g}" for c in job["collectives"]],
        "message": [_bytes(c["message_bytes_per_step"]) for c in job["collectives"]],
        "sent": [_bytes(c["sent_bytes_per_step"]) for c in job["collectives"]],
        "received": [_bytes(c["received_bytes_per_step"]) for c in job["collectives"]],
    })  # fmt: skip
    print(shown.to_string(index=False), file=out)
    if job["fake_process_group"]:
        print("  No bandwidth or collective time: a fake process group moves no data, so its timings mean nothing.", file=out)


def print_ranks(df, out):
    """The per-rank section of `optrace report` on a distributed trace."""
    from reports.output.cli import _bytes, _human

    table = ranks(df)
    (_, meta), *_ = df.attrs["runs"].items()
    world = meta.get("world_size")
    of = f" of {world}" if world and world != len(table) else ""
    print(f"\nRanks ({len(table)}{of}): per step, traced times", file=out)
    shown = pd.DataFrame({
        "rank": table["rank"], "FLOPs": table["flops_per_step"].map(_human),
        "comm bytes": table["comm_bytes_per_step"].map(_bytes),
        "comm ms": (table["comm_s_per_step"] * 1e3).map("{:.2f}".format),
        "compute ms": (table["compute_s_per_step"] * 1e3).map("{:.2f}".format),
        "step ms": (table["step_time_s"] * 1e3).map("{:.2f}".format),
    })  # fmt: skip
    print(shown.to_string(index=False), file=out)
    imb = imbalance(df)
    print("Imbalance (max / mean over ranks of the time per step)", file=out)
    for row in imb.itertuples():
        print(f"  {row.phase:<10} {row.imbalance:.3f}  (max {row.max_s * 1e3:.2f} ms on rank {row.slowest_rank}, "
              f"mean {row.mean_s * 1e3:.2f} ms)", file=out)
    step = imb[imb["phase"] == "step"]
    if len(step):
        print(f"The slowest rank is {int(step['slowest_rank'].iloc[0])} (longest step).", file=out)
    split = _collective_lines(df)
    if split:
        print("Collectives (rank 0)", file=out)
        for line in split:
            print(f"  {line}", file=out)


def _collective_lines(df):
    from reports.distributed.collectives import FAKE_BACKENDS, collectives
    from reports.output.cli import _bytes

    (_, meta), *_ = df.attrs["runs"].items()
    if meta.get("backend") in FAKE_BACKENDS:
        return []  # no data moved: no bandwidth (print_job says why)
    table = collectives(df)
    table = table[table["rank"] == table["rank"].min()] if len(table) else table
    return [
        f"{r.collective:<15} {r.calls} x {_bytes(r.comm_bytes)}: {r.duration_s * 1e3:.2f} ms each, "
        f"busbw {_bytes(r.busbw_bytes_per_s)}/s"
        for r in table.itertuples()
    ]
