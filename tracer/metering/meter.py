"""Metering every step: MFU and HFU for a whole run at the cost of tracing one step per shape.

`Meter` traces the first two steps fully with a `Tracer` (after `warmup` untraced steps, the
first after them alone), reads each one's FLOPs back from the trace, then pauses the tracer
(its dispatch mode and hooks come off). Step 0 keeps its own FLOPs and the second step's
trace serves the later steps of its signature: a first step often does work the later ones
do not (SGD's momentum buffer made, gradients zeroed in place added into only from the
second step on, lazy modules initialised), with their signature. Every later
step costs a clock read at its end (the device synchronised first when the step ran on a
GPU), a forward hook on the root module noting the shapes and dtypes of every tensor in
its inputs (positional and keyword, nested in lists, tuples and dicts) and whether grad mode
was on at each root call, the optimizer steps it ran (a GradScaler skips an update whose gradients overflowed;
an evaluation step runs no backward; a root call without grad makes
no graph nodes, so a global hook counts the modules it calls, for that call alone), and two reads of the
autograd sequence number, which counts the graph nodes the thread made in the step: a
branch taken, a layer skipped, an expert called or a module called once more changes the
step's forward ops and so that count, at a few nanoseconds a read, where a global module
hook sends every module call through `Module._call_impl`'s hook path (0.7% of the example
GPT's step before any work of the hook's own). A step whose signature was traced before
reuses that trace's FLOPs; a step with a new signature (a new batch or sequence length, a
branch taken only sometimes) gets no FLOPs and the next step is traced again, once per new
signature (a step of that signature seen before its trace gets the trace's FLOPs in the
stored table), up to `max_traces` traced steps. Past that cap (dynamic padding: a new
length nearly every step) a new signature is not traced: its FLOPs are the nearest traced
signature's scaled by input elements, flagged `flops_estimated` (see tracer.metering.step_traces
StepTraces._estimate).

  model FLOPs     forward + backward FLOPs of the traced step, less what activation
                  checkpointing re-ran (rows flagged `recompute`) and the score
                  recomputation of fused attention backward kernels: the rule of
                  reports.flops.recompute, so a metered step's MFU is the one
                  reports.mfu gives the trace for the same step time.
  hardware FLOPs  every traced FLOP of the step: recompute and optimizer included (HFU).
  step time       perf_counter between step boundaries (`begin()` when called, else the end
                  of the step before), the hooks' cost included; the meter's work after a
                  traced step and its table writes are left out. A traced step's time is
                  traced time, so it gets no MFU.
  peak            `peak_flops=`, else tracer.peaks for the run's device and the dtype
                  that carries most matmul FLOPs (the table reports.mfu uses).

The per-step table goes to the trace's run metadata under `meter` (see `table`),
written with every traced step, at the first metered step and then each time the number of
steps has doubled (log2 writes: a killed run keeps the table of at least half its steps; the
table costs about 40 bytes a step), at a SIGTERM (tracer.recording.signals) and at close.

`Meter` is made of tracer.metering.step_hooks.StepHooks (the hooks that note what a step ran) and
tracer.metering.step_traces.StepTraces (which trace serves each step: signatures, re-tracing, estimates); this module
holds the run: its start, the step boundaries, the Tracer it pauses, resumes and reads back, the figures and the
table, and its close.
"""

import atexit
import sys
import threading
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from tracer.device import cuda_in_use, sync_all_cuda
from tracer.errors import TraceError
from tracer.metering.flops import nodes_made, read_rows, step_flops, token_count
from tracer.metering.record import StepFigures
from tracer.metering.step_hooks import StepHooks
from tracer.metering.step_traces import StepTraces
from tracer.peaks import lookup, normalize_dtype
from tracer.recording.dispatch import make_inert
from tracer.recording.mode import Tracer
from tracer.recording.mode_stack import depth_of
from tracer.safety import describe_exception, warn
from tracer.schema import part_paths

__all__ = ["Meter"]

_FIRST_WRITE = 1  # the table is written at the first metered step, then each time the number of steps doubles


_UNKNOWN = {
    "step": None,
    "traced": False,
    "step_time_s": None,
    "tokens": None,
    "tokens_per_s": None,  # step() after
    "model_flops": None,
    "hardware_flops": None,
    "flops_estimated": False,
    "mfu": None,
    "hfu": None,
}  # close, failed


def _sync_for(device):
    """The function that waits for the work queued on `device` before a clock read, or None."""
    if device is not None and device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if cuda_in_use():  # the model is on another device, but the step queued CUDA work
        return sync_all_cuda
    return None


def _ratio(num, den):
    return num / den if num is not None and den else None


class Meter(StepHooks, StepTraces):
    """Per-step step time, tokens/s, MFU and HFU for every step of a run, tracing one step per signature.

        meter = Meter("runs/gpt", model=model, tokens=batch * seq_len)
        for it in range(iters):
            ...                                  # forward, backward, optimizer step
            figures = meter.step()               # {"mfu": ..., "step_time_s": ..., ...}
        meter.close()                            # or `with Meter(...) as meter:`

    path, model, run_name and any other keyword go to the `Tracer`. Metering starts when the
    Meter is made: the first two steps are traced from there (step 0 keeps its FLOPs, the second's serve the
    later steps: the first may do one-off work), or the step after `warmup` untraced steps alone (a compiled
    model's first steps; they get the FLOPs of the trace of their signature). `step()` ends a step and returns its
    figures; `begin()` (optional) marks where a step begins, so that time between steps
    (evaluation, checkpoints, logging) is left out. `peak_flops` (FLOP/s) overrides the table.
    One Meter (like one Tracer) is active per process, from its making to `close()`, and meters the thread
    that made it (`step()` and `begin()` on another thread count an error and return unknown figures).
    Bookkeeping failures become a warning and a count (`errors`); the program runs on."""

    def __init__(
        self, path, *, model=None, tokens=None, peak_flops=None, warmup=0, max_traces=8, sync=True, **tracer_kwargs
    ):
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise TraceError(f"Meter: warmup must be an int >= 0 (steps run before the first trace), got {warmup!r}")
        if not isinstance(max_traces, int) or isinstance(max_traces, bool) or max_traces < 1:
            raise TraceError(f"Meter: max_traces must be an int >= 1 (steps traced at most), got {max_traces!r}")
        if peak_flops is not None and (
            isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float)) or not peak_flops > 0
        ):
            raise TraceError(f"Meter: peak_flops must be FLOP/s > 0 or None, got {peak_flops!r}")
        self._tracer = Tracer(path, model=model, tokens=tokens, **tracer_kwargs)
        self.tokens, self.peak_flops, self.errors = tokens, peak_flops, 0
        self._root = (
            model  # a torch.compile wrapper itself: its hooks run outside the compiled code, the original's inside
        )
        self._thread = threading.get_ident()
        self._traces = []  # per traced step: its FLOPs, dtype and peak
        self._known = {}  # signature -> index in _traces
        self._steps = {"step": [], "step_time_s": [], "tokens": [], "trace": [], "traced": [], "scale": []}
        self.max_traces, self._traced_steps = max_traces, 0
        self._nodes_forgotten = False  # the signatures leave the node count out (compiled code: _compiled)
        self._pending = {}  # signature -> steps that ran with it before its trace
        self._inputs, self._grads = [], []  # the root's input signatures; grad mode at each root call
        self._calls, self._counting = {}, None  # module class -> calls in root calls without grad; their hook
        self._next_write, self._closed, self._sync, self._use_sync = _FIRST_WRITE, False, None, sync
        self._handles = []
        self._optimizer_steps = 0  # optimizer steps the step ran (a GradScaler skips one whose gradients overflowed)
        self._stepped = register_optimizer_step_post_hook(self._optimizer_stepped)
        self._install_hooks()
        try:
            self._tracer.__enter__()
        except BaseException:
            self._remove_hooks()
            self._stepped.remove()
            raise
        self.warmup = warmup
        self._tracing, self._reclock, self._trace_failures = True, False, 0
        self._first_seq = self._next_seq()  # the traced step's rows: from here to the pause
        self._tracer._term.before_flush.append(self._table_at_signal)  # a SIGTERM writes the table with the rows
        if (
            warmup
        ):  # the first steps run untraced (compilation, autotuning, lazy state): timed, FLOPs from a later trace
            self._pause_tracer()
            self._tracing = False
            self._sync = _sync_for(self._tracer._device) if sync else None
        self._begins = self._retrace = False  # begin() has been called; a trace waits for the next begin()
        self._began = time.perf_counter()
        self._nodes = nodes_made()  # the autograd sequence number where the step began
        self._held = None  # what _hold() keeps until _release()
        atexit.register(self._at_exit)  # a loop that never calls close() still gets its table written

    # the step boundary ------------------------------------------------------------------
    def _clock(self):
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def begin(self, trace=False):
        """Mark the start of a step (optional: without it a step starts where the last one ended). Once it
        has been called, a step to be traced is traced from the next begin(), so what runs between
        steps (an evaluation) stays out of its FLOPs as out of its time. `trace=True` traces this step (past the
        warm-up, while the cap allows): a step known beforehand to differ from the others, such as the short step
        that ends an epoch under gradient accumulation, gets its own FLOPs, not a re-trace of the step after it."""
        if self._closed or self._elsewhere("begin"):
            return
        self._begins = True
        if trace and not self._tracing and self._can_trace() and len(self._steps["step"]) >= self.warmup:
            self._retrace = True
        if self._tracing:  # begun again with no step() since (an attempt abandoned): its FLOPs from here, as its time
            self._first_seq = self._next_seq()
        if self._retrace:  # a step traced from here: what ran between steps stays out of its FLOPs
            self._retrace = False
            try:
                self._resume()
                self._tracing = True
            except Exception as exc:
                self._failed(exc)
        self._start_step(self._clock())

    def _start_step(self, began):
        """What the next step ran starts empty: its root calls, grad modes, module counts (and their hook), its
        clock at `began` and its graph node count here."""
        self._inputs.clear()
        self._grads.clear()
        self._calls.clear()
        self._stop_counting()  # a root call without grad that raised
        self._optimizer_steps = 0
        self._began = began
        self._nodes = nodes_made()

    def step(self, tokens=None):
        """End a step: returns {step, traced, step_time_s, tokens, tokens_per_s, model_flops,
        hardware_flops, flops_estimated, mfu, hfu} (None where unknown: all of them after close() or when the meter
        failed), a dict printed as one line (tracer.metering.record.StepFigures).
        `tokens` overrides tokens= for this step."""
        if self._closed or self._elsewhere("step"):
            return StepFigures(_UNKNOWN)
        if tokens is not None:
            tokens = token_count(tokens)
        now = self._clock()
        try:
            return self._end_step(now - self._began, tokens if tokens is not None else self.tokens, now)
        except Exception as exc:
            self._failed(exc)
            return StepFigures(_UNKNOWN)
        finally:  # the next step starts now (after a trace or a table write: once that work is done)
            self._start_step(self._clock() if self._reclock else now)
            self._reclock = False

    def _hold(self):
        """Leave what runs from here to `_release()` out of the step (a validation Lightning runs between two of its
        micro-batches): its time, its root calls and graph nodes, and in a traced step its ops (the tracer paused)."""
        if self._closed:
            return
        try:
            traced = self._tracing
            if traced:
                self._pause_tracer()
            self._held = (self._clock(), len(self._inputs), dict(self._calls), nodes_made(), traced)
        except Exception as exc:
            self._failed(exc)

    def _release(self):
        held, self._held = self._held, None
        if held is None or self._closed:
            return
        began, inputs, calls, nodes, traced = held
        try:
            self._stop_counting()
            del self._inputs[inputs:], self._grads[inputs:]
            self._calls.clear()
            self._calls.update(calls)
            self._nodes += nodes_made() - nodes
            if traced:
                self._resume_tracer()
            self._began += self._clock() - began
        except Exception as exc:
            self._failed(exc)

    def _elsewhere(self, call):
        """True (a failure counted) on a thread other than the Meter's: the tracer records only the thread that
        entered it, and its dispatch mode, on that thread's stack, cannot come off or go on from here."""
        if threading.get_ident() == self._thread:
            return False
        self._failed(
            TraceError(
                f"{call}() on another thread than the one that made the Meter, which alone is "
                "traced: make the Meter in the thread that runs the loop"
            )
        )
        return True

    def _failed(self, exc):
        self.errors += 1
        if self.errors == 1:
            warn(f"optrace: meter: could not meter a step ({describe_exception(exc)}); the program runs on")

    # the tracer it drives: the rows so far, pausing and resuming it, a traced step's FLOPs read back ----------
    def _next_seq(self):
        rows = self._tracer._rows
        return rows.first_seq + len(rows)

    def _resume(self):
        self._first_seq = self._next_seq()
        self._resume_tracer()

    # its mode off and on at its own place in the stack (tracer.recording.mode_stack)
    def _pause_tracer(self):
        self._tracer._pause()

    def _resume_tracer(self):
        self._tracer._resume()

    def _read_trace(self):
        """Pause the tracer after a traced step and read that step's FLOPs back from its parts."""
        tr = self._tracer
        tr._meta["meter"] = self.table()
        self._pause_tracer()
        self._tracing = False
        self._sync = _sync_for(tr._device) if self._use_sync else None
        # by seq, not step: a step that ran nothing leaves the tracer's step number where it was
        table = read_rows(part_paths(tr._writer.directory), self._first_seq, self._next_seq())
        found = step_flops(table)
        found["trace_steps"] = [min(table["step"]), max(table["step"])] if table["step"] else None
        found["first_step"] = len(self._steps["step"])
        dtype = found["dtype"]
        if self.peak_flops is not None:
            found["peak_flops_per_s"], found["peak_source"] = float(self.peak_flops), "given"
        elif dtype is None:
            found["peak_flops_per_s"], found["peak_source"] = None, "no FLOPs in the trace, so no dtype to look up"
        else:
            found["peak_flops_per_s"], found["peak_source"] = lookup(tr._meta.get("device"), normalize_dtype(dtype))
        self._traces.append(found)
        return len(self._traces) - 1

    # results ---------------------------------------------------------------------------
    def figures(self, index):
        """The figures of step `index` (see `step`)."""
        steps = self._steps
        keys = ("step_time_s", "tokens", "trace", "traced", "scale")
        seconds, tokens, trace, traced, scale = (steps[k][index] for k in keys)
        found = self._traces[trace] if trace >= 0 else {}
        model, hardware, peak = found.get("model_flops"), found.get("hardware_flops"), found.get("peak_flops_per_s")
        if scale is not None and model is not None:  # estimated: the optimizer's FLOPs do not scale with the batch
            optimizer = found["optimizer_flops"]
            model, hardware = round(model * scale), round((hardware - optimizer) * scale + optimizer)
        timed = None if traced else seconds  # traced time is not step time
        return StepFigures(
            {
                "step": index,
                "traced": traced,
                "step_time_s": seconds,
                "tokens": tokens,
                "tokens_per_s": _ratio(tokens, timed),
                "model_flops": model,
                "hardware_flops": hardware,
                "flops_estimated": scale is not None,
                "mfu": _ratio(_ratio(model, timed), peak),
                "hfu": _ratio(_ratio(hardware, timed), peak),
            },
            found,
            self._tracer._meta.get("device"),
        )

    def table(self):
        """The run metadata's `meter`: {traces: [per traced step: model_flops, hardware_flops,
        recompute_flops, optimizer_flops, dtype, peak_flops_per_s, peak_source, trace_steps (its steps in the
        trace), first_step], steps: {step, step_time_s, tokens, trace (index into traces, -1: FLOPs unknown),
        traced, scale (null, or the factor an estimate scales the trace's FLOPs by): column lists},
        max_traces, errors}."""
        whole = min(len(v) for v in self._steps.values())  # a step half appended (a SIGTERM in _end_step): left out
        return {
            "traces": [dict(t) for t in self._traces],
            "steps": {k: v[:whole] for k, v in self._steps.items()},
            "max_traces": self.max_traces,
            "errors": self.errors,
        }

    # closing ---------------------------------------------------------------------------
    def close(self, exc=None):
        """Write the table and close the trace (a step not ended by `step()` stays out of the table)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._remove_hooks()
        self._stepped.remove()
        tr = self._tracer
        try:
            self._estimate_pending()
            tr._meta["meter"] = self.table()
            if not self._tracing:
                self._resume_tracer()
            elif depth_of(tr._mode) is None:  # closed on another thread (the exit handler) while tracing on the Meter's
                make_inert(tr._mode)  # left on that thread's stack, it runs what comes there untraced
                torch._C._push_on_torch_dispatch_stack(tr._mode)  # for the Tracer's exit to pop here, with its flags
        finally:
            tr.__exit__(type(exc) if exc is not None else None, exc, None)

    def _at_exit(self):
        """Close at the interpreter's exit; after an unhandled exception (Python sets sys.last_exc, before 3.12
        sys.last_value, before the exit handlers run) the trace is marked incomplete with its error, as a
        `with Tracer` block that raised."""
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        self.close(exc if isinstance(exc, BaseException) else None)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(exc)
        return False
