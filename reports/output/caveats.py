"""The caveats of `optrace report`: each a (code, message) naming a figure that is bounded, missing or noisy, or a
trace that is cut short or damaged. reports.output.headline gathers them into the report's `caveats` ({code,
message}), which the text prints under "Caveats" and `--json` carries as data."""

from reports.loading.integrity import describe_damage, signal_of, stopped_by
from reports.output.text import printable

__all__ = [
    "NOISY",
    "compiled_note",
    "meta_caveats",
    "meter_caveats",
    "noise",
    "python_path_note",
    "title_state",
    "step_time_spread",
]

NOISY = 1.5  # the slowest untraced step over the fastest above which MFU is called uncertain


def title_state(meta):
    """The title's one word on the trace, and the caveats that say why."""
    said = []
    if meta.get("complete"):
        word = "complete"
    elif meta.get("error"):  # the exception the traced code raised (tracer.recording.mode)
        after = f" after {signal_of(meta)}" if signal_of(meta) else ""  # a SIGTERM handler's sys.exit
        word = "INCOMPLETE"
        said.append(
            (
                "incomplete",
                f"INCOMPLETE: the traced code raised {printable(meta['error'])}{after}; figures cover the rows it has",
            )
        )
    else:
        word = f"INCOMPLETE ({stopped_by(meta)})"
        said.append(("incomplete", f"INCOMPLETE ({stopped_by(meta)}): figures cover the rows it has"))
    broken = describe_damage(meta.get("damage") or {})
    if broken:
        word = "DAMAGED" if meta.get("complete") else word + ", DAMAGED"
        said.append(("damaged", f"DAMAGED: {broken}"))
    return word, said


def step_time_spread(timing, given):
    """{count, min, max} of the traced run's untraced step times (Tracer.set_step_time(time_step(...))), or None
    when the step time was given (--step-time) or is one figure."""
    times = (timing or {}).get("times_s") if given is None and isinstance(timing, dict) else None
    if not isinstance(times, list) or len(times) < 2 or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        return None
    return {"count": len(times), "min": min(times), "max": max(times)}


def noise(low, high, what):
    return (
        f"{what} ({low * 1e3:.1f}-{high * 1e3:.1f} ms); the slowest took {high / low:.1f}x the fastest, so MFU is "
        "uncertain by as much (a busy machine, or more threads than cores: set OMP_NUM_THREADS)"
    )


def meta_caveats(meta, every=None):
    """The notes the run's metadata calls for (what the report printed as `Note:` lines), as (code, message).
    `every`: {run: metadata} of every rank of a distributed trace, whose sections (Ranks, imbalance) read them all:
    the collectives timed to their launch are then counted over every rank."""
    from reports.flops.explain import cycles_note

    said = []
    if meta.get("compiled_ran_eagerly"):
        said.append(("compiled_ran_eagerly", compiled_note(meta)))
    math_calls = (meta.get("attention") or {}).get("math") or 0
    if math_calls:
        said.append(
            (
                "math_attention",
                f"{math_calls} scaled_dot_product_attention call(s) ran PyTorch's math path on the meta device: it "
                "keeps the full score matrix for the backward, where a GPU's fused kernel keeps one value per row; "
                "trace with Tracer(..., meta_attention='fused') (the default) for a GPU's FLOPs and memory",
            )
        )
    fused = meta.get("fused_standins") or {}
    if fused.get("rms_norm") or fused.get("composite"):
        stood, left = int(fused.get("rms_norm") or 0), int(fused.get("composite") or 0)
        said.append(
            (
                "fused_standins",
                f"{stood:,} rms_norm call(s) on meta or fake tensors recorded as CUDA's fused kernel "
                f"(_fused_rms_norm: it keeps the input, the weight and rstd), {left:,} left decomposed as CUDA runs "
                "them (another weight dtype, complex, channels-last, forward-mode AD): memory is what a GPU keeps",
            )
        )
    if meta.get("untraced_optimizer_steps"):
        k = meta["untraced_optimizer_steps"]
        said.append(
            (
                "untraced_optimizer_steps",
                f"{k:,} optimizer step{'s' if k != 1 else ''} ran untraced (compiled before the trace: their "
                "kernels bypass the dispatcher); optimizer FLOPs and bytes leave them out",
            )
        )
    if meta.get("optimizer_state_found_late"):
        said.append(
            (
                "optimizer_state_found_late",
                f"{meta['optimizer_state_found_late']:,} bytes of optimizer state were alive when the Tracer was "
                "entered but found only at their optimizer's step: live_bytes and the memory figures before it "
                "leave them out",
            )
        )
    runs = list((every or {}).values()) if every and len(every) > 1 else [meta]
    k = sum(int(m.get("collectives_untimed") or 0) for m in runs)
    if k:
        said.append(
            (
                "collectives_untimed",
                f"{k:,} collective{'s' if k != 1 else ''}{f' of the {len(runs)} ranks' if len(runs) > 1 else ''} "
                f"timed to {'their' if k != 1 else 'its'} launch only (gloo's reduce-scatter reports no completion; "
                "other work not done when its row was written): their time is a lower bound and their bandwidth an "
                "upper one",
            )
        )
    if python_path_note(meta):
        said.append(("python_path", python_path_note(meta)))
    if cycles_note(meta):
        said.append(("cycles_without_step", cycles_note(meta)))
    if meta.get("backward_unnamed_rows"):
        said.append(
            (
                "backward_unnamed_rows",
                f"{meta['backward_unnamed_rows']:,} backward ops have no module (an engine run of more autograd "
                "nodes than the tracer names, 20,000); FLOP and byte figures are unaffected",
            )
        )
    return said


def meter_caveats(found):
    said = []
    if found is None:
        return said
    if found["unknown_flops_steps"]:
        k = found["unknown_flops_steps"]
        said.append(
            (
                "meter_unknown_flops",
                f"{k:,} metered step{' ran' if k == 1 else 's ran'} a signature (input shapes, graph nodes) never "
                "traced: no FLOPs, no MFU",
            )
        )
    if found["estimated_flops_steps"]:
        k = found["estimated_flops_steps"]
        said.append(
            (
                "meter_estimated_flops",
                f"{k:,} metered step{' has' if k == 1 else 's have'} ESTIMATED FLOPs and MFU (the nearest traced "
                "signature's FLOPs scaled by input elements)",
            )
        )
    if found["errors"]:
        said.append(
            (
                "meter_errors",
                f"{found['errors']:,} meter bookkeeping error(s) (the run's metadata `meter.errors`): steps whose "
                "figures the meter could not take are in its table without them",
            )
        )
    return said


def compiled_note(meta):
    """What the report says of torch.compile'd code the tracer ran eagerly (tracer.recording.compiled), or ""."""
    if not meta.get("compiled_ran_eagerly"):
        return ""
    regions = meta.get("compiled_regions_eager") or {}
    counted = ""
    if regions.get("calls"):
        named = [
            f"{printable(str(name))} {calls:,}" if isinstance(calls, int) else printable(str(name))
            for name, calls in (regions.get("names") or {}).items()
        ]
        if regions.get("other_calls"):
            named.append(f"others {regions['other_calls']:,}")
        calls = regions["calls"]
        counted = f" ({calls:,} call{'s' if calls != 1 else ''} of compiled regions: {', '.join(named)})"
    return (
        f"torch.compile'd code ran eagerly under the tracer{counted}; the figures describe the eager program. "
        "Its FLOPs are the eager program's (a compiler's fusion changes bytes and time, not FLOPs); traced "
        "numerics can differ from compiled ones in the last bits"
    )


def python_path_note(meta):
    """The note of a trace the pure-Python path wrote (its metadata's `collector`, tracer.native.loader): why, and what it
    cost; "" for the compiled hook's and for traces from before `collector` was recorded."""
    collector = meta.get("collector")
    if not isinstance(collector, dict) or collector.get("path") != "python":
        return ""
    reason = printable(str(collector.get("reason") or "no reason recorded"))
    return (
        f"traced by optrace's pure-Python path ({reason}): the same rows as the compiled hook's, at about twice its "
        "tracing cost per op (docs/performance.md)"
    )
