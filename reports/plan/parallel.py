"""The parallelisms a plan adds to a traced rank: pipeline stages (reports.plan.pipeline) and
context parallelism (reports.plan.context), applied to the figures reports.plan.plan priced for the
rank as traced. A plan with pp = 1 and cp = 1 gets their columns at their neutral values (pp 1, no
bubble, no sends, cp 1, no ring).
"""

import math

import numpy as np

from reports.errors import ReportError
from reports.plan.context import ring
from reports.plan.pipeline import SCHEDULES, pipeline

__all__ = ["check", "degree", "finish", "ring_memory", "ring_step"]


def degree(shape, found, cpu):
    """The context-parallel degree of `shape`, refused (ReportError) where it cannot be planned: on the
    CPU, or without the traced batch (`found`), which the fit at 1/cp of the micro-batch needs."""
    cp = shape[4]
    if cp > 1 and (found is None or cpu):
        raise ReportError("plan: cp needs a GPU target and the traced batch (pass batch=)")
    return cp


def finish(record, detail, priced, shape, context):
    """The pipeline's and the ring's figures in the run's `record` and `detail`; `priced`: the arguments
    of reports.plan.pipeline.pipeline but the shape; `context`: reports.plan.context.ring's figures or None."""
    if shape[0] > 1:
        if priced[6] == "cpu":
            raise ReportError("plan: pp needs a GPU target, whose links price the sends between stages")
        _pipelined(record, detail, priced, shape[:4])
    else:
        record.update(pp=1, micro_batches=1, schedule=None, virtual_stages=1, pipeline_bubble_s=0.0)
        record.update(bubble_fraction=0.0, p2p_s=0.0)
    cp = shape[4]
    record.update(cp=cp, ring_s=context["ring_s"] if context else 0.0)
    record["kv_in_flight_bytes"] = context["kv_in_flight_bytes"] if context else 0.0
    if context:
        detail["context"] = context
        detail["notes"].append(
            f"context parallelism {cp}: each rank holds {context['seq'] // cp} of the {context['seq']} tokens of a "
            f"sequence; ring attention sends {context['ring_bytes']:,.0f} bytes per step ({context['ring_s']:.3g} s, "
            f"{context['ring_exposed_s']:.3g} s of it exposed past the attention it overlaps); tokens, FLOPs and "
            "growing bytes are a rank's 1/cp share; the largest micro-batch leaves out the K/V blocks in flight"
        )


def ring_step(rows, meta, seconds, k, entry, gpus_per_node, a, cp, tp=1):
    """(per-row exposed seconds, figures) of ring attention at context-parallel degree `cp` (reports.plan.context
    .ring; `k` the rank's share of the traced micro-batch, `tp` the trace's tensor-parallel degree); zeros and
    None for cp 1."""
    if cp == 1:
        return np.zeros(len(rows)), None
    return ring(rows, meta, seconds, cp, k * cp, entry, gpus_per_node, a, tp)


def ring_memory(memory_fit, context):
    """The K/V blocks ring attention holds in flight, added to the fit's peak and what it requires."""
    extra = context["kv_in_flight_bytes"]
    memory_fit["cp_kv_in_flight_bytes"] = extra
    memory_fit["peak_bytes_per_rank"] += extra
    memory_fit["required_bytes"] += (1 + memory_fit["fragmentation"]) * extra
    memory_fit["fragmentation_bytes"] += memory_fit["fragmentation"] * extra
    if memory_fit["device_memory_bytes"] is not None:
        memory_fit["headroom_bytes"] = memory_fit["device_memory_bytes"] - memory_fit["required_bytes"]
        memory_fit["fits"] = bool(memory_fit["headroom_bytes"] >= 0)


def check(pp, micro_batches, schedule, virtual_stages, cp):
    """(pp, micro_batches, schedule, virtual_stages, cp), checked: a bad value is a ReportError naming it."""
    for name, value in (("pp", pp), ("micro_batches", micro_batches), ("virtual_stages", virtual_stages), ("cp", cp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ReportError(f"plan: {name} must be an int >= 1, got {value!r}")
    if schedule not in SCHEDULES:
        raise ReportError(f"plan: schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if virtual_stages > 1 and schedule != "interleaved":
        raise ReportError(f"plan: virtual_stages {virtual_stages} needs schedule 'interleaved', got {schedule!r}")
    if schedule == "interleaved" and 1 < pp and micro_batches < pp:  # Megatron-LM's schedules.py refuses it too
        raise ReportError(
            f"plan: micro_batches {micro_batches} must be at least pp {pp} for the interleaved schedule "
            "(fewer leave it no steady state: its bubble is not (p-1)/(v m+p-1))"
        )
    if micro_batches > 1 and pp == 1:
        raise ReportError(f"plan: micro_batches {micro_batches} needs pp > 1 (the micro-batches of a pipeline)")
    return pp, micro_batches, schedule, virtual_stages, cp


def _pipeline_changes(record):
    """The change that fits a pipeline that does not: its largest micro-batch (reports.plan.pipeline's, every
    rank within the memory), as reports.plan.changes writes one; none where no micro-batch fits."""
    largest = record.get("max_micro_batch")
    if record.get("fits") is not False or not largest or largest >= record["micro_batch"]:
        return []
    how = "the largest that fits every rank of the pipeline"
    return [{"change": "micro_batch", "value": largest, "fits": True, "required_bytes": None, "how": how}]


def _pipelined(record, detail, priced, shape):
    """The record and detail of one run under the pipeline `shape` (reports.plan.pipeline): the step of
    m micro-batches with its bubble and sends, tokens and FLOPs of the m micro-batches over pp GPUs, and
    the memory of the rank that needs most."""
    figures, stages = pipeline(*priced, shape)
    pp, m = shape[0], shape[1]
    record.update(figures)
    step = record["step_time_s"]
    record["tokens_per_step"] = record["tokens_per_step"] * m if record["tokens_per_step"] else None
    record["model_flops_per_step"] *= m
    record["causal_masked_flops_per_step"] *= m
    record["bound_flops_per_step"] *= m
    gpus = pp * record["tp"]  # one replica: its tp ranks read the same tokens (reports.plan.comm.tensor_parallel)
    record["tokens_per_s_per_gpu"] = record["tokens_per_step"] / step / gpus if record["tokens_per_step"] else math.nan
    peak = record["peak_flops_per_s"]
    record["mfu"] = record["model_flops_per_step"] / (step * pp * peak) if step > 0 and peak == peak else math.nan
    detail["pipeline"] = stages
    if "changes" in detail["memory"]:  # priced for one rank holding every layer: not for a stage
        detail["memory"]["changes"] = _pipeline_changes(record)
    detail["notes"].append(
        f"pipeline: {pp} stages of {stages['blocks']} ({stages['block_count']} blocks), {m} micro-batches "
        f"of {record['micro_batch']} per step, {shape[2]}"
        + (f" with {record['virtual_stages']} virtual stages" if shape[2] == "interleaved" else "")
        + ": tokens per step are the pipeline's (one data-parallel replica of pp x tp GPUs), per GPU over pp x tp; "
        "compute_s, comm_s and exposed_comm_s are one micro-batch through every layer on one GPU; the "
        "memory is the rank that needs most (the changes priced without a pipeline are not shown)"
    )
