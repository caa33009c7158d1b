"""The tracer's dispatch mode taken off, and put back, at its own place in the mode stack.

The user's own dispatch modes (a FlopCounterMode, CommDebugMode) need not nest with the tracer's: one entered
inside `with Tracer(...)` and left after it, or entered after a Meter around the whole loop, is above the
tracer's mode when the Tracer leaves (`Tracer._leave_modes`) or a Meter pauses it (`Tracer._pause`).
TorchDispatchMode.__exit__ pops the top of the stack whatever it is, so a plain exit took the user's mode off
(it counted nothing more) and left the tracer's on. Here the modes above the tracer's are lifted while it comes
off and set back in order, and a resume (`Tracer._resume`) puts it back at the depth it was entered at, under
the modes entered after it, as if it had never come off. torch's "in a dispatch mode" flags are set as if the
modes left had been entered without the tracer's.
"""

import contextlib

import torch
from torch.utils import _python_dispatch

__all__ = ["depth_of", "entered_below", "lifted_above", "lifted_over", "refit_below", "refit_infra", "take_off_exited"]

# torch's "in a dispatch mode" flags, and the attribute in which each mode keeps their values from before its enter
_FLAGS = (
    ("_is_in_torch_dispatch_mode", "old_dispatch_mode_flags"),
    ("_is_in_non_infra_torch_dispatch_mode", "old_non_infra_dispatch_mode_flags"),
    ("_is_in_any_mode_without_ignore_compile_internals", "old_without_ignore_compile_internals_dispatch_mode_flags"),
)


def depth_of(mode):
    """The position of `mode` in the dispatch mode stack (0: the bottom), or None when it is not on it."""
    for i in range(torch._C._len_torch_dispatch_stack()):
        if torch._C._get_dispatch_stack_at(i) is mode:
            return i
    return None


def entered_below(depth):
    """(mode, its enters so far) of the modes below `depth`: what `take_off_exited` checks."""
    return [(m, len(getattr(m, _FLAGS[0][1], ()))) for m in (torch._C._get_dispatch_stack_at(i) for i in range(depth))]


def refit_infra(below):
    """Once the tracer's mode is off: the infra modes (FakeTensorMode; they sit at the bottom of the stack, whenever
    entered) entered since `below` was noted (`entered_below` at the tracer's entry) recorded flags that count the
    tracer's mode; they are set, and the flags with them, as if those modes had been entered right now."""
    enters = {id(m): n for m, n in below}
    flags = [getattr(_python_dispatch, name, None) for name, _ in _FLAGS]
    refit = False
    for i in range(torch._C._len_torch_dispatch_stack()):
        mode = torch._C._get_dispatch_stack_at(i)
        if hasattr(mode, "_mode_key") and len(getattr(mode, _FLAGS[0][1], ())) > enters.get(id(mode), 0):
            flags = _entered(mode, flags, 0)
            refit = True
    if refit:
        _set_flags(flags)


def refit_below(below):
    """Once the tracer's mode is off (inside `lifted_over` it, before the lifted modes go back on): when a mode of
    `below` (`entered_below` at the tracer's entry) has exited since and is off the stack (an infra mode: its exit
    pops its own slot), the flags the tracer's exit put back (those at its enter) still count it; they are set as if
    the modes below still on the stack had been entered alone, in order (FakeTensorMode entered, the Tracer inside
    it, FakeTensorMode left first: the stack is empty after the Tracer, and so are the flags)."""
    on = [m for m, _ in below if depth_of(m) is not None]
    if len(on) == len(below):
        return
    flags = [False, False, False]
    for mode in on:
        flags = _after_enter(mode, flags)
    _set_flags(flags)


def take_off_exited(below):
    """The modes of `below` (`entered_below` at the tracer's entry) that have exited since, yet are still on the stack,
    come off it, and the name of the first, or None. A mode entered before the tracer's and left above it (its
    `__exit__` pops the top of the stack) took the tracer's mode off in its place; its exit set torch's flags back."""
    names = []
    for mode, enters in below:
        exited = len(getattr(mode, _FLAGS[0][1], ())) < enters
        if exited and depth_of(mode) is not None and not hasattr(mode, "_mode_key"):
            with lifted_over(mode):
                torch._C._pop_torch_dispatch_stack(None)
            names.append(type(mode).__name__)
    return names[0] if names else None


def lifted_over(mode):
    """`lifted_above` for the modes over `mode`, so that taking the top of the stack off takes `mode`; none lifted
    when `mode` is not on the stack."""
    depth = depth_of(mode)
    return lifted_above(None if depth is None else depth + 1)


@contextlib.contextmanager
def lifted_above(depth):
    """The modes at stack positions >= `depth` (None: none) come off for the block and go back on after it, in their order.
    The block enters or exits the tracer's mode beneath them: each lifted mode's record of the flags before its
    enter and the flags themselves are then set as if the modes had been entered in their new order, so that the
    flags are right once the lifted modes exit (torch.compile and inductor read them)."""
    lifted = []
    try:
        while depth is not None and torch._C._len_torch_dispatch_stack() > depth:
            lifted.append(torch._C._pop_torch_dispatch_stack(None))
        if lifted:  # the flags of the modes left below, kept by the lowest lifted one: what the block starts from
            lowest = lifted[-1]
            above = sum(m is lowest for m in lifted[:-1])
            _set_flags([_kept(lowest, kept, above) for _, kept in _FLAGS])
        yield
    finally:
        flags = [getattr(_python_dispatch, name, None) for name, _ in _FLAGS]
        for i in range(len(lifted) - 1, -1, -1):  # the lowest first
            mode = lifted[i]
            torch._C._push_on_torch_dispatch_stack(mode)
            flags = _entered(mode, flags, sum(m is mode for m in lifted[:i]))
        if lifted:
            _set_flags(flags)


def _kept(mode, kept, above):
    """`mode`'s record of a flag before its enter at this place in the stack (see `_entered`), or None."""
    before = getattr(mode, kept, None)
    return before[-1 - above] if before is not None and len(before) > above else None


def _set_flags(flags):
    if None in flags:  # another torch: its flags are left as they are
        return
    for (name, _), value in zip(_FLAGS, flags):
        setattr(_python_dispatch, name, value)
    set_without = getattr(_python_dispatch, "set_is_in_mode_without_ignore_compile_internals", None)
    if set_without is not None:
        set_without(flags[2])


def _entered(mode, flags, above):
    """The flags after `mode`'s enter from `flags` (TorchDispatchMode.__enter__'s rule), recorded as its before:
    in its record of this place in the stack, the last but `above` (its places higher up, entered later)."""
    if None in flags:
        return flags
    for (_, kept), value in zip(_FLAGS, flags):
        before = getattr(mode, kept, None)
        if before is not None and len(before) > above:  # a mode pushed without its enter has no record to set
            before[-1 - above] = value
    return _after_enter(mode, flags)


def _after_enter(mode, flags):
    """The flags after `mode`'s enter from `flags` (TorchDispatchMode.__enter__'s rule); no record is set."""
    infra = getattr(mode, "is_infra_mode", lambda: False)()
    ignores = getattr(mode, "ignore_compile_internals", lambda: False)()
    return [True, flags[1] or not infra, flags[2] or not ignores]
