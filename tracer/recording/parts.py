"""The parts a trace writes: `TraceParts`, a part of tracer.recording.mode.Tracer.

`_flush` writes the rows buffered so far as one Parquet part (tracer.store.trace_output.TraceOutput) with the run
metadata as it stands (`_metadata`), once their step numbers are final, their times resolved and the collectives'
completions applied; `_close` notes the run's end (its steps, gradients' roles, memory, end time, compiled code run
eagerly, process groups), writes the last part and merges the small ones; `_facts` is what the marker keeps when
every part write fails; `_late_update` adds one empty part carrying metadata set after the `with` block.
"""

import sys

from tracer.device import cuda_memory
from tracer.recording import distributed
from tracer.recording.metadata import now
from tracer.store.writer import RowBuffer


class TraceParts:
    """A Tracer's parts and the run metadata they carry (see the module's docstring)."""

    def _late_update(self, what):
        """After the `with` block, add one empty part carrying the updated metadata, if the trace
        at the path is still this one; never raises into the program (a failure is a warning)."""
        if not self._closed or self._in_child():
            return
        if self._output.late_part(what, self._metadata, self._facts) and self._term_pending:  # a SIGTERM held meanwhile
            self._term.due(sys._getframe(1))

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
        meta["untraced_optimizer_steps"] = self._attr.untraced_optimizer_steps  # tracer.recording.optimizer_hooks
        meta["optimizer_params"] = sum(self._attr.updated.values())  # the parameter elements optimizer steps updated
        meta["cycles_without_step"] = self._steps.cycles_without_step()  # tracer.recording.steps
        meta["optimizer_state_found_late"] = self._optimizers.found_late
        meta["collectives_untimed"] = self._completions.untimed  # (a flush adds those its rows' completions found)
        regions = self._eager.facts()  # compiled regions run eagerly so far (tracer.recording.compiled EagerCompiled)
        if regions is not None:
            meta["compiled_regions_eager"] = regions
        dtypes = self._writer.names["dtype"].names  # bytes per element of every dtype recorded, parameters' too
        meta["dtype_bytes"] = {
            **meta.get("dtype_bytes", {}),
            **{dtypes[i]: n for i, n in self._writer.itemsize.items()},
        }
        return meta
