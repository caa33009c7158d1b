"""SIGTERM while a Tracer is active: the rows so far are written, then the signal does what it would untraced.

torchrun, SLURM and Kubernetes send SIGTERM before they kill a process. Untraced, the program's own handler runs,
or the process ends by the signal (the default action). Traced, `TermHandler` first writes the rows buffered
since the last part (`Tracer._flush`) with the run metadata's `signal` ("SIGTERM") set, so that the trace reads
as stopped by that signal (`complete` stays false at close), then hands the signal to the program's handler
(called with the same frame) or restores the default action and sends it again: the exit status is the one
untraced. A signal that arrives while the tracer builds a row or writes a part (`unsafe`: the Tracer's methods
mid-way through which the rows are half made) is held until that work is done (`due`), as
tracer.safety.interrupts_deferred holds a Ctrl-C.

Installed only on the main thread (the only one Python delivers signals to) and only over a handler Python can
set and call again: the default action or a Python function; an ignored SIGTERM or one set from C is left alone.
At the Tracer's exit the previous handler comes back, unless the program set its own meanwhile, which stays. A
forked child inherits the handler: there it hands the signal on at once and writes nothing.
"""

import _thread
import os
import signal
import threading

__all__ = ["TermHandler", "unsafe"]

_UNSAFE = set()  # code objects of functions whose frames mean "a row or a part is half made"


def unsafe(*functions):
    """Name the functions inside which a signal is held until they are done."""
    _UNSAFE.update(f.__code__ for f in functions)


def _inside(frame):
    """Whether `frame` or a frame below it runs one of the `unsafe` functions."""
    while frame is not None:
        if frame.f_code in _UNSAFE:
            return True
        frame = frame.f_back
    return False


def _name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TermHandler:
    """The SIGTERM handler of one Tracer (`tracer`): `install()` at entry, `remove()` at exit."""

    SIGNALS = (signal.SIGTERM,)

    def __init__(self, tracer):
        self._tracer = tracer
        self._previous = {}  # signal number -> the handler before this one
        self._handler = self._handle  # one bound method: what signal.getsignal gives back
        self.pending = None  # (signum, frame) held until the tracer's half-made work is done
        self.before_flush = []  # callables run before the rows are written (a Meter puts its table in the metadata)

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            try:
                previous = signal.getsignal(signum)
            except (ValueError, OSError):
                continue
            if previous is None or previous is signal.SIG_IGN:  # set from C, or ignored: nothing to hand on or do
                continue
            try:
                signal.signal(signum, self._handler)
            except (ValueError, OSError):
                continue
            self._previous[signum] = previous

    def remove(self):
        """Put the previous handler back where this one still stands (the program's own, set since, stays)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            try:
                if signal.getsignal(signum) is self._handler:
                    signal.signal(signum, previous)
            except (ValueError, OSError):
                pass

    def _handle(self, signum, frame):
        tracer = self._tracer
        if tracer._in_child():
            return self._hand_on(signum, frame)
        if not tracer._closed:
            tracer._meta.setdefault("signal", _name(signum))  # the first signal's name; complete stays false at close
        hot = (
            tracer._hot
        )  # the compiled hook (tracer/native/_dispatch.cpp): its rows are made with no Python frame of ours
        in_hook = hot is not None and hot.recording()
        if in_hook or _inside(frame):  # a row or a part is half made (or the trace closing): that work finishes first
            self.pending = (signum, frame)
            tracer._term_pending = True
            if in_hook:
                hot.hold()  # the hook calls Tracer._signal_due once the row is whole
            return None
        if tracer._closed:
            return self._hand_on(signum, frame)
        return self._act(signum, frame)

    def due(self, frame):
        """Where the tracer's work is done (called with the frame of its caller): a held signal is acted on now,
        unless `frame` is itself inside such work. On a thread other than the main one (the compiled hook making
        an autograd engine thread's row), the main thread gets the signal again, to act on it there."""
        if self.pending is None or _inside(frame):
            return
        signum, at = self.pending
        if threading.current_thread() is not threading.main_thread():
            _thread.interrupt_main(signum)  # the handler runs again on the main thread (Python >= 3.10)
            return
        self._act(signum, at)

    def _act(self, signum, frame):
        tracer = self._tracer
        self.pending = None
        tracer._term_pending = False
        if not tracer._closed and not tracer._in_child():
            for before in self.before_flush:
                try:
                    before()
                except Exception as exc:
                    tracer._record_failed("the metadata at a signal", exc)
            try:
                tracer._flush()  # a failed write is counted and warned about inside
            except Exception as exc:
                tracer._record_failed(f"the rows at {_name(signum)}", exc)
        return self._hand_on(signum, frame)

    def _hand_on(self, signum, frame):
        """What the signal does untraced: the handler before this one, else the default action."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            return previous(signum, frame)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # ends the process as the signal would have
        return None
