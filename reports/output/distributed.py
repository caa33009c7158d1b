"""The distributed sections of `optrace report`: one rank's job (world size, collectives' traffic per
step) and, for a trace of several ranks, the ranks side by side with their imbalance."""

import pyarrow as pa

from reports.arrays import array_of, strings
from reports.loading.integrity import stopped_by
from reports.output.table import render, values
from reports.output.text import human, human_bytes, printable

__all__ = ["print_job", "print_ranks"]


def print_job(src, present, out):
    """The `Distributed` section of `optrace report`: world size, ranks present, and what this rank's
    collectives send and receive per step. Printed for every rank of a process group, one rank or many.
    `src`: the run's reports.output.source.Source."""
    job = src.job(present)
    if job is None:
        return
    missing = "" if present >= job["world_size"] else f"; {present} of {job['world_size']} ranks present in the trace"
    print(
        f"\nDistributed: rank {job['rank']} of world size {job['world_size']} (backend {job['backend']}{missing})",
        file=out,
    )
    if not job["collectives"]:
        print("  no collectives traced", file=out)
        return
    print(f"Collectives per step of rank {job['rank']} (sent and received: by the ring algorithms of NCCL)", file=out)
    shown = pa.table(
        {
            "collective": strings([c["collective"] for c in job["collectives"]]),
            "group": strings([f"{c['process_group'] or '-'} ({c['group_size']})" for c in job["collectives"]]),
            "calls": strings([f"{c['calls_per_step']:g}" for c in job["collectives"]]),
            "message": strings([human_bytes(c["message_bytes_per_step"]) for c in job["collectives"]]),
            "sent": strings([human_bytes(c["sent_bytes_per_step"]) for c in job["collectives"]]),
            "received": strings([human_bytes(c["received_bytes_per_step"]) for c in job["collectives"]]),
        }
    )
    print(render(shown), file=out)
    rooted = sorted({c["collective"] for c in job["collectives"] if c.get("traffic_bound")})
    if rooted:
        print(
            f"  {', '.join(rooted)}: sent and received are the most any rank moves (the trace records no root), "
            "a bound for this rank",
            file=out,
        )
    if job["fake_process_group"]:
        print(
            "  No bandwidth or collective time: a fake process group moves no data, so its timings mean nothing.",
            file=out,
        )


def print_ranks(src, out):
    """The per-rank section of `optrace report` on a distributed trace. `src`: a Source over every rank."""
    table = src.ranks()
    (_, meta), *_ = src.runs.items()
    world = meta.get("world_size")
    of = f" of {world}" if world and world != table.num_rows else ""
    print(f"\nRanks ({table.num_rows}{of}): per step, traced times", file=out)

    def ms(column):
        return strings([f"{v * 1e3:.2f}" for v in values(table, column)])

    shown = pa.table(
        {
            "rank": array_of(values(table, "rank"), pa.int64()),
            "FLOPs": strings([human(v) for v in values(table, "flops_per_step")]),
            "comm bytes": strings([human_bytes(v) for v in values(table, "comm_bytes_per_step")]),
            "comm ms": ms("comm_s_per_step"),
            "compute ms": ms("compute_s_per_step"),
            "step ms": ms("step_time_s"),
        }
    )
    print(render(shown), file=out)
    for run, rank in zip(values(table, "run"), values(table, "rank")):  # the first line speaks of rank 0 only
        meta = src.runs.get(run) or {}
        if not meta.get("complete"):
            why = f"the traced code raised {printable(meta['error'])}" if meta.get("error") else stopped_by(meta)
            print(f"  rank {rank}: INCOMPLETE: {why}; its figures cover the rows it has", file=out)
    imb = src.imbalance().to_pylist()
    print("Imbalance (max / mean over ranks of the time per step)", file=out)
    for row in imb:
        print(
            f"  {row['phase']:<10} {row['imbalance']:.3f}  (max {row['max_s'] * 1e3:.2f} ms on rank "
            f"{row['slowest_rank']}, mean {row['mean_s'] * 1e3:.2f} ms)",
            file=out,
        )
    step = [row for row in imb if row["phase"] == "step"]
    if step:
        print(f"The slowest rank is {int(step[0]['slowest_rank'])} (longest step).", file=out)
    split = _collective_lines(src)
    if split:
        print("Collectives (rank 0)", file=out)
        for line in split:
            print(f"  {line}", file=out)


def _collective_lines(src):
    from reports.distributed.collectives import FAKE_BACKENDS

    (_, meta), *_ = src.runs.items()
    if meta.get("backend") in FAKE_BACKENDS:
        return []  # no data moved: no bandwidth (print_job says why)
    return [
        f"{r['collective']:<15} {r['calls']} x {human_bytes(r['comm_bytes'])}: {r['duration_s'] * 1e3:.2f} ms each"
        + (f", busbw {human_bytes(r['busbw_bytes_per_s'])}/s" if r["comm_bytes"] else "")  # a barrier moves no bytes
        for r in src.lowest_rank_collectives().to_pylist()
    ]
