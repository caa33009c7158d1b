"""The public `Tracer` context manager: its arguments, the one active Tracer of a process, entering and leaving,
the steps ended by hand, pausing, and the figures measured outside the trace.

`Tracer` is made of three parts, each in its own module: tracer.recording.start.TraceStart (the state made at entry),
tracer.recording.row.RowMaker (the row each op becomes: the hot path) and tracer.recording.parts.TraceParts (the parts
written and the run metadata they carry). The dispatch mode that calls `Tracer._record` for every op is in
tracer.recording.dispatch. `Tracer` composes tracer.recording.hooks.Hooks (what recording puts on and takes off),
tracer.store.trace_output.TraceOutput (its parts), tracer.recording.optimizer_state.OptimizerState (the roles the
training loop brings) and tracer.recording.python_collector.PythonCollector."""

import math
import os
import sys
import threading
import uuid

import torch

from tracer.errors import TraceError
from tracer.native.loader import wanted as wanted_collector
from tracer.recording import distributed
from tracer.recording.attribution import NAMED_PER_ENGINE_RUN
from tracer.recording.compiled import compiled_original, unwrap
from tracer.recording.dispatch import make_inert
from tracer.recording.meta_attention import META_ATTENTION
from tracer.recording.parts import TraceParts
from tracer.recording.python_collector import PythonCollector
from tracer.recording.row import RowMaker
from tracer.recording.signals import unsafe
from tracer.recording.start import TraceStart
from tracer.recording.timing import check_timing
from tracer.safety import describe_exception, interrupts_deferred, warn
from tracer.schema import MAX_TOKENS, MIN_STEP_TIME_S, is_unicode
from tracer.store.trace_output import TraceOutput
from tracer.store.writer import PartWriter, prepare_directory, release_directory


class Tracer(TraceStart, RowMaker, TraceParts):
    """Trace every aten op run inside `with Tracer(path): ...` to a Parquet trace at `path`.

    path       where the trace goes (str, bytes or os.PathLike): a directory of Parquet parts, which
               `pandas.read_parquet(path)` reads as one table. Its parent
               directory must exist. An earlier trace at `path` is replaced.
               Under a process group or torchrun, each rank writes `path/rank=R`.
    model      optional nn.Module: names modules (the root by its class name,
               children by their dotted path) and records parameter counts and
               the storage ids of parameters.
    tokens     optional tokens per training step (for the 6·N·T accounting).
    run_name   optional label for reports; default: the trace's file name.
    flush_rows rows per Parquet part. Memory held by the tracer stays bounded
               whatever the rows: a part is written when its rows reach flush_rows
               or their integers take flush_rows KiB (tracer.store.row_buffer.ROW_VALUES: wide
               rows, such as a torch.cat of 1,000 tensors, make smaller parts; the
               buffers' arrays reserve up to twice that, or 8 KiB each), and the
               small parts kept for merging take at most 2 MiB
               (tracer.store.small_parts.SmallParts.MAX_BYTES).
    timing     "events" (default: CUDA events on CUDA, resolved at each flush with
               one synchronise; perf_counter_ns elsewhere), "sync" (synchronise
               around every op on CUDA) or "off" (duration_ns 0, busy_ns null).
               See tracer.recording.timing.
    meta_attention "fused" (default): with a model on the meta device,
               scaled_dot_product_attention runs the fused kernel a GPU would
               choose (its meta implementation) instead of the math path;
               "math" keeps the math path. See tracer.recording.meta_attention.

    A step begins with the first forward work after an optimizer step or `step()`
    (tracer.recording.steps); only the thread that entered the Tracer is traced.
    One Tracer is active per process: entering a second one, from any thread, while
    one is active raises TraceError (the check and the claim are one step under a lock).
    A forked child (os.fork, DataLoader workers) records nothing and writes nothing: its
    copy of the Tracer goes inert at the fork.
    The tracer keeps no tensor alive: it holds storages through weak references.
    """

    _active = None  # the Tracer inside its with block, claimed under _claim
    _claim = threading.Lock()

    def __init__(
        self, path, *, model=None, tokens=None, run_name=None, flush_rows=16384, timing="events", meta_attention="fused"
    ):
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TraceError(f"Tracer: path must be a str, bytes or os.PathLike, got {type(path).__name__}")
        if not os.fspath(path):  # '' would be the working directory itself
            raise TraceError("Tracer: path is '', expected the directory to write the trace in, e.g. 'runs/step'")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TraceError(f"Tracer: model must be a torch.nn.Module or None, got {type(model).__name__}")
        if tokens is not None and (
            not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 < tokens <= MAX_TOKENS
        ):
            raise TraceError(f"Tracer: tokens must be an int from 1 to 2**53 (tokens per step) or None, got {tokens!r}")
        if run_name is not None and not isinstance(run_name, str):
            raise TraceError(f"Tracer: run_name must be a str or None, got {type(run_name).__name__}")
        if run_name is not None and not is_unicode(run_name):  # a lone surrogate (os.fsdecode of a Latin-1 name)
            raise TraceError(f"Tracer: run_name must be valid Unicode text (encodable as UTF-8), got {run_name!r}")
        if not isinstance(flush_rows, int) or isinstance(flush_rows, bool) or flush_rows <= 0:
            raise TraceError(f"Tracer: flush_rows must be a positive int, got {flush_rows!r}")
        if meta_attention not in META_ATTENTION:
            raise TraceError(
                f"Tracer: meta_attention must be one of {', '.join(map(repr, META_ATTENTION))}, got {meta_attention!r}"
            )
        self.meta_attention = meta_attention
        wanted_collector()  # OPTRACE_COLLECTOR, when set, names a collector (tracer.native.loader)
        self.path = os.path.abspath(os.fsdecode(path))  # a path that is not UTF-8 is refused at entry (directory.probe)
        self.model = unwrap(model) if model is not None else None  # a torch.compile wrapper: its original
        self._model_compiled = model is not None and compiled_original(model) is not None
        self.tokens = tokens
        self.run_name = run_name or os.path.splitext(os.path.basename(self.path))[0]
        self.flush_rows = flush_rows
        self.timing = check_timing(timing)
        self._writer = None
        self._closed = False
        self._exit_begun = False  # _exit began (it runs once)

    # context manager ---------------------------------------------------------
    def __enter__(self):
        started = False
        try:
            with interrupts_deferred():  # a Ctrl-C while starting is delivered once the trace is whole
                self._enter()
                started = True
            return self
        except BaseException as exc:  # that Ctrl-C (or one just after): the trace ends at once, before the block
            if started:
                self.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def _enter(self):
        with Tracer._claim:  # two threads entering at once: exactly one wins, the other is refused
            active = Tracer._active
            if active is self:
                raise TraceError(
                    f"this Tracer (writing {self.path!r}) is already active; it cannot be entered again inside its own with block"
                )
            if active is not None:
                raise TraceError(
                    f"another Tracer is already active (writing {active.path!r}); "
                    f"close it before starting one for {self.path!r}"
                )
            if self._writer is not None:
                raise TraceError(f"this Tracer (writing {self.path!r}) was already used; create a new one")
            Tracer._active = self
        try:
            self._pid = os.getpid()  # the writing process; a forked child never writes (_in_child)
            self.trace_id = uuid.uuid4().hex
            self._rank = distributed.rank_info()
            directory = self.path
            if self._rank is not None:  # one directory per rank: path/rank=R
                directory = distributed.rank_directory(self.path, self._rank["rank"], self._rank["world_size"])
            self._writer = PartWriter(prepare_directory(directory, self.trace_id), self.trace_id)
        except BaseException:
            Tracer._active = None
            raise
        try:
            self._start()
        except BaseException:  # nothing ran: remove what was installed, give the directory back
            self._undo_start()
            if Tracer._active is self:
                Tracer._active = None
            release_directory(self._writer.directory, self._writer.held)
            raise

    def _in_child(self):
        """Whether this is a forked copy of the process that entered the Tracer."""
        return os.getpid() != self._pid

    def __exit__(self, exc_type, exc, tb):
        """Close the trace; never raises (a failure is a warning and a fact in the metadata; a Ctrl-C while it
        closes comes after it). In a forked child it only leaves the block: the parent's trace and lock are not
        touched."""
        try:
            with interrupts_deferred():
                return self._exit(exc_type, exc, tb)
        except BaseException:  # a Ctrl-C just before the handler that holds it was in place: close, then let it through
            if not self._exit_begun:
                self._exit(exc_type, exc, tb)
            raise

    def _exit(self, exc_type, exc, tb):
        self._exit_begun = True
        try:
            try:
                if self._attention is not None:
                    self._meta["attention"] = self._attention.facts()
                if self._fused is not None and self._fused.facts() is not None:
                    self._meta["fused_standins"] = self._fused.facts()
            finally:
                self._hooks.remove()
                if self._hot is not None:
                    self._hot.close()  # its references go (a mode left on another thread runs the class's hook)
        finally:
            Tracer._active = None
        if self._in_child():
            self._closed = True
            self._term.remove()
            return False
        if exc is not None:
            self._meta["error"] = describe_exception(exc)  # cannot fail: the program gets its own exception
        try:
            self._close(complete=exc is None)
        except Exception as failure:
            warn(f"optrace: could not finish trace {self.path!r} ({describe_exception(failure)})")
        finally:
            self._term.remove()  # after the close: a SIGTERM until then still writes the rows first
        if self._attr.unnamed_backward:
            warn(
                f"optrace: {self._attr.unnamed_backward} backward ops of trace {self.path!r} have no module: an engine run "
                f"of more than {NAMED_PER_ENGINE_RUN:,} autograd nodes (naming more could overflow the stack when PyTorch frees the graph)"
            )
        if self._output.lost_rows:
            warn(
                f"optrace: trace {self.path!r} is incomplete: {self._output.lost_rows} rows lost to write errors "
                f"(first: {self._output.write_error})"
            )
        if self._term_pending:  # a SIGTERM that came while the trace closed: it does now what it does untraced
            self._term.due(sys._getframe(1))
        return False

    def step(self):
        """End the training step by hand: the next forward work begins a new one (the optimizer hooks
        do this on their own)."""
        self._roles.gradients(self.model.parameters() if self.model is not None else ())
        self._steps.mark()

    # pausing (tracer.metering.meter traces some steps of a run and meters the rest) -------------
    def _pause(self):
        """End the step, write the rows so far as a part and stop recording until `_resume`: the
        dispatch mode and every hook come off; the trace stays open and this Tracer the active one."""
        with interrupts_deferred():
            self.step()
            self._flush()
            self._hooks.remove()
        if self._term_pending:  # a SIGTERM held while the hooks came off (tracer.recording.signals)
            self._term.due(sys._getframe(1))

    def _resume(self):
        """Record again after `_pause`: the next forward work begins a new step."""
        with interrupts_deferred():
            self._hooks.install()
        if self._term_pending:  # a SIGTERM held while the hooks went on
            self._term.due(sys._getframe(1))

    @property
    def current_step(self):
        return self._attr.step if self._writer is not None else 0

    def set_step_time(self, timing):
        """Record the untraced step time used for MFU: seconds, or the dict `time_step` returns.

        Works inside the `with` block or after it (it then adds one empty part
        carrying the updated metadata)."""
        given = timing
        if isinstance(timing, (int, float)) and not isinstance(timing, bool):
            timing = {"median_s": float(timing)}
        median = timing.get("median_s") if isinstance(timing, dict) else None
        if not (isinstance(median, float) and math.isfinite(median) and median >= MIN_STEP_TIME_S):
            raise TraceError(
                f"set_step_time: expected finite seconds >= {MIN_STEP_TIME_S:g} (one ns) or the dict time_step returns, got {given!r}"
            )
        if self._writer is None:
            raise TraceError("set_step_time: the Tracer has not been entered yet")
        self._meta["step_time"] = timing
        self._late_update("set_step_time")

    def set_ceiling(self, ceiling):
        """Record the achievable matmul FLOP/s (the dict `matmul_ceiling` returns) for "of achievable" MFU."""
        self._set_measured("set_ceiling", "ceiling", ceiling, "flops_per_s", "matmul_ceiling")

    def set_bandwidth(self, bandwidth):
        """Record the achievable memory bytes/s (the dict `memory_bandwidth` returns): the roofline's memory roof on a CPU."""
        self._set_measured("set_bandwidth", "bandwidth", bandwidth, "bytes_per_s", "memory_bandwidth")

    def _set_measured(self, what, key, value, field, maker):
        """Put a measured figure (the dict `maker` returns, with a float `field`) in the metadata as `key`."""
        if not isinstance(value, dict) or not isinstance(value.get(field), float):
            raise TraceError(f"{what}: expected the dict {maker} returns, got {value!r}")
        if self._writer is None:
            raise TraceError(f"{what}: the Tracer has not been entered yet")
        self._meta[key] = value
        self._late_update(what)


def _after_fork_in_child():
    """A forked child (os.fork, a DataLoader worker, multiprocessing's fork and forkserver)
    gets a copy of the active Tracer: make it inert, so the child's ops are never recorded
    and no part, marker, lock or metadata write happens from it; and a fresh claim lock
    (another thread may have held it at the fork)."""
    Tracer._claim = threading.Lock()
    active = Tracer._active
    if active is not None and getattr(active, "_mode", None) is not None:
        make_inert(active._mode)


os.register_at_fork(after_in_child=_after_fork_in_child)


# a SIGTERM inside these is held until they are done: a row or a part is half made there, or the hooks half on or
# off (a Meter's pause and resume) (tracer.recording.signals)
unsafe(
    Tracer._record,
    PythonCollector.collect,
    Tracer._flush,
    Tracer._write,
    Tracer._close,
    Tracer._exit,
    Tracer._merge,
    Tracer._late_update,
    Tracer._pause,
    Tracer._resume,
    TraceOutput.write,
    TraceOutput.write_pending,
    TraceOutput.merge,
    TraceOutput.late_part,
)
