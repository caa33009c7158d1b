"""The row each op becomes: `RowMaker`, a part of tracer.recording.mode.Tracer.

`_record` turns one op the dispatch mode ran (tracer.recording.dispatch) into one row of the trace's row buffers
(tracer.store.row_buffer.RowBuffer): its tensors (the compiled collector, or tracer.recording.python_collector for the rare
ones), FLOPs, phase, module and recompute flag (tracer.recording.attribution), device, a collective's bytes and
completion, and the storages freed, packed whole or rolled back; then the timer's bind, a flush once the buffers are
full, and a SIGTERM held meanwhile. The compiled dispatch hook (tracer/native/_dispatch.cpp) makes the common op's row
itself and calls the methods here for the rest (`_record`, `_new_module`, `_device_of`, `_record_failed`,
`_signal_due`): their names and the attributes they read are its interface. A bookkeeping failure is
`_record_failed`: a count and one warning, never the program's exception.
"""

import sys

import torch

from tracer.flops.layouts import STRIDED, odd_flops
from tracer.recording.metadata import dtype_name
from tracer.safety import describe_exception, warn
from tracer.schema import CAUSAL_NONE, INT64_MAX, NO_VALUE, FlopBasis, GradMode
from tracer.store.writer import PER_OUTPUT_ELEMENT

_PER_ELEMENT, _FORMULA, _DETAILED = int(FlopBasis.PER_OUTPUT_ELEMENT), int(FlopBasis.FORMULA), int(FlopBasis.DETAILED)
_grad_enabled, _inference_mode = torch.is_grad_enabled, torch.is_inference_mode_enabled
_GRAD, _NO_GRAD, _INFERENCE_MODE = int(GradMode.GRAD), int(GradMode.NO_GRAD), int(GradMode.INFERENCE_MODE)


class RowMaker:
    """A Tracer's rows, one per op, and the name ids they hold (see the module's docstring)."""

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
