"""The public `Tracer` context manager: set-up, the row each op becomes, flushing and closing.

The dispatch mode that calls `Tracer._record` for every op is in tracer.recording.dispatch. `Tracer` composes
tracer.recording.hooks.Hooks (what recording puts on and takes off), tracer.store.trace_output.TraceOutput (its parts),
tracer.recording.optimizer_state.OptimizerState (the roles the training loop brings) and tracer.recording.python_collector.PythonCollector."""

import math
import os
import sys
import threading
import time
import uuid

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as _mode_stack

from tracer.device import cuda_memory, device_info, is_fake
from tracer.errors import TraceError
from tracer.flops.layouts import STRIDED, odd_flops
from tracer.native.loader import choose
from tracer.native.loader import wanted as wanted_collector
from tracer.recording import collectives, distributed
from tracer.recording.attribution import NAMED_PER_ENGINE_RUN, Attribution
from tracer.recording.compiled import compiled_original, unwrap
from tracer.recording.dispatch import _TraceMode, compiled_spec, make_inert
from tracer.recording.hooks import Hooks
from tracer.recording.meta_attention import META_ATTENTION, MetaAttention
from tracer.recording.meta_fused import MetaFused, fused_key
from tracer.recording.metadata import Roles, dtype_name, now, register_at_entry, run_metadata
from tracer.recording.optimizer_state import OptimizerState
from tracer.recording.python_collector import PythonCollector
from tracer.recording.signals import TermHandler, unsafe
from tracer.recording.storage import StorageTable
from tracer.recording.timing import check_timing, make_timer
from tracer.safety import describe_exception, interrupts_deferred, warn
from tracer.schema import CAUSAL_NONE, INT64_MAX, MAX_TOKENS, MIN_STEP_TIME_S, NO_VALUE, FlopBasis, GradMode, is_unicode
from tracer.store.trace_output import TraceOutput
from tracer.store.writer import (
    FIELD,
    PER_OUTPUT_ELEMENT,
    ROW_VALUES,
    ROW_WIDTH,
    PartWriter,
    RowBuffer,
    extend,
    prepare_directory,
    release_directory,
)

_perf_ns = time.perf_counter_ns
_PER_ELEMENT, _FORMULA, _DETAILED = int(FlopBasis.PER_OUTPUT_ELEMENT), int(FlopBasis.FORMULA), int(FlopBasis.DETAILED)
_grad_enabled, _inference_mode = torch.is_grad_enabled, torch.is_inference_mode_enabled
_GRAD, _NO_GRAD, _INFERENCE_MODE = int(GradMode.GRAD), int(GradMode.NO_GRAD), int(GradMode.INFERENCE_MODE)


class Tracer:
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
               or their integers take flush_rows KiB (tracer.store.writer.ROW_VALUES: wide
               rows, such as a torch.cat of 1,000 tensors, make smaller parts; the
               buffers' arrays reserve up to twice that, or 8 KiB each), and the
               small parts kept for merging take at most 2 MiB
               (tracer.store.writer.SmallParts.MAX_BYTES).
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
            release_directory(self._writer.directory, self._writer.held)
            raise

    def _in_child(self):
        """Whether this is a forked copy of the process that entered the Tracer."""
        return os.getpid() != self._pid

    def _undo_start(self):
        """Remove the global hooks, the SIGTERM handler and the active mark a failed `_start` may have left."""
        term = getattr(self, "_term", None)
        if term is not None:
            term.remove()
        hot = getattr(self, "_hot", None)
        if hot is not None:
            hot.close()
        for part in ("_attr", "_unsharded", "_dynamo", "_eager"):
            installed = getattr(self, part, None)
            if installed is not None:
                try:
                    installed.remove()
                except Exception:  # removing is best effort; the original error is what the user sees
                    pass
        if Tracer._active is self:
            Tracer._active = None

    def _start(self):
        self._term = TermHandler(self)
        self._term_pending = False  # a SIGTERM held until a row or part is whole (TermHandler.due)
        self._completions = collectives.Completions(FIELD["duration_ns"], FIELD["busy_ns"], ROW_WIDTH)
        self._storages = StorageTable()
        self._rows = RowBuffer()
        self._dtype_ids = {}  # torch.dtype -> dtype name id
        self._device_ids = {}  # torch.device -> device name id
        self._device_keys = {}  # the compiled collector's device key (type, index) -> device name id
        native, self._collector_facts = choose()
        self._native = native
        self._hot = None  # the compiled dispatch hook's state (tracer/native/_dispatch.cpp), made once the rest is
        self._collect = native.collect if native is not None else None
        self._extend = (
            native.extend if native is not None else extend
        )  # buffer.extend(values), without array's per-item parsing
        self._python = PythonCollector(self._storages, self._dtype_ids, self._new_dtype, self._writer.names["layout"])
        self._module_ids = {}  # module name -> module name id
        self._writer.clock_offset_ns = time.time_ns() - _perf_ns()
        self._flush_at = self.flush_rows * ROW_WIDTH
        self._flush_values = self.flush_rows * ROW_VALUES  # the integers of all its buffers (RowBuffer.values)
        self._errors = 0
        self._device = None
        self._timer = make_timer(self.timing, None)
        self._roles = Roles(self._storages.known, self._storages.size)
        self._output = TraceOutput(self._writer, self._roles, self._in_child)  # the parts, written or lost
        self._meta = run_metadata(self.run_name, self.tokens, self.model, self._storages.id_of)
        self._meta["trace_id"] = self.trace_id
        self._meta["collector"] = self._collector_facts  # which collector read the tensors (tracer.native.loader)
        st = self._storages  # what tracer/native/_collector.cpp reads, in its order (its enum of ctx)
        self._collect_ctx = (
            st._by_cdata,
            st.size,
            st._refs,
            st._note_free,
            st.hollow,
            st.regrow,
            self._dtype_ids,
            self._new_dtype,
            st,
        )
        if self._rank is not None:
            self._meta.update(self._rank, process_groups=distributed.process_groups())
        self._unsharded = distributed.UnshardedParameters(
            self.model, self._storages, self._meta.get("parameters"), self._meta.setdefault("unsharded_parameters", {})
        )
        found, param_ids, params = register_at_entry(
            self.model,
            self._storages,
            self._roles,
            self._unsharded,
            lambda: self._rows.first_seq + len(self._rows),
            lambda exc: self._record_failed("the storages alive at entry", exc),
        )
        self._optimizers = OptimizerState(
            self.model, self._storages, self._roles, {id(o) for o in found} if found is not None else None, param_ids
        )
        try:  # registered above: their ids get the role "buffer" (reports/flops/roles.py: a weight times a buffer)
            for b in self.model.buffers() if self.model is not None else ():
                self._roles.add("buffer", b)
        except Exception as exc:
            self._record_failed("the model's buffers", exc)
        if params is None and self.model is not None:  # the walk at entry failed (counted): as before it, once more
            params = list(self.model.parameters())
        first = params[0] if params else None
        self._model_device = first is not None  # the model's device is the run's device
        if first is not None:
            self._first_device(first.device, first)
        self._mode = _TraceMode(self)
        on_meta = first is not None and first.device.type == "meta"
        self._attention = MetaAttention(fused=self.meta_attention == "fused") if on_meta else None
        key = fused_key(first, first is not None and is_fake(first))
        self._fused = MetaFused(key) if key is not None else None
        self._attr = Attribution(
            self.model,
            params=params,
            traced=lambda: self._mode in _mode_stack(),
            rows_so_far=lambda: len(self._rows),
            relabel=lambda first_row, step: self._rows.set_step(first_row, step),
            on_optimizer_start=self._optimizers.started,
            on_step_end=self._roles.optimizer_state,
            on_external_module=self._optimizers.external_module,
            on_error=lambda exc: self._record_failed("a module or optimizer hook", exc),
        )
        self._steps = self._attr.steps
        self._hooks = Hooks(
            self.path,
            self._mode,
            self._attr,
            self._unsharded,
            self._attention,
            self._record_failed,
            self._given_back,
            fused=self._fused,
        )
        self._dynamo, self._eager = (
            self._hooks.dynamo,
            self._hooks.eager,
        )  # the compiled code's (tracer.recording.compiled)
        if (
            self._native is not None
        ):  # the common op recorded in C++, with no Python frame (tracer/native/_dispatch.cpp)
            self._hot = self._native.Dispatch(self, _TraceMode.__torch_dispatch__, compiled_spec())
            self._mode.use_compiled(self._hot, self._native.dispatch_for(self._mode))
        self._hooks.install()
        self._term.install()  # SIGTERM: the rows so far written first (tracer.recording.signals)

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

    def _given_back(self, given):
        """Compiled codes given back to torch.compile at the hooks' removal (tracer.recording.hooks.Hooks)."""
        self._meta["compiled_codes_given_back"] = self._meta.get("compiled_codes_given_back", 0) + given

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

    def _late_update(self, what):
        """After the `with` block, add one empty part carrying the updated metadata, if the trace
        at the path is still this one; never raises into the program (a failure is a warning)."""
        if not self._closed or self._in_child():
            return
        if self._output.late_part(what, self._metadata, self._facts) and self._term_pending:  # a SIGTERM held meanwhile
            self._term.due(sys._getframe(1))

    # the hot path ------------------------------------------------------------------
    def _record(self, info, args, kwargs, out, start, duration, wrapped_grad=False):
        rows = self._rows
        storages = self._storages
        try:
            collective = info.collective
            collected = None
            if self._collect is not None and collective is None:  # the compiled collector (tracer.native.loader)
                written = info.written(args, kwargs) if info.written_positions else None
                collected = self._collect(self._collect_ctx, args, kwargs, out, written, rows.sides)
            if collected is not None:
                ins, outs, registered, device_key, inplace_bytes, out_bytes = collected
                layout = 0
            else:  # the Python path: rare tensors (subclasses, sparse, nested), collectives, or no compiled collector
                ins, outs, registered, layout = self._python.collect(info, args, kwargs, out, rows.sides)
                device_key = None
                inplace_bytes = out_bytes = 0
                if info.written_positions:
                    for t, is_out in info.written(args, kwargs):
                        if t.layout is not STRIDED or t.is_nested:
                            continue
                        n = t.numel() * t.element_size()
                        inplace_bytes += n
                        if is_out:  # out= tensors are written, not read
                            out_bytes += n
                        storages.regrow(t.untyped_storage())
            allocated = storages.registered_bytes - registered
            bound, n_groups = 0, NO_VALUE
            basis = info.basis
            kind = info.kind_id
            if basis == _FORMULA and not layout:
                flops = info.rule.count(args, kwargs, out)
                if flops > INT64_MAX:  # a Python int past int64: stored as the largest int64, flagged a bound
                    flops, bound = INT64_MAX, 1
            elif basis == _DETAILED or layout:  # a FlopCount: FLOPs, bound, group sizes (grouped mm, nested)
                if layout:
                    count, kind_name = odd_flops(info, args, kwargs, out, ins, outs)
                    kind = self._writer.names["kind"].id(kind_name)
                else:
                    count = info.rule.count(args, kwargs, out)
                flops, bound = min(count.flops, INT64_MAX), int(count.bound or count.flops > INT64_MAX)
                if count.group_sizes is not None:
                    n_groups = len(count.group_sizes)
                    rows.groups.extend(count.group_sizes)
            else:
                flops = PER_OUTPUT_ELEMENT if basis == _PER_ELEMENT else 0
            causal = CAUSAL_NONE if info.rule.causal is None else int(bool(info.rule.causal(args, kwargs)))
            phase, module, recompute = self._attr.where(ins, outs, info, args, kwargs, wrapped_grad)
            module_id = self._module_ids.get(module)
            if module_id is None:
                module_id = self._new_module(module)
            first = ins[0] if ins else outs[0] if outs else None  # the row's device is its first tensor's
            device_id = self._device_keys.get(device_key)  # None: the Python path
            if device_id is None:
                device_id = self._device_of(first, device_key)
            comm_bytes = group_size = NO_VALUE
            group_id = 0
            if collective is not None:  # always the Python path
                device = first.device if first is not None else None
                comm_bytes, group_size, group_id = self._collective(
                    collective, args, kwargs, out, outs, start, duration, device
                )
            freed = storages.freed
            n_freed = len(freed)
            if n_freed:  # before the integers that count them: a rollback drops them with the row
                rows.freed.extend(freed)
            # the row's integers, in writer.ROW_FIELDS order, packed whole or not at all: a value outside
            # int64 (a formula's count below -2**63) fails here, and the row is rolled back
            self._extend(
                rows.ints, self._steps.step, info.name_id, phase, module_id, device_id, kind,
                info.inplace, causal, flops, allocated, storages.live_bytes, inplace_bytes, out_bytes, duration,
                len(ins), len(outs), n_freed,
                recompute, start, duration, layout, comm_bytes, group_size, group_id,
                bound, n_groups, _GRAD if _grad_enabled() else _INFERENCE_MODE if _inference_mode() else _NO_GRAD,
            )  # fmt: skip
        except BaseException:
            rows.rollback()
            raise

        # the row is whole: a Ctrl-C from here on leaves it so
        if n_freed:
            freed.clear()
        timer = self._timer
        if timer.binds:  # CUDA events, or no times: the row's time is the timer's (tracer.recording.timing)
            timer.bind(rows)
        if len(rows.ints) >= self._flush_at or rows.values() >= self._flush_values:
            self._flush()
        if self._term_pending:  # the row is whole: a SIGTERM held meanwhile goes on (tracer.recording.signals)
            self._term.due(sys._getframe(1))

    def _device_of(self, first, device_key=None):
        """The device name id of a row whose first tensor is `first` (None: no tensor), noted under the compiled
        collector's `device_key` when given."""
        device = first.device if first is not None else None
        device_id = self._device_ids.get(device)
        if device_id is None:
            device_id = self._new_device(device, first)
        if device_key is not None:
            self._device_keys[device_key] = device_id
        return device_id

    def _collective(self, op, args, kwargs, out, outs, start, duration, device):
        """(comm_bytes, group_size, process-group name id) of a collective row; tracks its completion."""
        comm_bytes, group_size, group = op.describe(args, kwargs)
        self._unsharded.sync()  # FSDP2 resharded or unsharded since the last one
        seq = self._rows.first_seq + len(self._rows)
        self._completions.launched(seq, start, start + duration, op, out, outs, device)
        return comm_bytes, group_size, self._writer.names["process_group"].id(group)

    def _new_dtype(self, dtype):
        dtype_id = self._dtype_ids[dtype] = self._writer.names["dtype"].id(dtype_name(dtype))
        self._writer.itemsize[dtype_id] = dtype.itemsize
        return dtype_id

    def _new_module(self, name):
        module_id = self._module_ids[name] = self._writer.names["module"].id(name)
        return module_id

    def _new_device(self, device, tensor=None):
        if device is None:
            name = ""
        else:
            name = str(device)
            if self._device is None or (not self._model_device and self._device.type == "cpu" != device.type):
                self._first_device(device, tensor)  # a model's device, else the first device that is not the CPU
        device_id = self._device_ids[device] = self._writer.names["device"].id(name)
        return device_id

    def _signal_due(self):
        """The compiled hook's call once the row it made while a SIGTERM came is whole (tracer.recording.signals)."""
        self._term.due(sys._getframe(1))

    def _record_failed(self, op, exc):
        self._errors += 1
        if self._errors == 1:
            warn(f"optrace: could not record {op} ({describe_exception(exc)}); the op ran normally")
        if self._term_pending:  # a SIGTERM held while the failed row was made
            self._term.due(sys._getframe(1))

    # the rest ----------------------------------------------------------------------
    def _first_device(self, device, tensor=None):
        self._device = device
        self._timer = make_timer(self.timing, device)
        if is_fake(tensor):  # no device ran the ops: reports give no peak, so no MFU; not the host's name either
            self._meta["device"] = {
                "type": device.type,
                "name": f"{device.type} (FakeTensorMode: no device ran the ops)",
                "fake": True,
            }
            return
        self._meta["device"] = device_info(device)
        memory = cuda_memory(device)
        if memory is not None:
            self._meta["cuda_memory"] = {"start": memory}

    def _flush(self):
        self._steps.settle()  # the rows are about to be written: their step numbers become final
        self._timer.resolve(self._rows)
        meta = self._metadata()
        rows, self._rows = self._rows, RowBuffer(self._rows.first_seq + len(self._rows))
        self._completions.apply(rows)  # collectives end when their work completed, not at launch
        meta["collectives_untimed"] = self._completions.untimed
        written = self._write(rows, meta)
        if self._term_pending:  # the part is whole: a SIGTERM held meanwhile goes on (tracer.recording.signals)
            self._term.due(sys._getframe(1))
        return written

    def _write(self, rows, meta):
        """Write one part (TraceOutput.write): during the run, the small parts due are merged after it."""
        return self._output.write(rows, meta, roll=not self._closed)

    def _close(self, complete):
        self._steps.finish(self._attr.trained)
        if self.model is not None:
            self._roles.gradients(self.model.parameters())
        memory = cuda_memory(self._device)
        if memory is not None:
            self._meta.setdefault("cuda_memory", {})["end"] = memory
        self._meta["end_time"] = now()
        if (
            self._model_compiled
            or self._attr.names.compiled_seen
            or self._eager.calls
            or self._meta.get("compiled_codes_given_back")
        ):
            self._meta["compiled_ran_eagerly"] = True
        groups = distributed.process_groups() if self._rank is not None else None
        if groups:  # groups made while tracing (FSDP2's, DeviceMesh's); none if destroyed inside the block
            self._meta["process_groups"] = groups
        self._closed = True
        try:
            self._output.write_pending()  # parts a KeyboardInterrupt stopped mid-write
            self._meta["complete"] = complete and not self._output.lost_rows and "signal" not in self._meta
            rows = self._rows
            if not self._flush() and len(rows):  # the last rows are lost: write the facts alone, if space allows
                self._meta["complete"] = False
                self._write(RowBuffer(rows.first_seq + len(rows)), self._metadata())
            self._merge()
        finally:
            self._storages.clear()
            self._writer.close(self._facts())

    def _merge(self, merge=None):
        """Merge the small parts (TraceOutput.merge): `merge`, else all of them into one at close."""
        self._output.merge(merge)

    def _facts(self):
        """What the marker keeps when every part write fails: enough to report the damage."""
        return {
            "format": "optrace",
            "trace_id": self.trace_id,
            "complete": bool(self._meta.get("complete")),
            "rows": self._rows.first_seq + len(self._rows),
            "lost_rows": self._output.lost_rows,
            "record_errors": self._errors,
            "write_error": self._output.write_error,
            "parts": self._writer.parts,
        }

    def _metadata(self):
        meta = dict(self._meta)
        meta["rows"] = self._writer.rows + len(self._rows)
        meta["record_errors"] = self._errors
        meta["lost_rows"] = self._output.lost_rows
        meta["write_error"] = self._output.write_error
        meta["timing"] = {"mode": self._timer.name, "unresolved_rows": getattr(self._timer, "failed", 0)}
        if self._hot is not None:  # how many rows the compiled hook wrote itself; Python the others
            meta["collector"] = {**self._collector_facts, "compiled_rows": self._hot.recorded()}
        meta["storage_roles"] = self._roles.take()
        meta["backward_unnamed_rows"] = self._attr.unnamed_backward
        meta["untraced_optimizer_steps"] = self._attr.untraced_optimizer_steps  # tracer.recording.attribution
        meta["optimizer_params"] = sum(self._attr.updated.values())  # the parameter elements optimizer steps updated
        meta["cycles_without_step"] = self._steps.cycles_without_step()  # tracer.recording.steps
        meta["optimizer_state_found_late"] = self._optimizers.found_late
        regions = self._eager.facts()  # compiled regions run eagerly so far (tracer.recording.compiled EagerCompiled)
        if regions is not None:
            meta["compiled_regions_eager"] = regions
        dtypes = self._writer.names["dtype"].names  # bytes per element of every dtype recorded, parameters' too
        meta["dtype_bytes"] = {
            **meta.get("dtype_bytes", {}),
            **{dtypes[i]: n for i, n in self._writer.itemsize.items()},
        }
        return meta


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
