"""The optimizer step hooks of tracer.recording.attribution.Attribution: `OptimizerHooks`, a part of it.

The global optimizer step hooks. An optimizer step inside another's (a wrapper, ZeroRedundancyOptimizer) is part of
the outer one: one optimizer step, and the wrapper's work after its inner step is phase optimizer. A step whose hooks
fired with no op recorded between them (given parameters with gradients) ran untraced: compiled before the trace, its
kernels bypass the dispatcher (`untraced_optimizer_steps`). The parameters an innermost step updated are counted
(`updated`). The state is the Attribution's own (its instance dict, which the compiled hook reads:
tracer/native/_where.cpp).

Known limitations:
  * The closure given to the outermost `Optimizer.step` is passed on wrapped (the
    step pre-hook's (args, kwargs) result), so that its ops outside any module are
    told from the update's: the optimizer and later pre-hooks see the wrapper, which
    calls the closure with the same arguments and returns what it returns.
  * A wrapper that is no `Optimizer` (a plain class, no step hooks of its own)
    is seen only through its inner step: of its work after that step, only the
    ops that write a parameter have phase optimizer (a Lookahead's slow-weight
    arithmetic before its copy into the parameters stays other). An Optimizer
    subclass that skips `Optimizer.__init__` (timm's Lookahead) has no hooks
    until its inherited `zero_grad` patches its class; until then its `step()`
    is found as the caller of the inner step (`steps.UnhookedWrapper`), and its
    work after the inner step, while it runs, is optimizer work too.
"""

from tracer.recording.distributed import local_tensor


class OptimizerHooks:
    """The optimizer step pre and post hooks of an Attribution (see the module's docstring)."""

    def _optimizer_pre(self, optimizer, args, kwargs):
        if not self.traced():
            return
        self._note_updating(optimizer)
        if not self._running.enter(
            levels=2
        ):  # a wrapper's inner step (or a subclass's super().step()): part of the outer one
            return
        self._wrapper.enter(optimizer, levels=2)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._params.note_optimizer(optimizer, params)
        self._optimizer_ops = 0
        self._expect_ops = any(p.grad is not None for p in params)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args: (optimizer, closure)
        self._closure = callable(closure)
        if self._closure and self.steps.forward_work():  # it will run the forward: Lightning, LBFGS
            self._step_began()
        elif not self._closure:  # no module runs now: drop what a BaseException (no always_call) left
            self.forward_stack.clear()
        self.in_optimizer = True
        self.steps.optimizer_start(optimizer, params)
        if self._on_optimizer_start is not None:
            self._on_optimizer_start(optimizer)
        if self._closure:
            return self._wrap_closure(closure, args, kwargs)
        return None

    def _wrap_closure(self, closure, args, kwargs):
        """(args, kwargs) with the closure replaced by one that marks while it runs (the pre-hook's result)."""

        def closure_run(*a, **kw):
            self._in_closure += 1
            try:
                return closure(*a, **kw)
            finally:
                self._in_closure = max(0, self._in_closure - 1)

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_run}
        return (args[0], closure_run, *args[2:]), kwargs

    def _end_raised_steps(self):
        """A module runs inside an optimizer step with no closure: when no step's hook wrapper is
        still on the stack, the steps raised (no post hook ran) and are over."""
        if not self._running.over(levels=1):
            return
        self._running.clear()
        self._updating.clear()
        self.in_optimizer = False
        self._in_closure = 0
        self.steps.optimizer_end()

    def _note_updating(self, optimizer):
        """Note the parameters with a gradient of a step beginning: what it updates, unless a step runs inside it (a
        wrapper's inner optimizer updates them: ZeroRedundancyOptimizer's `.optim` holds this rank's shard only)."""
        if self._updating:
            self._updating[-1][2] = True
        del self._updating[:-64]  # steps that raised before their post hook are never popped: keep it bounded
        params = {
            id(p): local_tensor(p).numel() for g in optimizer.param_groups for p in g["params"] if p.grad is not None
        }
        self._updating.append([id(optimizer), params, False])

    def _updated_by(self, optimizer):
        """A step ended: its parameters were updated, when no step ran inside it."""
        for i in range(len(self._updating) - 1, -1, -1):
            if self._updating[i][0] == id(optimizer):
                _, params, wrapped = self._updating[i]
                del self._updating[i:]
                if not wrapped:
                    self.updated.update(params)
                return

    def _optimizer_post(self, optimizer, args, kwargs):
        if not self.traced():
            return
        self._updated_by(optimizer)
        if self._on_step_end is not None:  # every step's state, a wrapper's inner one's too (ZeRO keeps it in .optim)
            self._on_step_end(optimizer)
        if not self._running.exit():  # a wrapper's inner step ended: the wrapper's step goes on
            return
        if self._expect_ops and not self._optimizer_ops:  # compiled before the trace: it bypassed the dispatcher
            self.untraced_optimizer_steps += 1
        self.in_optimizer = self._closure = False
        self._in_closure = 0
        self.steps.optimizer_end()
