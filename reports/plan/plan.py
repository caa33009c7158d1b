"""plan(df, gpu=...): will a traced rank's job fit on a GPU, how long will a step take, what MFU.

One row per run (a trace of one rank: real, meta or fake, any world size), columns:

  complete, error                      whether the traced code ran to the end; the exception it raised
                                       (the metadata's), else None: the plan covers the rows it has
  gpu, gpus_per_node, world_size       the target and the job (world size: the trace's)
  tp                                   the tensor-parallel degree the trace shows (reports.plan.comm
                                       tensor_parallel; 1 without): its ranks read the same tokens
  batch, micro_batch                   sequences per rank: traced (and how found), planned
  tokens_per_step                      tokens per rank per step at the planned micro-batch
  fits, peak_bytes_per_rank, required_bytes, device_memory_bytes, headroom_bytes,
  max_micro_batch                      memory (reports.plan.fit)
  compute_s                            the ops of one step priced on the target, one after
                                       another (reports.plan.ops); of which compute_bound_s,
                                       memory_bound_s (the roofline's bound) and launch_s
  comm_s, exposed_comm_s               the step's collectives priced on its links, and the part
                                       the overlap model leaves exposed (reports.plan.comm)
  step_time_s                          compute_s + exposed_comm_s
  tokens_per_s_per_gpu                 tokens_per_step / tp / step_time_s
  model_flops_per_step, causal_masked_flops_per_step, peak_flops_per_s, mfu
                                       MFU: model FLOPs (reports.flops.mfu's: no recomputation)
                                       less the masked half of causal attention (which
                                       reports.mfu counts, as PaLM does, and the kernel skips:
                                       causal_masked_flops_per_step), over the predicted step
                                       time and the target's dense peak for the run's matmul
                                       dtype (the highest peak of any matmul dtype, if one is
                                       higher). Every op takes at least the FLOPs it performs
                                       over its peak, so mfu <= 1; (model + masked) / (step x
                                       peak) is the MFU of the full-matrix convention.
  bound_flops_per_step                 FLOPs per step (at the planned micro-batch) of the ops whose count is
                                       an upper bound (flops_bound: grouped matmuls on meta or fake
                                       tensors, whose group sizes cannot be read); the compute time,
                                       step time and MFU rest on them, and a note says so
  calibrated, traced_step_s, error_pct when the trace ran on the target with real op times:
                                       efficiencies measured from it, and the predicted step
                                       against the traced one (untraced median step time when
                                       recorded, else the sum of traced op times per step)
  pp, micro_batches, schedule, virtual_stages, pipeline_bubble_s, bubble_fraction, p2p_s
                                       the pipeline (reports.plan.pipeline; pp 1: none): with pp > 1
                                       step_time_s, tokens_per_step, tokens_per_s_per_gpu, the FLOPs and
                                       mfu are the pipeline's (micro_batches micro-batches over pp GPUs),
                                       and the memory figures the rank that needs most
  cp, ring_s, kv_in_flight_bytes       context parallelism (reports.plan.context; cp 1: none): ring
                                       attention's sends per step (in comm_s) and the K/V blocks in flight

`frame.attrs["plan"]` holds per run: `assumptions` [{name, value, unit, source}] (every
number assumed, those measured included), `classes` (time per bound class), `memory` (the fit's
parts, and for a plan that does not fit its `changes`: reports.plan.changes), `notes` (what the
figures rest on, what needs a re-trace) and `basis` (those of `notes` that hold for every plan); with
pp > 1 `pipeline` (each rank's blocks, time, sends and memory), with cp > 1 `context` (the ring's figures).

This module owns the plan of a run: its arguments checked, the step priced and simulated, the record and detail put
together. Its parts: reports.plan.rows (what is read of the trace), reports.plan.target (the device and the assumptions
listed), reports.plan.step (the priced step's rows), reports.plan.ops, .comm, .fit, .parallel (prices, communication,
memory, pipeline and ring).
"""

import math

import numpy as np

from reports.errors import ReportError
from reports.flops.mfu import mfu_table
from reports.flops.rows import per_step
from reports.loading.integrity import describe_damage, signal_of, stopped_by
from reports.plan import parallel
from reports.plan.comm import costs, simulate
from reports.plan.devices import CPU
from reports.plan.fit import fit, traced_batch
from reports.plan.ops import CLASSES, STACKS, calibrate, fixed_bytes, price, roofs
from reports.plan.options import Options, takes_options
from reports.plan.step import (
    causal_masked,
    flop_bounds,
    groups_used,
    measured,
    steady_step,
    tensor_parallel,
    traced_step,
    training_steps,
)
from reports.plan.target import effective, generation, listed, on_target, table_notes, target

__all__ = ["plan", "plan_runs"]

_COLUMNS = tuple(
    "run step phase op flops flop_kind bytes_read bytes_written is_view input_dtypes output_dtypes input_storage_ids "
    "output_storage_ids input_shapes output_shapes inplace comm_bytes group_size process_group duration_ns busy_ns "
    "causal".split()
)
_RETRACE = (
    "what needs a re-trace: another world size (shards and collective sizes change), another "
    "sequence length, another activation-checkpointing or sharding policy"
)


@takes_options
def plan(df, gpu, **options):
    """Plan each run of `df` on `gpu` (a name of reports.plan.devices.GPUS, or "cpu": the CPU
    the trace ran on). `options`: the fields of reports.plan.options.Options by keyword (or by position, in this
    order), with their defaults (gpus_per_node=8,
    micro_batch=None, batch=None, overlap="prefetch", assumptions=None, pp=1, micro_batches=1, schedule="1f1b",
    virtual_stages=1, cp=1, calibrated=None; `help(plan)` lists them). `gpus_per_node`: the GPUs a node's links join;
    `micro_batch`: sequences per rank to plan (default the traced batch,
    found by traced_batch unless `batch` gives it); `overlap`: "prefetch" or "none";
    `assumptions`: {name: value} overriding reports.plan.assumptions.DEFAULTS; `pp`: pipeline
    stages, `micro_batches` per step, `schedule` "1f1b" or "interleaved" with `virtual_stages`
    per rank (reports.plan.pipeline); `cp`: context-parallel degree (reports.plan.context);
    `calibrated`: {name: (value, source)} fitted on a measured trace (reports.plan.calibration.fit), used
    where `assumptions` does not give the name."""
    import pandas as pd  # the library's table (`optrace plan` reads plan_runs' records)

    from reports.loading.load import require
    from reports.plan.rows import frame_runs

    require(df, _COLUMNS, "plan")
    options = Options(**options)
    table = options.checked(gpu)  # a bad argument fails before any work
    found = plan_runs(frame_runs(df), gpu, options, table=table)
    out = pd.DataFrame.from_records([record for record, _ in found])
    out.attrs["plan"] = {record["run"]: detail for record, detail in found}
    return out


def plan_runs(runs, gpu, options=Options(), table=None):
    """[(record, detail)] of each run of `runs` (reports.plan.rows.Run: `optrace plan` reads them from the Trace of
    its files, reports.plan.rows.trace_runs) planned as `plan` plans a DataFrame's (`options`: its keywords, a
    reports.plan.options.Options): `record` its row of `plan`'s table,
    `detail` its entry of the table's attrs["plan"]."""
    table = options.checked(gpu) if table is None else table
    shape = parallel.check(*options.shape)
    out = []
    for run in runs:
        if len(run.rows):
            record, detail = _plan_run(run, gpu, options, table, shape)
            out.append(({"run": run.name, **record}, detail))
    return out


def _plan_run(run, gpu, options, table, shape):
    meta = run.meta
    gpus_per_node, micro_batch, batch, overlap = (
        options.gpus_per_node,
        options.micro_batch,
        options.batch,
        options.overlap,
    )
    entry, peak_of, bandwidth, bw_source, memory = target(gpu, meta)
    notes, basis = [], []  # basis: the notes that hold for every plan of its kind (the text lists them apart)
    complete, raised = bool(meta.get("complete")), meta.get("error")
    raised = None if complete or raised is None else str(raised)
    if not complete:
        notes.append(
            ("the traced code raised " + raised if raised else f"the trace was {stopped_by(meta)}")
            + ": the plan covers the rows the trace has, which may be part of a step"
        )
    broken = describe_damage(meta.get("damage") or {})  # reports.loading.integrity.damage's facts, as the report says
    if broken:
        notes.append(f"the trace is damaged: {broken}; the plan covers the rows it has, which may be part of a step")
    found, how = (batch, "given") if batch is not None else traced_batch(run.rows, meta)
    if found is None:
        notes.append(
            f"the traced micro-batch could not be found ({how}): pass batch= (--batch); max_micro_batch "
            "is unknown and no what-if of the micro-batch can be planned"
        )
    planned = micro_batch if micro_batch is not None else found
    if micro_batch is not None and found is None:
        raise ReportError("plan: micro_batch needs the traced batch, which the trace does not show: pass batch=")
    k = planned / found if micro_batch is not None else 1.0
    cp = parallel.degree(shape, found, entry == CPU)
    k /= cp  # a rank of the context-parallel group holds 1/cp of each sequence's tokens
    if entry == CPU:  # no GPU: no CUDA context, no NCCL (whatever was assumed for a GPU)
        table = {
            **table,
            **{
                name: (0.0, "none: the target is the CPU, which has no CUDA context or NCCL buffers")
                for name in ("cuda_context_bytes", "nccl_buffer_bytes")
            },
        }
        basis.append("the target is the CPU: its memory needs no CUDA context or NCCL buffers, only fragmentation")
    a = {name: value for name, (value, _) in table.items()}
    sources = {name: source for name, (_, source) in table.items()}
    rows, steady = steady_step(run.rows)  # the memory fit reads every step; the step time, one steady step
    if steady:
        notes.append(steady)

    p = roofs(rows, peak_of, bandwidth, k, fixed_bytes(rows, meta) if k != 1.0 else None, generation(entry))
    notes += p["notes"] + table_notes(p, sources, entry)
    eff = {c: a[f"{c}_efficiency"] for c in CLASSES} | {s: a[s] for s in STACKS.values()}
    launch = a["launch_s"]
    calibrated = on_target(entry, meta) and k == 1.0
    op_times = measured(rows)
    if calibrated and op_times.sum() > 0:
        for name, (value, source) in calibrate(p, op_times, eff).items():
            eff[name.removesuffix("_efficiency")], sources[name], a[name] = value, source, value
        launch, sources["launch_s"] = 0.0, "0: the measured op times include each kernel's launch"
        a["launch_s"] = 0.0
    else:
        calibrated = False
    seconds, bound = price(p, eff, launch)
    effective(p, eff, a, sources)

    world = int(meta.get("world_size") or 1)
    has_comm = bool(rows.valid("comm_bytes").any())
    comm_s, kinds = np.zeros(len(rows)), np.full(len(rows), "", dtype=object)
    if entry == CPU and has_comm:
        notes.append("the CPU has no link bandwidths in the catalogue: collectives are not priced (comm unknown)")
    elif has_comm:
        comm_s, kinds, guessed = costs(rows, entry, gpus_per_node, a, meta.get("process_groups"))
        if guessed:
            notes.append(
                f"process groups without their ranks in the trace ({', '.join(guessed)}): priced as "
                "consecutive ranks, on as few nodes as they fill"
            )
    steps = simulate(rows, seconds, comm_s, kinds, overlap)
    train = training_steps(rows, steps)
    step_time = float(np.mean([steps[s][0] for s in train]))
    compute = float(per_step(rows, values=seconds))
    comm = float(per_step(rows, values=comm_s))
    exposed = max(0.0, step_time - float(np.mean([steps[s][1] for s in train])))
    step_time = compute + exposed
    tp = tensor_parallel(rows, meta.get("tokens"), notes)
    ringed, context = parallel.ring_step(rows, meta, seconds, k, entry, gpus_per_node, a, cp, tp)
    if context:
        comm, exposed = comm + context["ring_s"], exposed + context["ring_exposed_s"]
        step_time = compute + exposed
    if entry == CPU and has_comm:
        comm = exposed = step_time = math.nan

    # model FLOPs per step (reports.flops.mfu's); the rate is ours
    m = mfu_table(run.frame(rows), step_time_s=1.0, peak_flops=1.0).to_pylist()[0]
    dtype = m["dtype"]
    peak = max([v for v in [peak_of(dtype) if dtype else None, *p["tensor_peak"].values()] if v] or [math.nan])
    masked = causal_masked(rows) * k
    model_flops = float(m["model_flops_per_step"]) * k - masked
    tokens = meta.get("tokens")
    tokens = tokens * k if tokens else None
    if tokens is None:
        notes.append("the trace records no tokens per step (Tracer(tokens=...)): tokens/s is unknown")
    bounded = flop_bounds(rows)
    bound_flops = bounded["flops"] * k
    if bounded["rows"]:
        notes.append(
            f"{bounded['rows']:,} ops count an upper bound of their FLOPs ({bound_flops:,.0f} FLOPs per step, "
            f"{100 * bounded['flops'] / max(float(per_step(rows)), 1):.1f}% of the step's; column flops_bound): "
            "the trace could not read their group sizes (meta or fake tensors), so their time, the step time "
            "and the model FLOPs of the MFU are upper bounds, exact only if every row of their operands is routed"
        )
    memory_fit = _memory(run, memory, table, found, planned, micro_batch, batch, how, cp, world, notes, basis)
    if context:
        parallel.ring_memory(memory_fit, context)
    sources["fragmentation"] = memory_fit["fragmentation_source"]
    a["fragmentation"] = memory_fit["fragmentation"]

    traced = error = None
    if calibrated:
        traced, how_traced = traced_step(rows, meta)
        error = 100.0 * (step_time - traced) / traced if traced else None
        notes.append(
            f"calibrated on the traced step ({how_traced}): predicted {step_time:.6g} s against {traced:.6g} s"
        )
    basis.append(
        f"micro-batch: traced {found} ({how}); activation bytes, forward/backward FLOPs and their "
        "ops' bytes of activations, temporaries and inputs scale linearly with it; parameters, gradients, "
        "optimizer state, communication buffers (and the ops' reads and writes of them) and collectives stay fixed"
    )
    basis.append(_RETRACE)
    notes += basis
    kernel_launch = launch * p["kernel"]
    record = {
        "complete": complete,
        "error": raised,
        "signal": signal_of(meta),
        "gpu": entry if entry == CPU else entry["name"],
        "gpus_per_node": gpus_per_node,
        "world_size": world,
        "tp": tp,
        "batch": found,
        "micro_batch": planned,
        "tokens_per_step": tokens,
        "fits": memory_fit["fits"],
        "peak_bytes_per_rank": memory_fit["peak_bytes_per_rank"],
        "required_bytes": memory_fit["required_bytes"],
        "device_memory_bytes": memory,
        "headroom_bytes": memory_fit["headroom_bytes"],
        "max_micro_batch": memory_fit["max_micro_batch"],
        "compute_s": compute,
        "compute_bound_s": float(per_step(rows, values=np.where(bound < 3, seconds - kernel_launch, 0.0))),
        "memory_bound_s": float(per_step(rows, values=np.where(bound == 3, seconds - kernel_launch, 0.0))),
        "launch_s": float(per_step(rows, values=kernel_launch)),
        "comm_s": comm,
        "exposed_comm_s": exposed,
        "step_time_s": step_time,
        "tokens_per_s_per_gpu": tokens / tp / step_time if tokens and step_time > 0 else math.nan,
        "model_flops_per_step": model_flops,
        "bound_flops_per_step": bound_flops,
        "causal_masked_flops_per_step": masked,
        "peak_flops_per_s": peak,
        "mfu": model_flops / (step_time * peak) if step_time > 0 and peak == peak else math.nan,
        "calibrated": calibrated,
        "traced_step_s": traced,
        "error_pct": error,
    }
    classes = [
        {"bound": CLASSES[c], "seconds_per_step": float(per_step(rows, values=np.where(bound == c, seconds, 0.0)))}
        for c in range(len(CLASSES))
    ]
    detail = {
        "assumptions": listed(a, sources, entry, peak, dtype, bandwidth, bw_source, memory, overlap),
        "classes": classes,
        "memory": memory_fit,
        "notes": notes,
        "basis": basis,
    }
    whole = found * cp if found else found  # the traced batch in whole sequences of the rank's share (k's unit)
    collectives = exposed - (context["ring_exposed_s"] if context else 0.0)  # the ring's goes with its kernels
    stage = world * cp  # a stage's GPUs: the traced job's, each rank split in cp (pipeline outermost)
    priced = (rows, run, meta, seconds + ringed, collectives, k, entry, gpus_per_node, stage, a, memory_fit, whole)
    parallel.finish(record, detail, priced, shape, context)
    return record, detail


def _memory(run, memory, table, found, planned, micro_batch, batch, how, cp, world, notes, basis):
    """reports.plan.fit.fit's figures of `run` on a device of `memory` bytes, and the notes on what they rest on."""
    meta = run.meta
    memory_fit = fit(
        run,
        memory,
        table,
        found * cp if found else found,  # the fit at 1/cp of the micro-batch: its largest, in whole sequences
        planned if micro_batch is not None or cp > 1 else None,
        process_groups=groups_used(run.rows) + (cp > 1) if world > 1 or cp > 1 else 0,
        world=world,
    )
    if memory is None:
        basis.append("the CPU's memory size is not in the trace: fits is unknown")
    if not meta.get("parameters"):
        guessed = (
            " and the traced batch may be a weight's leading size" if batch is None and "embedding" not in how else ""
        )
        notes.append(
            "the parameters are unknown (the trace was made without model=): their bytes count as inputs, "
            "growing with the micro-batch, so the peak and the largest micro-batch are pessimistic"
            + guessed
            + "; trace with Tracer(..., model=model)"
        )
    if memory_fit["max_micro_batch_if_fixed"] is not None:
        notes.append(
            f"the largest micro-batch ({memory_fit['max_micro_batch']}) is a lower bound: it counts up to "
            f"{memory_fit['parameter_sized_bytes']:,} bytes of temporaries the backward made at a parameter's size "
            "(weight gradients before autograd sums them or FSDP reduces them, which do not grow with the "
            f"micro-batch) as growing; if none grows, up to {memory_fit['max_micro_batch_if_fixed']} fit (trace at "
            "a larger micro-batch to tell)"
        )
    if memory_fit["optimizer_state_added_bytes"]:
        notes.append(
            f"optimizer state made during the trace ({memory_fit['optimizer_state_added_bytes']:,} bytes at "
            "the peak) counted as live from the first op: it stays from step to step"
        )
    if memory_fit["optimizer_state_made_bytes"] and run.rows.count_steps() == 1:
        notes.append(
            f"the traced step is the optimizer's first: it makes its state "
            f"({memory_fit['optimizer_state_made_bytes']:,} bytes; AdamW's zeros_like), work its step time "
            "includes and later steps skip (trace two steps to price the steady one)"
        )
    return memory_fit
