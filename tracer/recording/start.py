"""What a trace holds while it runs, made when it is entered: `TraceStart`, a part of tracer.recording.mode.Tracer.

`_start` builds the trace's state on the Tracer itself, in the order its pieces need each other: the SIGTERM handler,
the storage table and row buffers, the collector (the compiled one, or tracer.recording.python_collector), the run
metadata and the storages alive at entry, attribution and steps (tracer.recording.attribution), the dispatch mode
(tracer.recording.dispatch) with the hooks that put it on (tracer.recording.hooks.Hooks), and the compiled dispatch
hook. The state is kept in the Tracer's instance dict, where the compiled hook (tracer/native/_dispatch.cpp) reads it.
`_undo_start` takes off what a failed start put on; `_first_device` makes a device the run's (its timer, its name and
memory in the run metadata).
"""

import time

from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as _mode_stack

from tracer.device import cuda_memory, device_info, is_fake
from tracer.native.loader import choose
from tracer.recording import collectives, distributed
from tracer.recording.attribution import Attribution
from tracer.recording.dispatch import _TraceMode, compiled_spec
from tracer.recording.hooks import Hooks
from tracer.recording.meta_attention import MetaAttention
from tracer.recording.meta_fused import MetaFused, fused_key
from tracer.recording.metadata import Roles, register_at_entry, run_metadata
from tracer.recording.optimizer_state import OptimizerState
from tracer.recording.python_collector import PythonCollector
from tracer.recording.signals import TermHandler
from tracer.recording.storage import StorageTable
from tracer.recording.timing import make_timer
from tracer.store.trace_output import TraceOutput
from tracer.store.writer import FIELD, ROW_VALUES, ROW_WIDTH, RowBuffer, extend

_perf_ns = time.perf_counter_ns


class TraceStart:
    """A Tracer's set-up at entry and its undoing (see the module's docstring)."""

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
        model = self.model  # its parameters and buffers walked once here, for everything below that reads them
        named = list(model.named_parameters()) if model is not None else []  # tied parameters once
        buffers = list(model.buffers()) if model is not None else []
        walked = [p for _, p in named]  # model.parameters(), as a list
        self._meta = run_metadata(self.run_name, self.tokens, model, self._storages.id_of, named, buffers)
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
            model,
            self._storages,
            self._meta.get("parameters"),
            self._meta.setdefault("unsharded_parameters", {}),
            walked,
        )
        found, param_ids, params = register_at_entry(
            self.model,
            self._storages,
            self._roles,
            self._unsharded,
            lambda: self._rows.first_seq + len(self._rows),
            lambda exc: self._record_failed("the storages alive at entry", exc),
            walked,
        )
        self._optimizers = OptimizerState(
            self.model, self._storages, self._roles, {id(o) for o in found} if found is not None else None, param_ids
        )
        try:  # registered above: their ids get the role "buffer" (reports.flops.roles.Roles: a weight times a buffer)
            for b in buffers:
                self._roles.add("buffer", b)
        except Exception as exc:
            self._record_failed("the model's buffers", exc)
        if params is None and self.model is not None:  # the walk at entry failed (counted): the parameters walked above
            params = walked
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

    def _given_back(self, given):
        """Compiled codes given back to torch.compile at the hooks' removal (tracer.recording.hooks.Hooks)."""
        self._meta["compiled_codes_given_back"] = self._meta.get("compiled_codes_given_back", 0) + given

    def _undo_start(self):
        """Remove the global hooks and the SIGTERM handler a failed `_start` may have left (`Tracer._enter` then gives
        up the active mark)."""
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
