"""Messages for the failures optrace survives without stopping the traced program, the one
way they are emitted (`warn`), a Ctrl-C held while optrace's state is made or removed
(`interrupts_deferred`), optrace's global module hooks, which no torch.compile'd module warns
about (`GlobalModuleHook`), and a weak map with no Python finaliser (`WeakMap`)."""

import contextlib
import errno
import signal
import sys
import threading
import warnings
import weakref

_HINTS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
}


def warn(message):
    """Warn with `message` (a UserWarning); never raises into the program.

    Under `python -W error`, `pytest -W error` or `warnings.filterwarnings("error")` the
    warnings machinery raises the warning instead of showing it: optrace's bookkeeping must
    not become the program's exception, so the message then goes to stderr. No filter or
    global state is changed (`warnings.catch_warnings` is not thread-safe). The loss the
    message reports is counted in the trace's metadata before this is called."""
    try:
        warnings.warn(message, UserWarning, stacklevel=2)  # the caller in optrace, as a direct warn would
    except Exception:  # a filter turned it into an error (or a showwarning hook failed)
        try:
            sys.stderr.write(f"UserWarning: {message}\n")
        except Exception:  # no stderr: the metadata still says it
            pass


@contextlib.contextmanager
def interrupts_deferred():
    """Hold a Ctrl-C (SIGINT) that arrives while optrace installs or removes its state (a Tracer's entry and exit, a
    Meter's pause and resume) until that is done, then hand it to the program's own handler (a KeyboardInterrupt):
    the state is never left half made (no mode or hook left on, no lock held), and the program still gets its
    interrupt right after. Several Ctrl-Cs meanwhile are one (the last part of a long trace may take seconds to
    write; SIGQUIT still ends the process at once, and a SIGTERM waits for the close in tracer.recording.signals.TermHandler).
    Only the main thread receives signals; elsewhere,
    or when the program's SIGINT handler is not a Python function (ignored, the default, one set from C), nothing
    is changed."""
    held = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.getsignal(signal.SIGINT)
        except (ValueError, AttributeError):
            previous = None

    def hold(signum, frame):
        held[:] = [(signum, frame)]

    installed = False
    if callable(previous):
        try:
            signal.signal(signal.SIGINT, hold)
            installed = True
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        if installed:
            if signal.getsignal(signal.SIGINT) is hold:
                signal.signal(signal.SIGINT, previous)
            if held:
                previous(*held.pop())


# PyTorch warns at every call of a torch.compile'd module while any global module hook is set
# (torch/_dynamo/eval_frame.py, OptimizedModule.__call__, asking torch.nn.modules.module._has_any_global_hook):
# the tracer's and the meter's global hooks would make a program warn where it ran quietly untraced, and raise
# there under `python -W error`. A filter in `warnings.filters` cannot hide it for sure: a filter the program
# puts ahead ("error", pytest's per-test ones), `resetwarnings()` or a `catch_warnings` block around the hooks'
# removal undo or keep it. So while optrace's hooks are on, that question leaves them out.
_OURS = set()  # handle ids of the global module hooks optrace has on
_HOOK_DICTS = (
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
)  # the kwargs and always-call flags are keyed by the same ids
_asked = []  # [PyTorch's function] while ours stands in for it


def _program_has_global_hook():
    """PyTorch's `_has_any_global_hook` with optrace's own hooks left out: the program's hooks alone."""
    from torch.nn.modules import module

    return any(getattr(module, name, {}).keys() - _OURS for name in _HOOK_DICTS)  # in C: no other thread cuts in


class GlobalModuleHook:
    """A global module hook (`register(hook, **kwargs)`, one of torch.nn.modules.module's register_module_*
    functions) that a torch.compile'd module does not warn about: while any is on, PyTorch's
    `_has_any_global_hook` is `_program_has_global_hook`, so the program sees that warning exactly when its
    own global hooks would give it untraced. No warnings filter is changed. `remove()` as a handle's."""

    def __init__(self, register, hook, **kwargs):
        from torch.nn.modules import module

        self._handle = register(hook, **kwargs)
        self.id = self._handle.id
        _OURS.add(self.id)
        if not _asked and getattr(module, "_has_any_global_hook", None) is not None:
            _asked.append(module._has_any_global_hook)
            module._has_any_global_hook = _program_has_global_hook

    def remove(self):
        self._handle.remove()
        _OURS.discard(self.id)
        if _asked and not _OURS:
            from torch.nn.modules import module

            if module._has_any_global_hook is _program_has_global_hook:  # another tool's stand-in stays
                module._has_any_global_hook = _asked[0]
            _asked.clear()


def describe_exception(exc):
    """ "TypeName: message" of an exception, for a warning or the metadata; never raises: an exception whose
    `__str__` (or its class's name) fails is described by what can be read, "TypeName (message not printable:
    ...)"."""
    try:
        name = type(exc).__name__
        name = name if isinstance(name, str) else "exception"
    except Exception:
        name = "exception"
    try:
        return f"{name}: {exc}"
    except Exception as failure:
        try:
            why = type(failure).__name__
        except Exception:
            why = "exception"
        return f"{name} (message not printable: its __str__ raised {why})"


def write_failure_message(file, exc, rows):
    """One line: which part could not be written, the OS error, and what it cost."""
    try:
        hint = _HINTS.get(getattr(exc, "errno", None))
    except Exception:  # an errno that does not hash
        hint = None
    reason = describe_exception(exc) + (f"; {hint}" if hint else "")
    return (
        f"optrace: could not write {file} ({reason}); its {rows} rows are lost, the program goes on "
        "and the trace will say so"
    )


class WeakMap:
    """{object: value} holding its keys weakly, like `weakref.WeakKeyDictionary`, but with no
    Python code run when a key dies: the stdlib map removes dead keys in a Python callback,
    where a Ctrl-C arriving at that moment is printed as "Exception ignored" and lost. Here
    the callback is a bound `list.append` (C code); dead entries are dropped on the next insert.
    Keys are compared by identity."""

    def __init__(self):
        self._entries = {}  # id(key) -> (weak reference to key, value)
        self._dead = []  # references whose key died since the last insert

    def get(self, key, default=None):
        entry = self._entries.get(id(key))
        return entry[1] if entry is not None and entry[0]() is key else default

    def __contains__(self, key):
        entry = self._entries.get(id(key))
        return entry is not None and entry[0]() is key

    def __setitem__(self, key, value):
        if self._dead:
            n = len(self._dead)
            self._entries = {k: e for k, e in self._entries.items() if e[0]() is not None}
            del self._dead[:n]
        self._entries[id(key)] = (weakref.ref(key, self._dead.append), value)

    def __len__(self):
        return sum(1 for ref, _ in self._entries.values() if ref() is not None)
