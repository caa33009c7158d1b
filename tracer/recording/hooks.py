"""What recording puts on at a Tracer's entry and takes off at its exit (and at a Meter's pause and resume): compiled
code run eagerly, Dynamo's skips noted, the module and optimizer hooks, FSDP2's, the dispatch mode at its place in
the mode stack (tracer.recording.mode_stack) and the meta attention kernel."""

import threading

from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as _mode_stack

from tracer.recording.compiled import DynamoSkips, EagerCompiled
from tracer.recording.dispatch import make_inert
from tracer.recording.mode_stack import (
    depth_of,
    entered_below,
    lifted_above,
    lifted_over,
    refit_below,
    refit_infra,
    take_off_exited,
)
from tracer.safety import warn


class Hooks:
    """Puts on (`install`) and takes off (`remove`) what recording needs, on the thread that made it.

    path         the trace's path, for the warnings.
    mode         the dispatch mode (tracer.recording.dispatch._TraceMode).
    attribution  the module and optimizer hooks (tracer.recording.attribution.Attribution).
    unsharded    FSDP2's unsharded parameters (tracer.recording.distributed.UnshardedParameters).
    attention    the meta attention kernel (tracer.recording.meta_attention.MetaAttention), or None.
    fused        the meta and fake norm kernel (tracer.recording.meta_fused.MetaFused), or None.
    on_error     on_error(what, exc): a failure to count; the program goes on.
    on_given_back on_given_back(n): n compiled codes given back to torch.compile at `remove`."""

    def __init__(self, path, mode, attribution, unsharded, attention, on_error, on_given_back, fused=None):
        self.path, self.mode, self.attribution, self.unsharded, self.attention = (
            path,
            mode,
            attribution,
            unsharded,
            attention,
        )
        self._on_error, self._on_given_back = on_error, on_given_back
        self.fused = fused
        self.dynamo = (
            DynamoSkips()
        )  # compiled code skipped under the mode is given back at exit (tracer.recording.compiled)
        self.eager = EagerCompiled()  # compiled code runs eagerly while recording, counted (tracer.recording.compiled)
        self.depth = None  # the mode's position in the dispatch mode stack once entered (tracer.recording.mode_stack)
        self.below = None  # the modes below it then
        self.thread = threading.get_ident()  # the thread whose stack holds the mode

    def install(self):
        """Put on compiled code eager, Dynamo's skips noted, the module and optimizer hooks, FSDP2's, the modes."""
        try:
            self.eager.install()
        except Exception as exc:  # e.g. entered inside a compiled region: Dynamo skips under the mode instead
            self._on_error("running compiled code eagerly", exc)
        self.dynamo.install()
        self.attribution.install()
        self.unsharded.install()
        if self.depth is None:  # entry: on top; where it goes back on at a resume, under the modes entered after it
            self.mode.__enter__()
            self.depth = depth_of(self.mode)
            self.below = entered_below(self.depth)
        else:
            with lifted_above(self.depth):
                self.mode.__enter__()
        if self.attention is not None:
            self.attention.install()
        if self.fused is not None:
            try:
                self.fused.install()
            except Exception as exc:  # the composite runs, as untraced; the metadata has no `fused_standins`
                self._on_error("registering the fused norm kernel", exc)

    def remove(self):
        """Take off what `install` put on: the modes (`_leave_modes`), the hooks, Dynamo's skips given back."""
        try:
            self._leave_modes()
        finally:
            self.attribution.remove()
            self.unsharded.remove()
            self._give_back_compiled()

    def _give_back_compiled(self):
        """Compiled code runs compiled again: torch.compile's stance as before the trace, and the code Dynamo
        skipped for good under the mode given back (tracer.recording.compiled)."""
        try:
            self.eager.remove()
        except Exception as exc:
            self._on_error("putting torch.compile's stance back", exc)
        try:
            given = self.dynamo.remove()
        except Exception as exc:
            self._on_error("giving compiled code back to torch.compile", exc)
            return
        if given:
            self._on_given_back(given)

    def _leave_modes(self):
        """Take the dispatch mode off the stack of the thread that entered it, wherever it stands there: the modes the
        program entered after it stay on, in their order (tracer.recording.mode_stack); and the meta attention kernel off.
        Left on another thread, whose stack does not hold them, the mode becomes inert where it stands: it passes
        every op through, and nothing more is recorded."""
        if self.attention is not None:
            self.attention.remove()
        if self.fused is not None:
            self.fused.remove()
        if self.mode in _mode_stack():
            with lifted_over(self.mode):
                self.mode.__exit__(None, None, None)
                refit_below(self.below)
                refit_infra(self.below)
            return
        if threading.get_ident() == self.thread:  # a mode entered before the Tracer was left inside its block
            left = take_off_exited(self.below)
            warn(
                f"optrace: trace {self.path!r}: the dispatch mode {left or 'entered before the Tracer'} was left "
                "inside the Tracer's block and took the tracer's mode off the stack with it; the ops after that are not in "
                "the trace"
            )
            return
        make_inert(self.mode)
        warn(
            f"optrace: trace {self.path!r} was left on another thread than the one that entered it; its mode stays "
            "on that thread's stack and records nothing more"
        )
