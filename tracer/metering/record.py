"""What `tracer.Meter.step()` returns: the step's figures as a dict, printed as one line.

    >>> print(meter.step())
    step 12: 41.3 ms, 24,790 tok/s, MFU 28.5% (bf16 peak of H100 SXM)

`StepFigures` is a dict (the keys `Meter.step` documents, unrounded: `figures["mfu"]`,
`dict(figures)`, `figures == {...}` work as before); its `str` is one line of at most
`WIDTH` characters with the step, its time, tokens/s and MFU, or why there is no MFU;
its `repr` is the dict's.
"""

from tracer.peaks import match_device, normalize_dtype

__all__ = ["StepFigures", "peak_label"]

WIDTH = 120  # the most characters str(StepFigures) prints
_SHORT = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "tfloat32": "tf32",
    "float8": "fp8",
    "float64": "fp64",
}


def peak_label(trace, device):
    """The peak an MFU is taken against, in words: "bf16 peak of H100 SXM", "given peak", or None when there is no
    peak. `trace` is one of `Meter.table()`'s `traces` (dtype, peak_flops_per_s, peak_source); `device` the run
    metadata's `device`."""
    if not trace or trace.get("peak_flops_per_s") is None:
        return None
    if trace.get("peak_source") == "given":
        return "given peak"
    dtype = normalize_dtype(trace.get("dtype"))
    dtype = _SHORT.get(dtype, dtype)
    device = device or {}
    if device.get("type") == "cpu":
        return f"{dtype} ideal peak of the CPU"
    return f"{dtype} peak of {match_device(device.get('name')) or device.get('name') or 'the device'}"


def _three(x):
    """`x` to three significant digits, trailing zeros kept: 41.3, 15.0, 0.285, 123."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:#.3g}"


def _seconds(s):
    return f"{s:.2f} s" if s >= 1 else f"{_three(s * 1e3)} ms"


def _percent(ratio):
    return f"{_three(ratio * 100)}%"


class StepFigures(dict):
    """One step's figures (a dict: step, traced, step_time_s, tokens, tokens_per_s, model_flops, hardware_flops,
    flops_estimated, mfu, hfu; None where unknown) whose `str` is one line of at most `WIDTH` characters.
    `trace` and `device`: what `peak_label` names the peak from, read only when the line is made (a step's
    bookkeeping stays a dict copy)."""

    __slots__ = ("_trace", "_device")

    def __init__(self, figures, trace=None, device=None):
        super().__init__(figures)
        self._trace, self._device = trace, device

    @property
    def peak(self):
        """The peak the MFU is taken against, in words (`peak_label`), or None."""
        return peak_label(self._trace, self._device)

    def __str__(self):
        if self.get("step") is None:
            return "step ?: no figures (the meter is closed, or could not meter this step)"
        seconds, rate = self.get("step_time_s"), self.get("tokens_per_s")
        if self.get("traced"):
            return _fit(
                f"step {self['step']}: traced ({_seconds(seconds)} with the tracer on), no MFU: traced time "
                "is not step time"
            )
        parts = [f"step {self['step']}: {_seconds(seconds)}"]
        if rate is not None:
            parts.append(f"{rate:,.0f} tok/s")
        parts.append(self._mfu())
        return _fit(", ".join(parts))

    def _mfu(self):
        if self.get("mfu") is not None:
            estimated = "FLOPs estimated; " if self.get("flops_estimated") else ""
            return f"MFU {_percent(self['mfu'])} ({estimated}{self.peak or 'peak unknown'})"
        if self.get("model_flops") is None:
            return "MFU N/A: no traced FLOPs for this step's signature yet"
        if self.peak is None:
            return "MFU N/A: no peak for this device and dtype (pass peak_flops=)"
        return "MFU N/A"


def _fit(line):
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."
