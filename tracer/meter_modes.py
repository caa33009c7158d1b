"""The tracer's dispatch mode kept at its place in the mode stack while a Meter pauses and resumes it (tracer/meter.py).

A Meter takes its Tracer's mode off at the end of a traced step and puts it back before a re-traced one: at step
boundaries, which need not nest with the `with` blocks of the user's own dispatch modes (one entered after the
Meter around the whole loop: a FLOP counter, CommDebugMode). TorchDispatchMode.__exit__ pops the top of the
stack whatever it is, so a plain pause took the user's mode off and left the tracer's recording. Here the modes
above the tracer's are lifted for the pause and set back in order, and a resume puts the tracer's mode back at
the depth it was entered at, under the modes entered after it, as if it had never come off.
"""

import contextlib

import torch
from torch.utils import _python_dispatch

__all__ = ["depth_of", "lifted_above", "lifted_over"]

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
            _set_flags([(getattr(lifted[-1], kept, None) or [None])[-1] for _, kept in _FLAGS])
        yield
    finally:
        flags = [getattr(_python_dispatch, name, None) for name, _ in _FLAGS]
        for mode in reversed(lifted):  # the lowest first
            torch._C._push_on_torch_dispatch_stack(mode)
            flags = _entered(mode, flags)
        if lifted:
            _set_flags(flags)


def _set_flags(flags):
    if None in flags:  # another torch: its flags are left as they are
        return
    for (name, _), value in zip(_FLAGS, flags):
        setattr(_python_dispatch, name, value)
    set_without = getattr(_python_dispatch, "set_is_in_mode_without_ignore_compile_internals", None)
    if set_without is not None:
        set_without(flags[2])


def _entered(mode, flags):
    """The flags after `mode`'s enter from `flags` (TorchDispatchMode.__enter__'s rule), recorded as its before."""
    if None in flags:
        return flags
    for (_, kept), value in zip(_FLAGS, flags):
        before = getattr(mode, kept, None)
        if before:
            before[-1] = value
    infra = getattr(mode, "is_infra_mode", lambda: False)()
    ignores = getattr(mode, "ignore_compile_internals", lambda: False)()
    return [True, flags[1] or not infra, flags[2] or not ignores]
