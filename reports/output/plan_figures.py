"""The plan of reports.plan.plan as one dict of Python values, which reports.output.plan_text prints as text and
as JSON: the figures, the memory parts, the classes, assumptions and notes, and the answer (the verdict, the
shortfall, the smallest change)."""

import math

from reports.output.text import json_number
from reports.plan.changes import smallest

_KEYS = (
    "run",
    "complete",
    "error",
    "gpu",
    "gpus_per_node",
    "world_size",
    "tp",
    "batch",
    "micro_batch",
    "tokens_per_step",
    "fits",
    "peak_bytes_per_rank",
    "required_bytes",
    "device_memory_bytes",
    "headroom_bytes",
    "max_micro_batch",
    "compute_s",
    "compute_bound_s",
    "memory_bound_s",
    "launch_s",
    "comm_s",
    "exposed_comm_s",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "model_flops_per_step",
    "bound_flops_per_step",
    "causal_masked_flops_per_step",
    "peak_flops_per_s",
    "mfu",
    "calibrated",
    "traced_step_s",
    "error_pct",
    "pp",
    "micro_batches",
    "schedule",
    "virtual_stages",
    "pipeline_bubble_s",
    "bubble_fraction",
    "p2p_s",
    "cp",
    "ring_s",
    "kv_in_flight_bytes",
)


def _value(v):
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    return json_number(v)


def integer_bytes(d):
    """`d` with every finite number of bytes (`*_bytes`, `*_bytes_per_rank`; in the lists and dicts within
    too) rounded to an integer, `headroom_bytes` the rounded memory less the rounded required bytes and
    `shortfall_bytes` its opposite."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = integer_bytes(v)
        elif isinstance(v, list):
            v = [integer_bytes(x) if isinstance(x, dict) else x for x in v]
        elif "_bytes" in k and not k.endswith("_per_s") and isinstance(v, float) and math.isfinite(v):
            v = round(v)
        out[k] = v
    if isinstance(out.get("device_memory_bytes"), int) and isinstance(out.get("required_bytes"), int):
        out["headroom_bytes"] = out["device_memory_bytes"] - out["required_bytes"]
        if isinstance(out.get("shortfall_bytes"), int):
            out["shortfall_bytes"] = -out["headroom_bytes"]
    if out.get("unit") == "bytes" and isinstance(out.get("value"), float) and math.isfinite(out["value"]):
        out["value"] = round(out["value"])  # an assumption in bytes
    return out


def verdict(p):
    """(verdict, shortfall bytes or None, the smallest change or None, the changes) of a plan's figures:
    "fits", "does not fit" or "unknown" (no memory size for the target)."""
    if p["fits"] is None:
        return "unknown", None, None, []
    if p["fits"]:
        return "fits", None, None, []
    found = p["memory"].get("changes") or []
    return "does not fit", -p["headroom_bytes"], smallest(found), found


def figures(plan):
    """The first run's plan as a dict of Python values (NaN as None, infinities kept): `plan` a table of
    reports.plan.plan.plan, or a run's (record, detail) of reports.plan.plan.plan_runs."""
    if isinstance(plan, tuple):
        row, detail = plan
    else:
        row = plan.iloc[0]
        detail = plan.attrs["plan"][row["run"]]
    memory = {k: _value(v) for k, v in detail["memory"].items() if k != "changes"}
    memory["changes"] = [{k: _value(v) for k, v in c.items()} for c in detail["memory"].get("changes", [])]
    out = {k: _value(row[k]) for k in _KEYS}
    out.update(memory=memory, classes=detail["classes"], assumptions=detail["assumptions"], notes=detail["notes"])
    out["verdict"], out["shortfall_bytes"], out["smallest_change"], out["changes"] = verdict(out)
    out["basis"], out["signal"] = detail.get("basis", []), _value(row.get("signal"))
    for part in ("pipeline", "context"):  # reports.plan.pipeline, context.py: only when planned
        if part in detail:
            out[part] = detail[part]
    return out
