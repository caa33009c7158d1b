"""`optrace plan`: the plan of reports.plan.plan as text and as one JSON object."""

import math

from reports.output.report_json import strict
from reports.output.text import human, human_bytes, human_seconds, json_number, percent, printable
from reports.plan.devices import CPU

__all__ = ["plan_json", "print_plan"]

_KEYS = (
    "run",
    "complete",
    "error",
    "gpu",
    "gpus_per_node",
    "world_size",
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
)


def _value(v):
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    return json_number(v)


def _figures(frame):
    """The first run's plan as a dict of Python values (NaN as None, infinities kept)."""
    row = frame.iloc[0]
    detail = frame.attrs["plan"][row["run"]]
    memory = {k: _value(v) for k, v in detail["memory"].items()}
    out = {k: _value(row[k]) for k in _KEYS}
    out.update(memory=memory, classes=detail["classes"], assumptions=detail["assumptions"], notes=detail["notes"])
    return out


def plan_json(frame):
    """The first run's plan as a JSON-ready dict: the figures, `memory` (its parts), `classes`,
    `assumptions` (each with value, unit and source) and `notes`; an infinity as "inf"."""
    return strict(_figures(frame))


def _finite(show):
    """`show` for a figure, "inf" (or "-inf") for an infinite one, which the plan's assumptions keep out but a
    trace's own figures (a huge `tokens`) may bring."""
    return lambda v, *a: (("-" if v < 0 else "") + "inf") if isinstance(v, float) and math.isinf(v) else show(v, *a)


_human, _human_bytes, _human_seconds, _percent = (_finite(f) for f in (human, human_bytes, human_seconds, percent))


def _na(v):
    return "N/A" if v is None else v


def _bytes(v):
    return "N/A" if v is None or v != v else _human_bytes(v)


def _signed_bytes(v):
    return "-" + _bytes(-v) if v is not None and v < 0 else _bytes(v)


def print_plan(frame, out):
    """The first run's plan in words and figures."""
    p = _figures(frame)
    m = p["memory"]
    fits = {True: "fits", False: "DOES NOT FIT", None: "N/A"}[p["fits"]]
    if not p["complete"]:  # as the report's first line says it (reports/output/cli.py)
        stop = f"stopped by {p['signal']}" if p.get("signal") else "cut short"
        why = f": the traced code raised {printable(p['error'])};" if p["error"] else f" ({stop}):"
        print(f"INCOMPLETE{why} the plan covers the rows it has", file=out)
    cpu = p["gpu"] == CPU
    where = p["gpu"] if cpu else f"{p['gpu']} ({p['gpus_per_node']} per node)"
    print(
        f"optrace plan: {printable(p['run'])} on {where}, world size "
        f"{p['world_size']}, micro-batch {_na(p['micro_batch'])} (traced {_na(p['batch'])})",
        file=out,
    )
    print("\nMemory per rank", file=out)
    print(
        f"  peak live bytes        {_bytes(p['peak_bytes_per_rank'])} (fixed {_bytes(m['peak_fixed_bytes'])}, "
        f"growing with the micro-batch {_bytes(m['peak_scaled_bytes'])}; {m['peak_phase']})",
        file=out,
    )
    gpu = (
        "no CUDA context or NCCL (a CPU)"
        if cpu
        else (f"{_bytes(m['cuda_context_bytes'])} CUDA context, {_bytes(m['nccl_buffer_bytes'])} NCCL")
    )
    print(
        f"  + allowances           {gpu}, {_bytes(m['fragmentation_bytes'])} fragmentation "
        f"({_percent(m['fragmentation'])})",
        file=out,
    )
    print(
        f"  = required             {_bytes(p['required_bytes'])} of {_bytes(p['device_memory_bytes'])}: {fits}, "
        f"headroom {_signed_bytes(p['headroom_bytes'])}",
        file=out,
    )
    print(f"  largest micro-batch    {_na(p['max_micro_batch'])}", file=out)
    print("\nStep time", file=out)
    print(
        f"  compute                {_human_seconds(p['compute_s'])} (compute-bound {_human_seconds(p['compute_bound_s'])}, "
        f"memory-bound {_human_seconds(p['memory_bound_s'])}, launches {_human_seconds(p['launch_s'])})",
        file=out,
    )
    print(
        f"  communication          {_human_seconds(p['comm_s'])}, of which exposed {_human_seconds(p['exposed_comm_s'])}",
        file=out,
    )
    print(f"  step                   {_human_seconds(p['step_time_s'])}", file=out)
    print(f"  tokens/s per GPU       {_human(p['tokens_per_s_per_gpu'])}", file=out)
    print(
        f"  MFU                    {_percent(p['mfu'])} ({_human(p['model_flops_per_step'], 'FLOP')} per step at "
        f"{_human(p['peak_flops_per_s'], 'FLOP/s')})",
        file=out,
    )
    if p["causal_masked_flops_per_step"]:
        full = (p["model_flops_per_step"] + p["causal_masked_flops_per_step"]) / p["model_flops_per_step"] * p["mfu"]
        print(
            f"                         causal attention at half its FLOPs; {_percent(full)} counting the masked "
            f"half ({_human(p['causal_masked_flops_per_step'], 'FLOP')}), as PaLM and torchtitan do",
            file=out,
        )
    if p["calibrated"]:
        print(
            f"  calibrated             error on the traced step {p['error_pct']:+.1f}% "
            f"(traced {_human_seconds(p['traced_step_s'])})",
            file=out,
        )
    print("\nAssumptions", file=out)
    for a in p["assumptions"]:
        value = a["value"] if isinstance(a["value"], str) or a["value"] is None else f"{a['value']:.4g}"
        print(f"  {a['name']:<24} {value} {a['unit'] if a['unit'] != 'fraction' else ''}".rstrip(), file=out)
        print(f"      {printable(a['source'])}", file=out)
    print("\nNotes", file=out)
    for note in p["notes"]:
        print(f"  - {printable(note)}", file=out)
