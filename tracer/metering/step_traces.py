"""Which trace serves each step of a metered run: `StepTraces`, a part of tracer.metering.meter.Meter.

`_end_step` puts each step ended by `Meter.step` in the per-step table (its time, tokens, the trace whose FLOPs serve
it, whether it was traced, the scale of an estimate) and decides what comes next: a step whose signature (the root's
inputs, graph nodes, grad modes, module calls without grad, optimizer steps) was traced before reuses that trace; a
new signature has the next step traced, up to `max_traces` traced steps and 3 failed reads; past that cap its FLOPs are
estimated from the nearest traced signature (`_estimate`), as are, at close, the steps whose signature was never
traced (`_estimate_pending`). Compiled code seen in the steps takes the node count and module calls out of the
signatures (`_forget_nodes`). The table (`Meter.table`) goes into the run metadata at each doubling of the steps
(`_write`) and at a SIGTERM (`_table_at_signal`).
"""

from tracer.metering.flops import input_size, nodes_made, settled

_MAX_TRACE_FAILURES = 3  # traced steps whose FLOPs could not be read before the meter stops re-tracing


class StepTraces:
    """Which trace serves each of a Meter's steps (see the module's docstring)."""

    def _end_step(self, seconds, tokens, now):
        nodes = nodes_made() - self._nodes
        index = len(self._steps["step"])
        traced, scale, trace = self._tracing, None, None
        self._reclock = traced
        if traced:
            self._traced_steps += 1
            try:
                trace = self._read_trace()  # pauses the tracer: a jagged input's offsets are read untraced below
            except Exception as exc:  # the step stays in the table without FLOPs; its signature may be traced again
                self._failed(exc)
                self._trace_failures += 1
        if self._compiled():  # a traced step runs compiled code eagerly: its graph nodes are not the compiled step's
            nodes = None
            self._forget_nodes()
        calls = None if nodes is None else tuple(self._calls.items())  # compiled: the untraced steps count no calls
        ran = (settled(self._inputs), nodes, tuple(self._grads), calls, self._optimizer_steps)
        if trace is not None:
            self._known[ran] = trace
            for k in self._pending.pop(ran, ()):  # earlier steps of this signature get its FLOPs
                self._steps["trace"][k] = trace
        elif not traced:
            trace = self._known.get(ran)
        can_trace = self._can_trace()
        new = not traced and trace is None
        if new and can_trace:
            self._pending.setdefault(ran, []).append(index)
        elif new:  # past the cap: an unseen signature is not traced, its FLOPs are estimated
            trace, scale = self._estimate(ran)
        for key, value in zip(self._steps, (index, seconds, tokens, -1 if trace is None else trace, traced, scale)):
            self._steps[key].append(value)
        # the first step also makes what the later ones reuse (SGD's momentum buffer, gradients to add into,
        # lazy modules): without warmup= the second step is traced too, and its trace serves the signature
        # (it replaces step 0's in _known; step 0 keeps its own). After a warm-up the first trace is alone
        again = traced and index == 0 and not self.warmup
        if (new or again) and can_trace and index + 1 >= self.warmup:
            self._reclock = True  # new: trace the next step
            if self._begins:  # at the next begin()
                self._retrace = True
            else:
                self._resume()
                self._tracing = True
        elif not traced and index + 1 >= self._next_write:  # steps 0..index in the table: written at least half
            self._next_write = 2 * (index + 1)
            self._reclock = True
            self._write()
        return self.figures(index)

    def _compiled(self):
        """Whether compiled code (torch.compile) runs in the steps: a compiled model=, or a compiled module or function
        a traced step ran (eagerly: tracer.recording.compiled EagerCompiled). An untraced step runs it compiled, a few graph nodes (one per compiled graph) where the traced
        step, run eagerly, made one per op, and it runs no module hook inside the compiled code: the signature then
        leaves the node count and the module calls out (the root's inputs and grad modes stay)."""
        tracer = self._tracer
        return tracer._model_compiled or tracer._attr.names.compiled_seen or tracer._eager.calls > 0

    def _forget_nodes(self):
        """The signatures noted so far without their node count and module calls (once compiled code is seen)."""
        if self._nodes_forgotten:
            return
        self._nodes_forgotten = True
        for table in (self._known, self._pending):
            merged = {}
            for (inputs, _, grads, _, stepped), value in table.items():
                key = (inputs, None, grads, None, stepped)
                if table is self._pending:
                    merged.setdefault(key, []).extend(value)
                else:
                    merged.setdefault(key, value)
            table.clear()
            table.update(merged)

    def _can_trace(self):
        return self._traced_steps < self.max_traces and self._trace_failures < _MAX_TRACE_FAILURES

    def _estimate(self, ran):
        """(trace, scale) for a signature never traced: the traced one with the same graph nodes, grad modes and
        input tensors' ranks and dtypes, nearest in input elements, its FLOPs scaled by the ratio of input
        elements (padded tokens, for token inputs); (-1, None) when none fits."""
        size, form = input_size(ran[0])
        best = None
        for (inputs, *rest), trace in self._known.items():
            known, known_form = input_size(inputs)
            if rest != list(ran[1:]) or known_form != form or not known:
                continue
            if best is None or abs(known - size) < abs(best[0] - size):  # the first traced wins a tie
                best = (known, trace)
        return (-1, None) if best is None else (best[1], size / best[0])

    def _estimate_pending(self):
        """At close: the steps whose signature was never traced get estimates, as past the cap."""
        try:
            for ran, steps in self._pending.items():
                trace, scale = self._estimate(ran)
                for k in steps:
                    self._steps["trace"][k], self._steps["scale"][k] = trace, scale
        except Exception as exc:
            self._failed(exc)

    def _table_at_signal(self):
        if not self._closed:
            self._tracer._meta["meter"] = self.table()

    def _write(self):
        """Write the table now (one metadata-only part)."""
        self._tracer._meta["meter"] = self.table()
        self._tracer._flush()
