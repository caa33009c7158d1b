"""`optrace plan`: the plan of reports.plan.plan as text and as one JSON object.

The text answers first (fits or not, by how much, the smallest change that would fit; then step
time, tokens/s per GPU, MFU and exposed communication), in at most 25 lines for a plan without
caveats; the assumptions and the notes that hold for every plan follow with `--assumptions`.
Bytes are GiB in the text, integers in the JSON. A plan that does not fit prints no step time
unless asked (`anyway`): its step cannot run.
"""

import math
import textwrap

from reports.output.plan_figures import figures as _figures  # plan_text._figures: what print_plan and plan_json print
from reports.output.plan_figures import integer_bytes, verdict
from reports.output.report_json import strict
from reports.output.text import human, human_seconds, percent, printable
from reports.plan.devices import CPU

__all__ = ["plan_json", "print_calibration", "print_plan", "verdict"]


def plan_json(frame):
    """The first run's plan (a table of reports.plan.plan.plan, or a run's (record, detail)) as a JSON-ready dict: the figures, `memory` (its parts), `classes`,
    `assumptions` (each with value, unit and source), `notes`, and the answer: `verdict` ("fits",
    "does not fit", "unknown"), `shortfall_bytes`, `smallest_change` and `changes`
    (reports.plan.changes); bytes as integers; an infinity as "inf"."""
    p = _figures(frame)
    p.pop("basis")
    p.pop("signal")
    return strict(integer_bytes(p))


def _finite(show):
    """`show` for a figure, "inf" (or "-inf") for an infinite one, which the plan's assumptions keep out but a
    trace's own figures (a huge `tokens`) may bring."""
    return lambda v, *a: (("-" if v < 0 else "") + "inf") if isinstance(v, float) and math.isinf(v) else show(v, *a)


_human, _human_seconds, _percent = (_finite(f) for f in (human, human_seconds, percent))
WIDTH = 100  # the text's columns, as the report's


def gib(v):
    """Bytes in GiB, the text's one unit of memory: two decimals from 1 GiB, three significant figures below (0.0308 GiB)."""
    if v is None or v != v:
        return "unknown"
    if math.isinf(v):
        return ("-" if v < 0 else "") + "inf GiB"
    g = v / 2**30
    if abs(g) >= 1 or g == 0:
        return f"{g:.2f} GiB"
    return f"{g:.{2 - math.floor(math.log10(abs(g)))}f} GiB"  # three significant figures, no exponent


def _wrapped(text, out, indent="  - ", rest="    ", hyphens=True):
    fill = textwrap.fill(
        printable(text), WIDTH, initial_indent=indent, subsequent_indent=rest, break_on_hyphens=hyphens
    )
    print(fill, file=out)


_CHANGE = {
    "micro_batch": "micro-batch",
    "world_size": "world size",
    "activation_checkpointing": "activation checkpointing",
}


def _change(c):
    """One change of reports.plan.changes: "micro-batch 21 (15.87 GiB): the largest that fits"."""
    name = _CHANGE[c["change"]] + ("" if c["value"] is None else f" {c['value']}")
    least = ">= " if c["change"] == "activation_checkpointing" else ""  # a bound: reports.plan.changes
    need = "" if c["required_bytes"] is None else f" ({least}{gib(c['required_bytes'])})"
    return f"{name}{need}: {c['how']}"


def _unknown(p):
    """What the plan cannot say, for the one-line answer of a target without a memory size or a peak."""
    gone = ["fit unknown: no memory size for a CPU" if p["gpu"] == CPU else "fit unknown"]
    if p["step_time_s"] is None:
        gone.append("step time unknown: the CPU has no link bandwidths to price the collectives")
    if p["tokens_per_s_per_gpu"] is None:
        gone.append("tokens/s unknown: the trace records no tokens per step")
    if p["mfu"] is None:
        gone.append("MFU unknown: no peak for the matmul dtype")
    return gone


def _one_line(p, out):
    """A target without a memory size (the CPU): what is known, and what is unknown, in one line."""
    known = [f"needs {gib(p['required_bytes'])} per rank"]
    if p["step_time_s"] is not None:
        known.append(f"step {_human_seconds(p['step_time_s'])}")
    if p["tokens_per_s_per_gpu"] is not None:
        known.append(f"{_human(p['tokens_per_s_per_gpu'])} tokens/s")
    if p["mfu"] is not None:
        known.append(f"MFU {_percent(p['mfu'])}")
    print(f"{_title(p)}: {', '.join(known)}; {'; '.join(_unknown(p))}", file=out)


def _title(p):
    where = p["gpu"] if p["gpu"] == CPU else f"{p['gpu']} ({p['gpus_per_node']} per node)"
    mb = lambda v: "unknown" if v is None else v  # noqa: E731
    tp = f"TP {p['tp']}, " if (p.get("tp") or 1) > 1 else ""  # tensor parallelism: reports.plan.comm
    return (
        f"optrace plan: {printable(p['run'])} on {where}, world size {p['world_size']}, {tp}"
        f"micro-batch {mb(p['micro_batch'])} (traced {mb(p['batch'])})"
    )


def _answer(p, out):
    """The verdict: fits or not, by how much, and the smallest change that would fit."""
    need, has = gib(p["required_bytes"]), gib(p["device_memory_bytes"])
    if p["fits"]:
        largest = p["max_micro_batch"]
        more = "" if largest is None else f"; micro-batch up to {largest} fits"
        print(f"Fits: needs {need} of {has} per rank, {gib(p['headroom_bytes'])} spare{more}", file=out)
        return
    print(f"DOES NOT FIT: needs {need} of {has} per rank, {gib(p['shortfall_bytes'])} short", file=out)
    if p["smallest_change"]:
        _wrapped(f"Smallest change that fits: {_change(p['smallest_change'])}", out, "", "  ")
    else:
        print("No change the plan can price fits:", file=out)
    for c in p["changes"]:
        if c is not p["smallest_change"]:
            _wrapped(_change(c), out, "  ", "    ")


def _step(p, out):
    if p["pp"] > 1:
        _pipeline_step(p, out)
        return
    print(
        f"Step time         {_human_seconds(p['step_time_s'])}: compute {_human_seconds(p['compute_s'])} + exposed "
        f"communication {_human_seconds(p['exposed_comm_s'])} (of {_human_seconds(p['comm_s'])})",
        file=out,
    )
    print(f"Tokens/s per GPU  {_human(p['tokens_per_s_per_gpu'])}", file=out)
    masked = ""
    if p["causal_masked_flops_per_step"] and p["mfu"] is not None:
        full = (p["model_flops_per_step"] + p["causal_masked_flops_per_step"]) / p["model_flops_per_step"] * p["mfu"]
        masked = f"{_percent(full)} with causal attention's masked half"
    line = (
        f"MFU               {_percent(p['mfu'])} of {_human(p['peak_flops_per_s'], 'FLOP/s')} "
        f"({_human(p['model_flops_per_step'], 'FLOP')} per step)"
    )
    if masked and len(line) + 2 + len(masked) > WIDTH:  # the masked half on a line of its own, under the figures
        print(f"{line};\n{' ' * 18}{masked}", file=out)
    else:
        print(f"{line}; {masked}" if masked else line, file=out)


def _pipeline_step(p, out):
    """The step of a pipeline: micro-batches through the slowest rank, the bubble, the optimizer."""
    ranks = p["pipeline"]["stages"]
    slowest = max(r["seconds_per_micro_batch"] for r in ranks)
    optimizer = max(r["optimizer_s"] for r in ranks)
    print(
        f"Step time         {_human_seconds(p['step_time_s'])}: {p['micro_batches']} micro-batches x "
        f"{_human_seconds(slowest)} + bubble {_human_seconds(p['pipeline_bubble_s'])} "
        f"({_percent(p['bubble_fraction'])}) + optimizer {_human_seconds(optimizer)}",
        file=out,
    )
    print(f"Tokens/s per GPU  {_human(p['tokens_per_s_per_gpu'])}", file=out)
    print(
        f"MFU               {_percent(p['mfu'])} of {_human(p['peak_flops_per_s'], 'FLOP/s')} "
        f"({_human(p['model_flops_per_step'], 'FLOP')} per step over {p['pp']} GPUs)",
        file=out,
    )


def _pipeline(p, out):
    """One line per rank of the pipeline: its blocks, time per micro-batch, sends, in flight, memory."""
    line = p["pipeline"]
    v = f", {p['virtual_stages']} virtual stages per rank" if p["schedule"] == "interleaved" else ""
    print(file=out)
    _wrapped(
        f"Pipeline          {p['pp']} ranks over {line['block_count']} blocks ({line['blocks']}), "
        f"{p['schedule']}{v}, {p['micro_batches']} micro-batches",
        out,
        "",
        " " * 18,
        hyphens=False,
    )
    ranks = line["stages"]
    shown = _shown_ranks(ranks)
    for r in (ranks[i] for i in shown):
        blocks = ", ".join(c["blocks"] for c in r["chunks"])
        _wrapped(
            f"  rank {r['rank']:<3} blocks {blocks:<10} {_human_seconds(r['seconds_per_micro_batch'])} per "
            f"micro-batch (sends {_human_seconds(r['send_s'])}); in flight: {r['in_flight']:g} "
            f"micro-batch{'' if r['in_flight'] == 1 else 'es'}",
            out,
            "",
            "           ",
            hyphens=False,
        )
        _wrapped(
            f"needs {gib(r['required_bytes'])}: fixed {gib(r['fixed_bytes'])} + activations "
            f"{gib(r['peak_bytes'] - r['fixed_bytes'])} (peak of one micro-batch "
            f"{gib(r['activation_peak_bytes'])}, {gib(r['saved_activation_bytes'])} saved per micro-batch)",
            out,
            "           ",
            "             ",
        )
    if len(shown) < len(ranks):
        print(f"  {len(ranks) - len(shown)} more ranks (--json lists every rank)", file=out)
    print(
        f"  each rank also: CUDA context {gib(line['cuda_context_bytes'])}, NCCL buffers "
        f"{gib(line['nccl_buffer_bytes'])}, fragmentation {_percent(line['fragmentation'])}",
        file=out,
    )


def _shown_ranks(ranks, most=4):
    """The ranks the text shows (all up to `most`; past that the first, the slowest, the one that needs
    most memory and the last), in order: 3 lines a rank keep the answer to 25 lines."""
    if len(ranks) <= most:
        return list(range(len(ranks)))
    slowest = max(range(len(ranks)), key=lambda i: ranks[i]["seconds_per_micro_batch"])
    needs = max(range(len(ranks)), key=lambda i: ranks[i]["required_bytes"])
    return sorted({0, slowest, needs, len(ranks) - 1})


def _context(p, out):
    c = p["context"]
    _wrapped(
        f"Context parallel  {c['cp']} ranks of {c['seq'] // c['cp']} tokens: ring attention "
        f"{_human(c['ring_bytes'], 'B')} per step, {_human_seconds(c['ring_s'])} ({_human_seconds(c['ring_exposed_s'])} "
        f"exposed); K/V blocks in flight {gib(c['kv_in_flight_bytes'])}",
        out,
        "",
        " " * 18,  # under the figures, as the other lines' values
    )


def _memory(p, out):
    m = p["memory"]
    if p["pp"] > 1:  # each rank's, under Pipeline
        return
    print("\nMemory per rank", file=out)
    print(
        f"  peak live       {gib(p['peak_bytes_per_rank'])} (fixed {gib(m['peak_fixed_bytes'])}, growing with the "
        f"micro-batch {gib(m['peak_scaled_bytes'])}; {m['peak_phase']})",
        file=out,
    )
    print(f"  CUDA context    {gib(m['cuda_context_bytes'])}", file=out)
    print(f"  NCCL buffers    {gib(m['nccl_buffer_bytes'])}", file=out)
    print(f"  fragmentation   {gib(m['fragmentation_bytes'])} ({_percent(m['fragmentation'])})", file=out)
    print(f"  required        {gib(p['required_bytes'])} of {gib(p['device_memory_bytes'])}", file=out)


def _compute(p, out):
    print(
        f"Compute per step  {_human_seconds(p['compute_s'])}: compute-bound {_human_seconds(p['compute_bound_s'])}, "
        f"memory-bound {_human_seconds(p['memory_bound_s'])}, launches {_human_seconds(p['launch_s'])}",
        file=out,
    )
    if p["calibrated"]:
        print(
            f"Calibrated        error on the traced step {p['error_pct']:+.1f}% "
            f"(traced {_human_seconds(p['traced_step_s'])})",
            file=out,
        )


def _value_text(a):
    v, unit = a["value"], a["unit"]
    if isinstance(v, str) or v is None:
        return "unknown" if v is None else v
    if unit == "bytes":
        return gib(v)
    if unit == "bytes/s":
        return _human(v, "B/s")
    if unit == "FLOP/s":
        return _human(v, "FLOP/s")
    if unit == "s":
        return _human_seconds(v)
    return f"{v:.4g}"


def _assumptions(p, out):
    print("\nAssumptions", file=out)
    for a in p["assumptions"]:
        print(f"  {a['name']:<24} {_value_text(a)}", file=out)
        _wrapped(a["source"], out, "      ", "      ")
    print("\nWhat every plan rests on", file=out)
    for note in p["basis"]:
        _wrapped(note, out)


def print_plan(frame, out, assumptions=False, anyway=False):
    """The first run's plan in words and figures: the answer, the memory and compute behind it, the
    notes of this trace; `assumptions` adds every assumption with its source and the notes that hold
    for every plan; `anyway` prints the step time of a plan that does not fit."""
    p = _figures(frame)
    if not p["complete"]:  # as the report's first line says it (reports.output.cli)
        stop = f"stopped by {p['signal']}" if p.get("signal") else "cut short"
        why = f": the traced code raised {printable(p['error'])};" if p["error"] else f" ({stop}):"
        print(f"INCOMPLETE{why} the plan covers the rows it has", file=out)
    caveats = [n for n in p["notes"] if n not in p["basis"]]
    if p["fits"] is None:
        _one_line(p, out)
    else:
        print(_title(p), file=out)
        _answer(p, out)
        if p["fits"] or anyway:
            _step(p, out)
        else:
            print("Step time         not shown: the plan does not fit (--anyway prints it)", file=out)
        if "context" in p:
            _context(p, out)
        _memory(p, out)
        if "pipeline" in p:
            _pipeline(p, out)
        if p["fits"] or anyway:
            _compute(p, out)
    if caveats:
        print("\nNotes", file=out)
        for note in caveats:
            _wrapped(note, out)
    if assumptions:
        _assumptions(p, out)
    else:
        n = len(p["assumptions"])
        given = sum(a["source"] == "given" for a in p["assumptions"])
        print(f"\n{n} assumptions ({given} given): --assumptions lists them with their sources", file=out)


def print_calibration(measured, changes, out):
    """What --calibrate MEASURED changed: one line per figure, old -> new (reports.plan.calibration.fit)."""
    print(f"Calibrated on {measured}:", file=out)
    if not changes:
        print("  nothing: the measured step has no op with a time in a class the plan prices", file=out)
    for c in changes:
        if c["old"] is None:
            print(f"  ({c['source']})", file=out)
            continue
        print(f"  {c['name']:<22} {c['old']:.3g} -> {c['new']:.3g}", file=out)
    print(file=out)
