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
  max_micro_batch                      memory (reports/plan/fit.py)
  compute_s                            the ops of one step priced on the target, one after
                                       another (reports/plan/ops.py); of which compute_bound_s,
                                       memory_bound_s (the roofline's bound) and launch_s
  comm_s, exposed_comm_s               the step's collectives priced on its links, and the part
                                       the overlap model leaves exposed (reports/plan/comm.py)
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
                                       the pipeline (reports/plan/pipeline.py; pp 1: none): with pp > 1
                                       step_time_s, tokens_per_step, tokens_per_s_per_gpu, the FLOPs and
                                       mfu are the pipeline's (micro_batches micro-batches over pp GPUs),
                                       and the memory figures the rank that needs most
  cp, ring_s, kv_in_flight_bytes       context parallelism (reports/plan/context.py; cp 1: none): ring
                                       attention's sends per step (in comm_s) and the K/V blocks in flight

`frame.attrs["plan"]` holds per run: `assumptions` [{name, value, unit, source}] (every
number assumed, those measured included), `classes` (time per bound class), `memory` (the fit's
parts, and for a plan that does not fit its `changes`: reports.plan.changes), `notes` (what the
figures rest on, what needs a re-trace) and `basis` (those of `notes` that hold for every plan); with
pp > 1 `pipeline` (each rank's blocks, time, sends and memory), with cp > 1 `context` (the ring's figures).
"""

import math

import numpy as np
import pandas as pd

from reports.errors import ReportError
from reports.flops.coverage import bounds
from reports.flops.mfu import mfu as mfu_table
from reports.flops.peaks import PEAKS, cpu_ideal_flops, peak_bandwidth
from reports.flops.recompute import attention_recompute, checkpoint_recompute
from reports.loading.integrity import signal_of, stopped_by
from reports.loading.load import require, runs_of
from reports.plan import assumptions as assumed
from reports.plan import parallel
from reports.plan.comm import OVERLAPS, costs, simulate, tensor_parallel
from reports.plan.devices import CPU, resolve_gpu
from reports.plan.efficiency import generation as _table_generation
from reports.plan.fit import fit, traced_batch
from reports.plan.ops import CLASSES, STACKS, calibrate, fixed_bytes, price, roofs
from reports.steps import count_steps, per_step
from reports.tables import split_runs
from tracer.devices import candidates

__all__ = ["measured_step", "plan"]

_COLUMNS = (
    "run",
    "step",
    "phase",
    "op",
    "flops",
    "flop_kind",
    "bytes_read",
    "bytes_written",
    "is_view",
    "input_dtypes",
    "output_dtypes",
    "input_storage_ids",
    "output_storage_ids",
    "input_shapes",
    "output_shapes",
    "inplace",
    "comm_bytes",
    "group_size",
    "process_group",
    "duration_ns",
    "busy_ns",
    "causal",
)
_RETRACE = (
    "what needs a re-trace: another world size (shards and collective sizes change), another "
    "sequence length, another activation-checkpointing or sharding policy"
)


def _target(gpu, meta):
    """(gpu entry or CPU, peak_of(dtype), bandwidth, memory bytes, names of the sources)."""
    entry = resolve_gpu(gpu)
    device = meta.get("device") or {}
    if entry == CPU:
        if device.get("type") != "cpu" or device.get("fake"):
            raise ReportError(
                f"plan: gpu 'cpu' plans a trace against the CPU it ran on; this trace ran on {device.get('name')!r}"
            )
        bandwidth, bw_source = peak_bandwidth(device, None, meta.get("bandwidth"))
        if bandwidth is None:  # no datasheet fits a CPU: memory-bound ops cannot be priced without a measured one
            raise ReportError(
                f"plan: gpu 'cpu' needs the CPU's memory bandwidth, which this trace does not record ({bw_source})"
            )
        return entry, lambda d: cpu_ideal_flops(device, d)[0], bandwidth, bw_source, None
    return entry, entry["peaks"].get, entry["bandwidth_bytes_per_s"], entry["bandwidth_source"], entry["memory_bytes"]


def _on_target(entry, meta):
    """Whether the trace ran, with real times, on the target device."""
    device = meta.get("device") or {}
    if device.get("fake") or device.get("type") == "meta" or (meta.get("timing") or {}).get("mode") == "off":
        return False
    if entry == CPU:
        return device.get("type") == "cpu"
    # the catalogue records the trace's device can be (by name, then memory size): an A100 40GB is not the 80GB target
    found = candidates(device.get("name"), device.get("total_memory_bytes"))
    return device.get("type") == "cuda" and entry["name"] in {d.name for d in found}


def plan(
    df,
    gpu,
    gpus_per_node=8,
    micro_batch=None,
    batch=None,
    overlap="prefetch",
    assumptions=None,
    pp=1,
    micro_batches=1,
    schedule="1f1b",
    virtual_stages=1,
    cp=1,
    calibrated=None,
):
    """Plan each run of `df` on `gpu` (a name of reports.plan.devices.GPUS, or "cpu": the CPU
    the trace ran on). `micro_batch`: sequences per rank to plan (default the traced batch,
    found by traced_batch unless `batch` gives it); `overlap`: "prefetch" or "none";
    `assumptions`: {name: value} overriding reports.plan.assumptions.DEFAULTS; `pp`: pipeline
    stages, `micro_batches` per step, `schedule` "1f1b" or "interleaved" with `virtual_stages`
    per rank (reports/plan/pipeline.py); `cp`: context-parallel degree (reports/plan/context.py);
    `calibrated`: {name: (value, source)} fitted on a measured trace (reports.plan.calibration.fit), used
    where `assumptions` does not give the name."""
    require(df, _COLUMNS, "plan")
    shape = parallel.check(pp, micro_batches, schedule, virtual_stages, cp)
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ReportError(f"plan: gpus_per_node must be an int >= 1, got {gpus_per_node!r}")
    for name, value in (("micro_batch", micro_batch), ("batch", batch)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ReportError(f"plan: {name} must be an int >= 1, got {value!r}")
    if overlap not in OVERLAPS:
        raise ReportError(f"plan: overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}")
    table = assumed.resolve(assumptions, _generation(resolve_gpu(gpu)))  # a bad gpu name fails before any work
    table.update({n: v for n, v in (calibrated or {}).items() if table[n][1] != "given"})
    runs, records, details = runs_of(df), [], {}
    for run, rows in split_runs(df):
        if len(rows):
            record, detail = _plan_run(rows, runs[run], gpu, gpus_per_node, micro_batch, batch, overlap, table, shape)
            records.append({"run": run, **record})
            details[run] = detail
    out = pd.DataFrame.from_records(records)
    out.attrs["plan"] = details
    return out


def _plan_run(rows, meta, gpu, gpus_per_node, micro_batch, batch, overlap, table, shape=(1, 1, "1f1b", 1, 1)):
    entry, peak_of, bandwidth, bw_source, memory = _target(gpu, meta)
    notes, basis = [], []  # basis: the notes that hold for every plan of its kind (the text lists them apart)
    complete, raised = bool(meta.get("complete")), meta.get("error")
    raised = None if complete or raised is None else str(raised)
    if not complete:
        notes.append(
            ("the traced code raised " + raised if raised else f"the trace was {stopped_by(meta)}")
            + ": the plan covers the rows the trace has, which may be part of a step"
        )
    found, how = (batch, "given") if batch is not None else traced_batch(rows, meta)
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
    every = rows  # the memory fit reads every step; the step time, one steady step
    rows, steady = _steady_step(rows)
    if steady:
        notes.append(steady)

    p = roofs(rows, peak_of, bandwidth, k, fixed_bytes(rows, meta) if k != 1.0 else None, _generation(entry))
    notes += p["notes"] + _tables(p, sources, entry)
    eff = {c: a[f"{c}_efficiency"] for c in CLASSES} | {s: a[s] for s in STACKS.values()}
    launch = a["launch_s"]
    calibrated = _on_target(entry, meta) and k == 1.0
    measured = _measured(rows)
    if calibrated and measured.sum() > 0:
        for name, (value, source) in calibrate(p, measured, eff).items():
            eff[name.removesuffix("_efficiency")], sources[name], a[name] = value, source, value
        launch, sources["launch_s"] = 0.0, "0: the measured op times include each kernel's launch"
        a["launch_s"] = 0.0
    else:
        calibrated = False
    seconds, bound = price(p, eff, launch)
    _effective(p, eff, a, sources)

    world = int(meta.get("world_size") or 1)
    has_comm = bool(rows["comm_bytes"].notna().any())
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
    train = _training_steps(rows, steps)
    step_time = float(np.mean([steps[s][0] for s in train]))
    compute = float(per_step(rows, pd.Series(seconds, index=rows.index)))
    comm = float(per_step(rows, pd.Series(comm_s, index=rows.index)))
    exposed = max(0.0, step_time - float(np.mean([steps[s][1] for s in train])))
    step_time = compute + exposed
    tp = _tensor_parallel(rows, meta.get("tokens"), notes)
    ringed, context = parallel.ring_step(rows, meta, seconds, k, entry, gpus_per_node, a, cp, tp)
    if context:
        comm, exposed = comm + context["ring_s"], exposed + context["ring_exposed_s"]
        step_time = compute + exposed
    if entry == CPU and has_comm:
        comm = exposed = step_time = math.nan

    m = mfu_table(rows, step_time_s=1.0, peak_flops=1.0).iloc[0]  # model FLOPs per step; the rate is ours
    dtype = m["dtype"]
    peak = max([v for v in [peak_of(dtype) if dtype else None, *p["tensor_peak"].values()] if v] or [math.nan])
    masked = _causal_masked(rows) * k
    model_flops = float(m["model_flops_per_step"]) * k - masked
    tokens = meta.get("tokens")
    tokens = tokens * k if tokens else None
    if tokens is None:
        notes.append("the trace records no tokens per step (Tracer(tokens=...)): tokens/s is unknown")
    bounded = bounds(rows)
    bound_flops = bounded["flops"] * k
    if bounded["rows"]:
        notes.append(
            f"{bounded['rows']:,} ops count an upper bound of their FLOPs ({bound_flops:,.0f} FLOPs per step, "
            f"{100 * bounded['flops'] / max(float(per_step(rows)), 1):.1f}% of the step's; column flops_bound): "
            "the trace could not read their group sizes (meta or fake tensors), so their time, the step time "
            "and the model FLOPs of the MFU are upper bounds, exact only if every row of their operands is routed"
        )
    memory_fit = fit(
        every,
        meta,
        memory,
        table,
        found * cp if found else found,  # the fit at 1/cp of the micro-batch: its largest, in whole sequences
        planned if micro_batch is not None or cp > 1 else None,
        process_groups=_groups_used(every) + (cp > 1) if world > 1 or cp > 1 else 0,
        world=world,
    )
    if context:
        parallel.ring_memory(memory_fit, context)
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
    if memory_fit["optimizer_state_added_bytes"]:
        notes.append(
            f"optimizer state made during the trace ({memory_fit['optimizer_state_added_bytes']:,} bytes at "
            "the peak) counted as live from the first op: it stays from step to step"
        )
    if memory_fit["optimizer_state_made_bytes"] and count_steps(every) == 1:
        notes.append(
            f"the traced step is the optimizer's first: it makes its state "
            f"({memory_fit['optimizer_state_made_bytes']:,} bytes; AdamW's zeros_like), work its step time "
            "includes and later steps skip (trace two steps to price the steady one)"
        )
    sources["fragmentation"] = memory_fit["fragmentation_source"]
    a["fragmentation"] = memory_fit["fragmentation"]

    traced = error = None
    if calibrated:
        traced, how_traced = _traced_step(rows, meta)
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
        "compute_bound_s": float(
            per_step(rows, pd.Series(np.where(bound < 3, seconds - launch * p["kernel"], 0.0), index=rows.index))
        ),
        "memory_bound_s": float(
            per_step(rows, pd.Series(np.where(bound == 3, seconds - launch * p["kernel"], 0.0), index=rows.index))
        ),
        "launch_s": float(per_step(rows, pd.Series(launch * p["kernel"], index=rows.index))),
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
    units = assumed.UNITS
    listed = [{"name": n, "value": a[n], "unit": units.get(n, "fraction"), "source": sources[n]} for n in a]
    listed += [
        {"name": "peak_flops_per_s", "value": peak, "unit": "FLOP/s", "source": _peak_source(entry, dtype)},
        {"name": "hbm_bytes_per_s", "value": bandwidth, "unit": "bytes/s", "source": bw_source},
        {
            "name": "device_memory_bytes",
            "value": memory,
            "unit": "bytes",
            "source": entry["memory_source"] if entry != CPU else "unknown for a CPU",
        },
        {
            "name": "overlap",
            "value": overlap,
            "unit": "",
            "source": "reports/plan/comm.py: "
            + (
                "FSDP2's prefetch: an all-gather one unit ahead overlaps the current unit's compute; other collectives "
                "overlap the compute after them until their result is read"
                if overlap == "prefetch"
                else "none: every collective blocks the compute stream"
            ),
        },
    ]
    if entry != CPU:
        listed += [
            {
                "name": "intra_node_bytes_per_s",
                "value": entry["intra_bytes_per_s"],
                "unit": "bytes/s",
                "source": entry["intra_source"],
            },
            {
                "name": "nic_bytes_per_s",
                "value": entry["nic_bytes_per_s"],
                "unit": "bytes/s",
                "source": entry["nic_source"],
            },
        ]
    classes = [
        {
            "bound": CLASSES[c],
            "seconds_per_step": float(per_step(rows, pd.Series(np.where(bound == c, seconds, 0.0), index=rows.index))),
        }
        for c in range(len(CLASSES))
    ]
    detail = {"assumptions": listed, "classes": classes, "memory": memory_fit, "notes": notes, "basis": basis}
    whole = found * cp if found else found  # the traced batch in whole sequences of the rank's share (k's unit)
    collectives = exposed - (context["ring_exposed_s"] if context else 0.0)  # the ring's goes with its kernels
    stage = world * cp  # a stage's GPUs: the traced job's, each rank split in cp (pipeline outermost)
    priced = (rows, every, meta, seconds + ringed, collectives, k, entry, gpus_per_node, stage, a, memory_fit, whole)
    parallel.finish(record, detail, priced, shape, context)
    return record, detail


def _generation(entry):
    """The target's generation with efficiency tables (reports.plan.efficiency), or None."""
    return None if entry == CPU else _table_generation(entry["peak_key"])


def _tables(p, sources, entry):
    """Drop the tables' per-row efficiencies of a class whose flat efficiency was given; notes on what priced what."""
    given = {c: sources[f"{c}_efficiency"] == "given" for c in ("matmul", "attention")}
    for c, name in enumerate(("matmul", "attention")):
        if given[name]:
            p["shaped"][p["klass"] == c] = np.nan
    if entry == CPU or _generation(entry) is not None:
        return []
    return [
        f"reports.plan.efficiency has no GEMM sweep or attention table for the {entry['peak_key']}: its matmuls "
        "and attention kernels are priced at the flat matmul_efficiency and attention_efficiency"
    ]


def _effective(p, eff, a, sources):
    """List matmul_efficiency and attention_efficiency as what the step's ops of the class reach together
    (their FLOPs at the roof over their priced compute time) when a table priced any of them."""
    shaped = p.get("shaped")
    for c, name in enumerate(("matmul", "attention")):
        pick = (p["klass"] == c) & ~np.isnan(shaped) & (p["compute"] > 0)
        if not pick.any():
            continue
        e = np.where(np.isnan(shaped), eff[name], shaped * eff[STACKS[c]])[pick]
        value = float(p["compute"][pick].sum() / (p["compute"][pick] / e).sum())
        a[f"{name}_efficiency"] = value
        table = "a GEMM sweep by (m, n, k)" if name == "matmul" else "its kernel's published figure"
        sources[f"{name}_efficiency"] = (
            f"reports.plan.efficiency: {int(pick.sum())} {name} ops of the step each at {table} on this "
            f"generation x {STACKS[c]} ({eff[STACKS[c]]:.3g}); the figure is what they reach together "
            "(the flat assumption prices only the rest)"
        )


def _peak_source(entry, dtype):
    if entry == CPU:
        return f"the CPU's ideal {dtype} peak (reports.flops.peaks.cpu_ideal_flops)"
    return f"{entry['peak_key']} dense {dtype} peak: {PEAKS.get((entry['peak_key'], dtype), (None, 'none in the table'))[1]}"


def _causal_masked(rows):
    """Per step, the half of causal attention's model FLOPs that its kernels skip (module docstring)."""
    causal = (rows["flop_kind"] == "attention") & rows["causal"].astype("boolean").fillna(False).astype(bool)
    causal &= rows["phase"].isin(("forward", "backward")) & ~checkpoint_recompute(rows)
    if not causal.any():
        return 0.0
    model = rows["flops"].astype(np.float64) - attention_recompute(rows)
    return float(per_step(rows, values=model.where(causal, 0.0))) / 2


def _steady_step(rows):
    """(rows to price, note or None): of a trace of several training steps, the last complete one (forward,
    backward and optimizer rows, when the trace has any), without the first step's one-off work (AdamW's
    zeros_like making its state; under FakeTensorMode the lift_fresh of its scalars); else every row."""
    step = rows["step"].to_numpy(dtype=np.int64)
    seen = pd.Series(rows["phase"].astype(str).to_numpy()).groupby(step).agg(set)
    training = [s for s, phases in seen.items() if phases & {"forward", "backward"}]
    if len(training) < 2:
        return rows, None
    need = {"forward", "backward"} | ({"optimizer"} & set().union(*seen))
    complete = [s for s in training if need <= seen[s]]
    if not complete:
        return rows, None
    last = max(complete)
    return rows[step == last], (
        f"step time, FLOPs and MFU are those of step {last}, the last complete one of the {len(training)} traced "
        "(the first holds one-off work, such as an optimizer making its state); the memory peak is over every step"
    )


def _tensor_parallel(rows, tokens, notes):
    """The tensor-parallel degree of the trace (reports.plan.comm.tensor_parallel), noted when above 1: the
    ranks of a tensor-parallel group share their tokens, so each GPU's tokens/s is the rank's over the degree."""
    degree, group = tensor_parallel(rows, tokens)
    if degree > 1:
        notes.append(
            f"tensor parallelism of degree {degree} (process group {group or 'unnamed'} all-reduces or "
            f"reduce-scatters activations in the forward): its {degree} ranks read the same tokens, so tokens/s "
            f"per GPU is the trace's tokens over {degree}"
        )
    return degree


def _groups_used(rows):
    """Process groups with a collective in the trace (by the rows' process_group; 1 when collectives name
    none): NCCL makes its buffers for a group at its first collective, not for every group made."""
    comm = rows["comm_bytes"].notna()
    return max(1, rows.loc[comm, "process_group"].dropna().astype(str).nunique()) if comm.any() else 0


def _measured(rows):
    """Per row, the traced op time in seconds (busy_ns where recorded, else duration_ns)."""
    busy = rows["busy_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    return np.where(np.isnan(busy), rows["duration_ns"].to_numpy(np.float64), busy) / 1e9


def _training_steps(rows, steps):
    """The steps with forward or backward ops (all steps when none has)."""
    fb = set(rows.loc[rows["phase"].isin(("forward", "backward")), "step"].astype(int))
    return [s for s in steps if s in fb] or list(steps)


def _traced_step(rows, meta):
    median = (meta.get("step_time") or {}).get("median_s")
    if median:
        return float(median), "the untraced median step time"
    return float(per_step(rows, pd.Series(_measured(rows), index=rows.index))), "the traced op times per step"


def measured_step(df, gpu, assumptions=None):
    """For reports.plan.calibration: (run name, priced rows of the steady step of `df`'s first run on `gpu`
    (reports.plan.ops.roofs, the tables' efficiencies dropped where `assumptions` gives the class's), their op
    times in seconds, the assumptions table, whether `df` has other runs). A run not timed on `gpu` is a
    ReportError naming where it ran."""
    (name, rows), *others = list(split_runs(df))
    meta = runs_of(df)[name]
    entry, peak_of, bandwidth, _, _ = _target(gpu, meta)
    if not _on_target(entry, meta):
        device = meta.get("device") or {}
        how = "fake tensors" if device.get("fake") else f"{device.get('type')} {device.get('name') or ''}".strip()
        untimed = ", untimed" if (meta.get("timing") or {}).get("mode") == "off" else ""
        raise ReportError(
            f"plan: --calibrate needs a trace measured on {gpu} with op times; this one ran on {how}{untimed}"
        )
    rows, _ = _steady_step(rows)
    p = roofs(rows, peak_of, bandwidth, 1.0, None, _generation(entry))
    table = assumed.resolve(assumptions, _generation(entry))
    _tables(p, {n: s for n, (_, s) in table.items()}, entry)
    measured = _measured(rows)
    if not (measured > 0).any():
        raise ReportError(f"plan: --calibrate: the measured trace has no op times ({name})")
    return name, p, measured, table, bool(others)
