"""The report's meter section: a metered run's (tracer.metering.meter) step time, tokens/s, MFU and HFU over its steps."""

from reports.flops.meter import meter_summary as rank_summary
from reports.output.text import human, percent

__all__ = ["print_meter"]


def _spread(figure, show):
    if figure is None:
        return "N/A"
    return f"{show(figure['median'])} (min {show(figure['min'])}, max {show(figure['max'])})"


def print_meter(src, out, ranks=None):
    """Print the meter section when the trace has a Meter table; nothing otherwise. `src`: the run's
    reports.output.source.Source; `ranks`: a Source over every rank of a job (its section is then rank 0's,
    as the report, with a line for each other rank whose table has steps without FLOPs or bookkeeping errors)."""
    found = src.meter_summary()
    if found is None:
        return
    traced = ", ".join(str(s) for s in found["traced_steps"][:8]) + (", ..." if len(found["traced_steps"]) > 8 else "")
    (_, first), *others = ranks.runs.items() if ranks is not None else [(None, {})]
    whose = f" (rank {first.get('rank', 0)})" if others else ""
    print(
        f"\nMeter{whose}: {found['steps']:,} steps, {found['metered_steps']:,} metered untraced "
        f"(medians over them), traced: {'step ' + traced if traced else 'none'}",
        file=out,
    )
    print(f"  step time {_spread(found['step_time_s'], lambda s: f'{s * 1e3:.1f} ms')}", file=out)
    print(f"  tokens/s  {_spread(found['tokens_per_s'], lambda v: human(v))}", file=out)
    print(f"  MFU {_spread(found['mfu'], percent)}, HFU {_spread(found['hfu'], percent)}", file=out)
    if found["unknown_flops_steps"]:
        k = found["unknown_flops_steps"]
        print(
            f"  {k:,} step{' ran' if k == 1 else 's ran'} a signature (input shapes, graph nodes) never traced: "
            "no FLOPs, no MFU",
            file=out,
        )
    if found["estimated_flops_steps"]:
        k = found["estimated_flops_steps"]
        print(
            f"  {k:,} step{' has' if k == 1 else 's have'} ESTIMATED FLOPs and MFU (a signature never traced: past "
            "the Meter's max_traces, or the step after it ran another signature; the nearest traced one's FLOPs "
            "scaled by input elements)",
            file=out,
        )
    if found["errors"]:
        print(
            f"  {found['errors']:,} meter bookkeeping error(s) (the first one was warned when it happened; the run's "
            "metadata `meter.errors`): steps whose figures the meter could not take are in the table without them",
            file=out,
        )
    for run, meta in others:  # a rank's meter failures are never silent in the job's report
        _other_rank(meta, rank_summary({run: meta}), out)


def _other_rank(meta, found, out):
    if found is None:
        return
    said = [f"{found['unknown_flops_steps']:,} steps without FLOPs"] if found["unknown_flops_steps"] else []
    said += [f"{found['estimated_flops_steps']:,} with estimated FLOPs"] if found["estimated_flops_steps"] else []
    said += [f"{found['errors']:,} meter bookkeeping error(s) (its metadata `meter.errors`)"] if found["errors"] else []
    if said:
        print(f"  rank {meta.get('rank')}: {', '.join(said)}", file=out)
