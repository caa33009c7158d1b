"""Model FLOPs utilisation (MFU) of a traced training step.

MFU = (FLOPs the model needs per step, without recomputation) / (untraced step
time in seconds) / (the device's dense peak FLOP/s for the dtype used), as PaLM
defines it (Chowdhery et al. 2022, appendix B). The lecture's "actual FLOP/s over
promised FLOP/s"; an MFU of 0.5 or more is good.

  model FLOPs     forward + backward FLOPs of the trace per step, less every row
                  activation checkpointing re-ran (the `recompute` flag: PaLM's MFU
                  leaves rematerialisation out) and less what fused attention
                  backward kernels spend recomputing the scores (they count five
                  score-sized matmuls where four are needed); see reports.flops.recompute.
                  Optimizer (and "other" phase) FLOPs are not model FLOPs. Matmuls
                  with weights outside model= (a frozen teacher's forward) are work
                  the step needs, so they stay in.
  hardware FLOPs  every traced FLOP per step, recomputation and optimizer included:
                  HFU = hardware FLOPs per second / peak.
  per step        every figure goes through reports.steps.per_step (each phase's
                  total over the steps it ran in).
  step time       the untraced median step time recorded with
                  Tracer.set_step_time(time_step(...)), or `step_time_s`. Never the
                  traced wall time nor a sum of `duration_ns`: tracing slows every
                  op, so with no untraced time MFU is None.
  peak            `peak_flops` if given, else reports.peaks: the dense datasheet
                  figure for the GPU and dtype, or a CPU's ideal peak (cores x clock
                  x FLOPs per cycle). None when nothing fits: MFU is then None (N/A).
  dtype           the dtype that carries most matmul and attention FLOPs (a bf16
                  autocast trace is "bfloat16"; an fp8 step whose _scaled_mm calls
                  carry most FLOPs is "float8"), or `dtype` (e.g. "tfloat32").
                  Published fp8 runs quote MFU against the bf16 peak: dtype="bfloat16".

MFU weighted by dtype (`mfu_weighted`, beside `mfu`, whose meaning is unchanged): each
matmul and attention row at the dense peak of the dtype it ran in (its first multiplied
operand's: a _scaled_mm's float8, a bf16 mm's bfloat16; an fp32 mm's tfloat32 with
dtype="tfloat32"), every other row at `dtype`'s peak. The time the step's model FLOPs take at those peaks is the sum over ops of
FLOPs / peak; `weighted_peak_flops_per_s` is the model FLOPs over that time (a harmonic
mean of the peaks, weighted by FLOPs) and mfu_weighted = that time / step time. It equals
`mfu` when every matmul ran in `dtype`; with a given `peak_flops` every dtype gets it.
A dtype the device has no peak for (fp8 on an A100) leaves it NaN, and
`weighted_peak_source` names the dtype.

On a trace with a measured matmul ceiling (Tracer.set_ceiling(matmul_ceiling(...)))
`mfu_of_achievable` sets the achieved FLOP/s against what a large matmul reached on
the same device and dtype: how far the step is from the best this machine does.

Values that cannot be known (MFU without a step time or a peak) are NaN, pandas'
None for numbers: test them with `pd.isna` and print them as N/A
(`to_string(na_rep="N/A")`).
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import packet
from reports.arrays import arrow_of, numpy_of
from reports.errors import ReportError
from reports.flops.accounting import traced_tokens
from reports.flops.peaks import cpu_ideal_flops, normalize_dtype
from reports.flops.peaks import peak_flops as lookup_peak
from reports.flops.recompute import attention_recompute, checkpoint_recompute
from reports.flops.roles import skipped_inputs
from reports.flops.rows import frame_of, per_step, records_table, require, to_frame
from reports.steps import per_step_of
from tracer.rules import DTYPE_KINDS, carrying_dtype, dtype_rows

__all__ = ["COLUMNS", "mfu", "mfu_table"]

_COLUMNS = ("run", "step", "phase", "op", "flops", "flop_kind", "input_shapes", "input_dtypes")
COLUMNS = (*_COLUMNS, "recompute")  # every column mfu reads (recompute when the trace has it)
_S, _F = pa.string(), pa.float64()
_OUT = {
    "run": _S,
    "device": _S,
    "dtype": _S,
    "steps": pa.int64(),
    "tokens_per_step": _F,
    "model_flops_per_step": _F,
    "hardware_flops_per_step": _F,
    "recompute_flops_per_step": _F,
    "optimizer_flops_per_step": _F,
    "step_time_s": _F,
    "step_time_source": _S,
    "tokens_per_s": _F,
    "achieved_flops_per_s": _F,
    "hardware_flops_per_s": _F,
    "peak_flops_per_s": _F,
    "peak_source": _S,
    "mfu": _F,
    "weighted_peak_flops_per_s": _F,
    "weighted_peak_source": _S,
    "mfu_weighted": _F,
    "hfu": _F,
    "ideal_flops_per_s": _F,
    "ceiling_flops_per_s": _F,
    "ceiling_dtype": _S,
    "mfu_of_achievable": _F,
}


def _per_run(value, run, what):
    """A scalar for every run, or {run: value}; checked to be a number > 0."""
    if isinstance(value, dict):
        value = value.get(run)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ReportError(f"mfu: {what} must be a number > 0 (or {{run: number}}), got {value!r}")
    return float(value)


def _operand_codes(rows, at):
    """(a code per row at positions `at` that has a first multiplied operand (addmm's bias skipped), the dtype name
    of each code ("None" for a null item; a name may come twice), a boolean array: which of those rows have one):
    the dtype cells taken and encoded by Arrow, each distinct name made a Python string once."""
    lists = rows.lists("input_dtypes", pa.string(), at)
    offsets = numpy_of(lists.offsets).astype(np.int64)  # into lists.values, a slice's offsets included
    count = np.diff(offsets)
    first = skipped_inputs(rows.labels("op").map(packet).take(at))  # addmm's bias is not multiplied
    first = np.where(first < count, first, 0)
    ok = count > 0
    picked = lists.values.take(arrow_of(offsets[:-1][ok] + first[ok]))
    encoded = picked if pa.types.is_dictionary(picked.type) else pc.dictionary_encode(picked)
    words = [str(name) for name in encoded.dictionary.to_pylist()] + ["None"]
    return numpy_of(encoded.indices, null=len(words) - 1).astype(np.int64), words, ok


def _kind_rows(rows):
    """(the rows of a DTYPE_KINDS kind with FLOPs, _operand_codes of them), made once for `rows` (matmul_dtype and
    the weighted peak both read them)."""

    def make():
        at = np.flatnonzero(rows.labels("flop_kind").isin(DTYPE_KINDS) & (rows["flops"] > 0))
        return at, _operand_codes(rows, at)

    return rows.once("dtype_kind_rows", make)


def matmul_dtype(rows):
    """The dtype carrying most matmul + attention FLOPs in these rows, else most FLOPs (None if there are none).

    A row's dtype is that of its first multiplied operand (addmm's bias skipped). The rules are
    tracer.rules's, which the run-time meter applies too. `rows`: reports.flops.rows.Rows."""
    flops = rows["flops"]
    at = np.flatnonzero(dtype_rows(rows.labels("flop_kind").isin(DTYPE_KINDS), flops))
    kind_at, found = _kind_rows(rows)
    codes, words, ok = found if np.array_equal(at, kind_at) else _operand_codes(rows, at)
    if not ok.any():
        return None
    flops = flops[at][ok]
    if np.issubdtype(flops.dtype, np.integer) and float(np.abs(flops).sum(dtype=np.float64)) < 2**52:
        # the sums per name are exact in any order: carrying_dtype of one row per name (its total), in first-seen order
        totals = np.bincount(codes, weights=flops.astype(np.float64), minlength=len(words))
        named = {}  # name -> [its first row, its total]
        for code in np.flatnonzero(np.bincount(codes, minlength=len(words))).tolist():
            first, found = int(np.argmax(codes == code)), named.setdefault(words[code], [len(codes), 0.0])
            found[0], found[1] = min(found[0], first), found[1] + totals[code]
        names = sorted(named, key=lambda name: named[name][0])
        return carrying_dtype(names, [named[name][1] for name in names])
    return carrying_dtype(np.asarray(words, dtype=object)[codes].tolist(), flops)


def _model_flops_by_dtype(rows, model_values, run_dtype):
    """{dtype: model FLOPs per step}: each matmul and attention row (tracer.rules.DTYPE_KINDS) under the dtype it
    ran in (its first multiplied operand's, every fp8 "float8"; a float32 one "tfloat32" when `run_dtype` is), every
    other row under `run_dtype`, the dtype whose peak the `mfu` column uses. `model_values`: each row's model FLOPs (0 where none)."""
    flops = rows["flops"]
    at, (codes, words, ok) = _kind_rows(rows)
    run_key = normalize_dtype(run_dtype) if run_dtype is not None else ""
    ran = [normalize_dtype(name) for name in words]
    if run_key == "tfloat32":  # dtype="tfloat32": the fp32 matmuls ran on TF32 tensor cores
        ran = ["tfloat32" if name == "float32" else name for name in ran]
    keys = sorted({run_key, *ran})  # numbered in string order: per_step's keys in the order np.unique gives strings
    number = {k: i for i, k in enumerate(keys)}
    key = np.full(len(flops), number[run_key], dtype=np.int64)
    key[at[ok]] = np.asarray([number[name] for name in ran], dtype=np.int64)[codes]
    used = np.flatnonzero(np.bincount(key, minlength=len(keys)))  # np.unique's keys, without a sort of the rows
    compact = np.zeros(len(keys), dtype=np.int64)
    compact[used] = np.arange(len(used))
    names = np.asarray([keys[k] for k in used.tolist()], dtype=object)
    found, figures = per_step_of(model_values, rows.phases(), None, (compact[key], names))
    return {dtype: figure for dtype, figure in zip(found.tolist(), figures) if figure}


def _weighted_peak(device, by_dtype, given):
    """(FLOP/s, source): the peak a step's model FLOPs run at when each op runs at the peak of its own dtype:
    all the FLOPs over the time each dtype's FLOPs take at that dtype's peak (a harmonic mean weighted by FLOPs).
    A given peak applies to every dtype; a dtype without a peak leaves it unknown (None, and the source says so)."""
    if given is not None:
        return given, "given"
    seconds = 0.0
    for dtype, flops in by_dtype.items():
        peak, source = lookup_peak(device, dtype or None)
        if peak is None:
            return None, f"no {dtype or 'dtype'} peak: {source}"
        seconds += flops / peak
    if not seconds:
        return None, "no model FLOPs"
    return sum(by_dtype.values()) / seconds, "per dtype: " + ", ".join(sorted(by_dtype))


def _ratio(num, den):
    """num / den, None when either is unknown; a quotient past float64 is inf (an MFU above 100%, flagged as such)
    without numpy's overflow warning, which the CLI would print as a note."""
    if num is None or not den:
        return None
    with np.errstate(over="ignore"):
        return num / den


def mfu(df, step_time_s=None, peak_flops=None, dtype=None):
    """One row per run: model and hardware FLOPs per step, step time, achieved FLOP/s, peak, MFU, HFU.

    step_time_s  seconds per untraced step (a number, or {run: number}); default the
                 run's metadata step_time.median_s.
    peak_flops   FLOP/s to measure against (a number, or {run: number}); default the
                 dense datasheet peak (reports.peaks) for the device and dtype.
    dtype        the dtype whose peak applies (e.g. "tfloat32"); default the dtype
                 that carries most matmul FLOPs.
    See the module docstring for the definitions; NaN marks what cannot be known."""
    from reports.loading.load import require as require_columns

    require_columns(df, _COLUMNS, "mfu")
    return to_frame(mfu_table(frame_of(df), step_time_s, peak_flops, dtype))


def mfu_table(frame, step_time_s=None, peak_flops=None, dtype=None):
    """`mfu` of a reports.flops.rows.Frame, as a pyarrow.Table."""
    require(frame.column_names, _COLUMNS, "mfu")
    if dtype is not None and not isinstance(dtype, str) and not hasattr(dtype, "is_floating_point"):
        raise ReportError(f"mfu: dtype must be a dtype name such as 'bfloat16' or a torch.dtype, got {dtype!r}")
    records = []
    for run, rows in frame.split():
        meta = frame.runs[run]
        steps = rows.count_steps()
        phase = rows.labels("phase")
        fb = phase.isin(("forward", "backward"))
        again = checkpoint_recompute(rows)
        scores = per_step(rows, values=attention_recompute(rows))
        recompute = per_step(rows, mask=again) + scores
        model_values = np.where(fb & ~again, rows["flops"], 0) - attention_recompute(rows)
        model = per_step(rows, mask=fb & ~again) - scores
        hardware = per_step(rows)
        optimizer = per_step(rows, mask=phase.eq("optimizer"))

        step_time, time_source = _per_run(step_time_s, run, "step_time_s"), "given"
        if step_time is None:
            median = (meta.get("step_time") or {}).get("median_s")
            step_time, time_source = (float(median), "untraced median (metadata)") if median else (None, None)
        run_dtype = normalize_dtype(dtype) if dtype is not None else matmul_dtype(rows)
        device = meta.get("device") or {}
        peak, source = lookup_peak(device, run_dtype, _per_run(peak_flops, run, "peak_flops"))
        if run_dtype is None and peak_flops is None:
            peak, source = None, "no FLOPs in the trace, so no dtype to look up"

        given = _per_run(peak_flops, run, "peak_flops")
        weighted, weighted_source = _weighted_peak(device, _model_flops_by_dtype(rows, model_values, run_dtype), given)
        achieved = _ratio(model, step_time)
        hardware_rate = _ratio(hardware, step_time)
        ceiling = meta.get("ceiling") or {}
        ceiling_rate = ceiling.get("flops_per_s")
        ceiling_dtype = ceiling.get("dtype")
        same_dtype = ceiling_dtype is not None and normalize_dtype(ceiling_dtype) == normalize_dtype(run_dtype)
        tokens = traced_tokens(meta) or meta.get("tokens")  # a Meter's traced steps: the tokens meter.step() gave
        records.append(
            {
                "run": run,
                "device": device.get("name"),
                "dtype": run_dtype,
                "steps": steps,
                "tokens_per_step": tokens,
                "model_flops_per_step": model,
                "hardware_flops_per_step": hardware,
                "recompute_flops_per_step": recompute,
                "optimizer_flops_per_step": optimizer,
                "step_time_s": step_time,
                "step_time_source": time_source if step_time is not None else "none: no untraced step time",
                "tokens_per_s": _ratio(tokens, step_time),
                "achieved_flops_per_s": achieved,
                "hardware_flops_per_s": hardware_rate,
                "peak_flops_per_s": peak,
                "peak_source": source,
                "mfu": _ratio(achieved, peak),
                "weighted_peak_flops_per_s": weighted,
                "weighted_peak_source": weighted_source,
                "mfu_weighted": _ratio(achieved, weighted),
                "hfu": _ratio(hardware_rate, peak),
                "ideal_flops_per_s": cpu_ideal_flops(device, run_dtype)[0] if device.get("type") == "cpu" else None,
                "ceiling_flops_per_s": ceiling_rate,
                "ceiling_dtype": ceiling_dtype,
                "mfu_of_achievable": _ratio(achieved, ceiling_rate) if same_dtype else None,
            }
        )
    return records_table(records, _OUT)
