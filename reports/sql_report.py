"""The report tables that need an analysis's Python on top of the SQL views (reports/sql/views.sql):
the roofline's roofs and the collectives' traffic factors. Each returns what its
pandas reference returns for the same trace:

    roofline_with_split(trace)    reports.roofline_with_split(df) (by="op"): the peak FLOP/s per dtype
                                  and the bandwidth come from reports/time/roofline.py, as a small
                                  `roofs` table the split's view joins
    per_step_traffic(trace)       reports.distributed.collectives.per_step_traffic

Float sums (times, per-step figures) may differ from pandas' in the last bit: SQL sums in
another order. Integer columns are exact.
"""

import numpy as np
import pandas as pd

from reports._util import empty_frame
from reports.distributed.collectives import TRAFFIC_COLUMNS, collective_kind, traffic
from reports.sql.tables import fetch
from reports.time.roofline import BOUNDS, ROOFLINE_COLUMNS, SPLIT_COLUMNS, add_roof_columns, run_roofs, split_of_groups

__all__ = ["per_step_traffic", "roofline_with_split"]


def roofline_with_split(trace, peak_flops=None, bandwidth=None):
    """(the roofline by op and dtype, the split by bound per step) of every run."""
    totals = fetch(trace, "roofline_op", "first_seq", ("ops", "flops", "bytes", "time_ns"))
    per = trace.per_step(totals, ["ops", "flops", "bytes", "time_ns"], keys=("op", "dtype"))
    frames, splits = [], []
    steps = trace.phase_steps()
    for i, (run, meta) in enumerate(trace.runs.items()):
        t = per[i].rename(columns={"ops": "ops_per_step", "flops": "flops_per_step", "bytes": "bytes_per_step"})
        t["time_s_per_step"] = t.pop("time_ns") / 1e9
        t = t.sort_values("time_s_per_step", ascending=False, kind="stable").reset_index(drop=True)
        t.insert(0, "run", run)
        if not len(t):
            frames.append(pd.DataFrame(columns=["op", "dtype", *ROOFLINE_COLUMNS]))
            splits.append(pd.DataFrame({"bound": list(BOUNDS)}))
            continue
        peaks, bw = run_roofs(meta, sorted(set(t["dtype"])), peak_flops, bandwidth)  # every dtype of the run's rows
        groups = trace.sql(
            f"SELECT phase, dtype, flops, bytes, CAST(sum(ops) AS BIGINT) AS ops, "
            f"CAST(sum(time_ns) AS DOUBLE) AS time_ns FROM _ops WHERE run_index = {i} "
            "GROUP BY phase, dtype, flops, bytes"
        )  # (the split's groups: roofline.py)
        split = split_of_groups(groups, steps[i], peaks, bw)
        if trace.several:
            split.insert(0, "run", run)
        splits.append(split)
        total = float(t["time_s_per_step"].sum())
        t["time_pct"] = 100 * t["time_s_per_step"] / total if total > 0 else np.nan
        add_roof_columns(t, np.array([peaks.get(d, np.nan) for d in t["dtype"]], dtype=float), bw)
        frames.append(t)
    columns = ["op", "dtype", *ROOFLINE_COLUMNS]
    dtypes = {"op": object, "dtype": object, **ROOFLINE_COLUMNS}
    return _combined(trace, frames, columns, dtypes), _combined(trace, splits, list(SPLIT_COLUMNS), SPLIT_COLUMNS)


def _combined(trace, frames, columns, dtypes):
    cols = (["run"] if trace.several else []) + columns
    types = {"run": object, **dtypes}
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_frame({c: types[c] for c in cols})
    out = pd.concat(frames, ignore_index=True).reindex(columns=cols)
    return out.astype(
        {
            c: types[c]
            for c in cols
            if not (types[c] == "int64" and out[c].dtype.kind == "f" and (out[c].abs() >= 2.0**63).any())
        }
    ).reset_index(drop=True)


def per_step_traffic(trace):
    """What each run's rank sends and receives per step, per collective kind, group and group size."""
    totals = trace.sql("SELECT * FROM collective_totals ORDER BY run_index, first_seq")
    steps = trace.phase_steps()
    out = []
    for i, run in enumerate(trace.runs):
        mine = totals[totals["run_index"] == i]
        if not len(mine):
            continue
        figures = {}
        for r in mine.itertuples():
            kind = collective_kind(r.op)
            sent, received = traffic(kind, int(r.group_size))
            key = (kind, r.process_group, int(r.group_size))
            f = figures.setdefault(key, {"first": r.first_seq, **{p: [0, 0.0, 0.0, 0.0] for p in steps[i]}})
            f["first"] = min(f["first"], r.first_seq)
            acc = f[r.phase]
            acc[0] += int(r.calls)
            acc[1] += float(r.message_bytes)
            acc[2] += float(r.message_bytes) * sent
            acc[3] += float(r.message_bytes) * received
        order = sorted(
            steps[i],
            key=lambda p: (
                ("forward", "backward", "optimizer", "other").index(p)
                if p in ("forward", "backward", "optimizer", "other")
                else 4
            ),
        )
        for (kind, group, n), f in sorted(figures.items(), key=lambda kv: kv[1]["first"]):
            per = [0.0, 0.0, 0.0, 0.0]
            for p in order:
                per = [a + b / steps[i][p] for a, b in zip(per, f[p])]
            out.append(
                {
                    "run": run,
                    "rank": int(trace.ranks[i] or 0),
                    "collective": kind,
                    "process_group": group,
                    "group_size": n,
                    "calls_per_step": per[0],
                    "message_bytes_per_step": per[1],
                    "sent_bytes_per_step": per[2],
                    "received_bytes_per_step": per[3],
                }
            )
    table = pd.DataFrame(out, columns=list(TRAFFIC_COLUMNS)).astype(TRAFFIC_COLUMNS)
    return table.sort_values(["run", "sent_bytes_per_step"], ascending=[True, False], kind="stable").reset_index(
        drop=True
    )
