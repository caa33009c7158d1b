"""Training steps: where one forward/backward/optimizer cycle of the traced thread ends.

A step begins with the first *forward work* after an optimizer step has run
(forward work: a module's forward outside the autograd engine, or an op outside
any module that builds the autograd graph). Whatever runs between the optimizer
and that forward work (`loss.item()`, a scaler update, `zero_grad`, logging)
belongs to the step it follows. Step 0 begins with the trace's first forward
work, and holds what ran before it.

Several optimizers in one iteration are one step: a step is a cycle in which
each optimizer steps at most once. Which optimizer steps next is known only
after the forward work that follows an optimizer step has begun, so the step
that forward work begins is *tentative*: when the next optimizer to step did not
step in the step before, both are one step (a GAN: the generator's forward and
step join the discriminator's), and the rows recorded since the tentative step
began get the earlier step number back (`relabel`). An optimizer is known by
itself and its parameters: a wrapper shares its inner optimizer's parameters, so
a wrapper first seen stepping after its inner optimizer stepped alone (one that
never called `Optimizer.__init__`, whose step is hooked only once `zero_grad`
has patched it) is the same optimizer, and begins a new step.

A tentative step still open when a part of the trace is written is settled
then (its rows are final), by what the same situation gave last time, else it
stands; the optimizer that comes next still teaches the right answer for the
next time. So with parts smaller than a generator's half-iteration, a GAN's
first iteration counts as two steps and the rest right.

At the end of the trace, a tentative step that trained nothing (no backward, no
optimizer, no module forward under grad mode: an evaluation pass, or logging
that touches a parameter, after the last optimizer step) joins the step before
it; one that did (a trace cut in the middle of a step) stands.

`Tracer.step()` ends a step by hand: the next forward work begins a new step,
which never joins the one before. (A loop of plain tensor ops that calls no
module and builds no autograd graph has no forward work: it stays in one step.)

An iteration can also end with no optimizer step (`iteration_end`, found by
tracer.recording.attribution): a GradScaler that skipped `optimizer.step()` after an
overflow still updates its scale (`aten._amp_update_scale_`), and a hand-written
update writes the parameters in place after the backward. Either ends the step
as `Tracer.step()` does, unless an optimizer step already ended it.

Forward/backward cycles (a backward after forward work) are counted; when the
whole trace saw no step boundary of any kind, `cycles_without_step` says how
many there were: that many iterations sit in one step, and the report says so.

`RunningSteps` tells an optimizer step inside another (a wrapper's inner step, a
subclass's `super().step()`, ZeroRedundancyOptimizer's local optimizer) from an
outermost one by the frames of `Optimizer.step`'s hook wrapper: a step whose
wrapper is no longer on the stack raised and is over. `Parameters` knows the
parameters by storage, for the hand-written update rule.
"""

import sys

import torch

_storage_key = torch._C._storage_id  # a tensor's storage, as the tracer's storage table keys it


class Steps:
    """The step counter. `rows_so_far()` is the number of rows in the unwritten part;
    `relabel(first_row, step)` gives that part's rows from `first_row` on the step `step`."""

    def __init__(self, rows_so_far, relabel):
        self.step = 0
        self.armed = True  # the next forward work begins a step
        self._began = False  # step 0 has begun
        self._joinable = False  # the last boundary came from an optimizer, not from Tracer.step()
        self._stepped = set()  # id() of the optimizers that stepped in this step, and of their parameters
        self._before = None  # while the step is tentative: the optimizers (and parameters) of the step before
        self._began_at = 0  # while tentative: the row the step began at
        self._joined_last = {}  # frozenset of optimizers before -> whether the last tentative step after them joined
        self._guessed = None  # the optimizers before a tentative step settled by a guess, until the truth comes
        self._rows_so_far = rows_so_far
        self._relabel = relabel
        self._forward_seen = False  # forward work since the last backward began
        self.cycles = 0  # forward/backward cycles: backward runs that followed forward work
        self.boundaries = 0  # step ends seen: optimizer steps, Tracer.step(), iteration_end()

    def forward_work(self):
        """Forward work is starting. True when it began a step."""
        self._forward_seen = True
        if not self.armed:
            return False
        self.armed = False
        if not self._began:
            self._began = True
            return True
        self.step += 1
        if self._joinable and self._stepped:
            self._before = self._stepped
            self._began_at = self._rows_so_far()
        self._stepped = set()
        return True

    def optimizer_start(self, optimizer, params=()):
        """An outermost optimizer step begins; `params`: the parameters it holds. It stepped in the step
        before when it, or an optimizer sharing a parameter with it, did."""
        self._began = True
        keys = {id(optimizer)}
        keys.update(id(p) for p in params)
        if self._before is not None:
            self._decide(join=self._before.isdisjoint(keys))
        elif self._guessed is not None:
            self._joined_last[frozenset(self._guessed)] = self._guessed.isdisjoint(keys)
        self._guessed = None
        self._stepped |= keys

    def optimizer_end(self):
        self.armed = True
        self._joinable = True
        self.boundaries += 1

    def mark(self):
        """Tracer.step(): the step ends here and the next does not join it."""
        if self._before is not None:
            self._decide(join=False)
        self._guessed = None
        self.armed = True
        self._joinable = False
        self.boundaries += 1

    def iteration_end(self):
        """An iteration ended with no optimizer step (a skipped GradScaler step, a hand-written
        update): as `mark()`, unless an optimizer step already ended this step. True when it ended it."""
        if self.armed:
            return False
        self.mark()
        return True

    def backward_began(self):
        """The autograd engine began a backward on the traced thread."""
        if self._forward_seen:
            self._forward_seen = False
            self.cycles += 1

    def cycles_without_step(self):
        """The forward/backward cycles of a trace that saw no step boundary at all; 0 when it saw one."""
        return self.cycles if not self.boundaries else 0

    def settle(self):
        """A part is about to be written: settle a tentative step now."""
        if self._before is not None:
            self._guessed = self._before
            self._decide(join=self._joined_last.get(frozenset(self._before), False))

    def finish(self, trained):
        """The trace ends: a tentative step that trained nothing joins the step before."""
        if self._before is not None:
            self._decide(join=not trained)

    def _decide(self, join):
        before, self._before = self._before, None
        self._joined_last[frozenset(before)] = join
        if join:
            self.step -= 1
            self._relabel(self._began_at, self.step)
            self._stepped |= before


def _depth(frame):
    """The number of frames on the stack up to and including `frame`."""
    n = 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


class RunningSteps:
    """The optimizer steps running, outermost first, each as (id, depth) of its hook wrapper's frame
    (ids only: no frame, and so no local of the program, is kept alive)."""

    def __init__(self):
        self._steps = []

    def enter(self, levels):
        """A step's pre hook, `levels` frames below the hook wrapper: True when it is the outermost."""
        wrapper = sys._getframe(levels + 1)  # alive for the whole step
        depth = _depth(wrapper)
        if self._steps:  # steps whose wrapper is not an ancestor raised (no post hook): they are over
            del self._steps[self._enclosing(wrapper, depth) :]
        self._steps.append((id(wrapper), depth))
        return len(self._steps) == 1

    def exit(self):
        """A step's post hook: True when the outermost step ended."""
        if self._steps:
            self._steps.pop()
        return not self._steps

    def over(self, levels):
        """Whether no running step encloses the caller `levels` frames up (they all raised)."""
        frame = sys._getframe(levels + 1)
        return not self._enclosing(frame, _depth(frame))

    def clear(self):
        self._steps.clear()

    def _enclosing(self, frame, depth):
        """How many of the running steps, from the outermost, run in strict ancestors of `frame`."""
        alive = []
        for frame_id, at in reversed(self._steps):  # innermost first, walking up the stack
            if at >= depth:
                alive.append(False)
                continue
            while depth > at:
                frame, depth = frame.f_back, depth - 1
            alive.append(id(frame) == frame_id)
        kept = 0
        for ok in reversed(alive):
            if not ok:
                break
            kept += 1
        return kept


class UnhookedWrapper:
    """The `step()` of an Optimizer subclass that skipped `Optimizer.__init__` (no step hooks of its own: timm's
    Lookahead, until its inherited `zero_grad` patches its class) calling the outermost hooked step: while that
    `step()` runs, its own work after the inner step (the slow weights) is optimizer work. Known by its frame's
    id, depth and code (ids only: no frame, and so no local of the program, is kept alive)."""

    def __init__(self):
        self.frame = None  # (id, depth, id of the code) of the wrapper's step() frame, while it may run

    def enter(self, optimizer, levels):
        """An outermost step's pre hook, `levels` frames below the hook wrapper: note the wrapper calling it."""
        self.frame = None
        caller = sys._getframe(levels + 1).f_back  # what called the hook wrapper
        if caller is None or caller.f_code.co_name != "step":
            return
        owner = caller.f_locals.get("self")
        if (
            isinstance(owner, torch.optim.Optimizer)
            and owner is not optimizer
            and not getattr(type(owner).step, "hooked", False)
        ):
            self.frame = (id(caller), _depth(caller), id(caller.f_code))

    def running(self):
        """Whether the noted wrapper's step() still runs (it is forgotten once it has returned)."""
        if self.frame is None:
            return False
        frame_id, at, code = self.frame
        frame = sys._getframe(1)
        depth = _depth(frame)
        while depth > at:
            frame, depth = frame.f_back, depth - 1
        if depth == at and id(frame) == frame_id and id(frame.f_code) == code:
            return True
        self.frame = None
        return False

    def clear(self):
        self.frame = None


class Parameters:
    """The parameters known (model=, every optimizer's), by storage: `p.data.add_(...)` writes one too."""

    def __init__(self):
        self._keys = set()
        self._optimizers = set()  # id() of the optimizers whose parameters are noted

    def note(self, params):
        for p in params:
            try:
                self._keys.add(_storage_key(p))
            except Exception:  # no storage (a wrapper subclass, e.g. a DTensor): known as a leaf that requires grad
                pass

    def note_optimizer(self, optimizer, params):
        if id(optimizer) not in self._optimizers:
            self._optimizers.add(id(optimizer))
            self.note(params)

    def written_by(self, info, args, kwargs):
        """Whether the op writes a parameter in place: one known by storage or, while none is known (no
        model=, no optimizer), a leaf that requires grad. Once some are known, a copy of the weights that
        requires grad (an EMA made with `copy.deepcopy(model)`) updated after the step is not one."""
        keys = self._keys
        try:
            for t, is_out in info.written(args, kwargs):
                if is_out or t.layout is not torch.strided:
                    continue
                if _storage_key(t) in keys if keys else t.requires_grad and t.is_leaf:
                    return True
        except Exception:  # a tensor with no storage to key: not a parameter this rule can know
            return False
        return False
