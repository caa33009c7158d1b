"""Messages for the failures optrace survives without stopping the traced program, the one
way they are emitted (`warn`), the one warning of PyTorch's that optrace's own hooks cause
(`quiet_global_hook_warning`), and a weak map with no Python finaliser (`WeakMap`)."""

import errno
import re
import sys
import warnings
import weakref

_HINTS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded", errno.EROFS: "the file system is read-only"}


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


# PyTorch warns at every call of a torch.compile'd module while any global module hook is set
# (torch/_dynamo/eval_frame.py, OptimizedModule.__call__): the tracer's and the meter's global hooks
# would make a program warn where it ran quietly untraced, and raise there under `python -W error`
_GLOBAL_HOOKS = re.compile(r"Using `torch\.compile\(module\)` when there are global hooks on modules", re.I)


def quiet_global_hook_warning():
    """Ignore that warning until the returned function is called; that function takes this filter (and
    only it) off again. The filter goes first in `warnings.filters`, ahead of an "error" one, as
    `warnings.filterwarnings` puts it; nothing else in the list is touched."""
    entry = ("ignore", _GLOBAL_HOOKS, UserWarning, None, 0)
    try:
        warnings.filters.insert(0, entry)
        _filters_changed()
    except Exception:  # another warnings module: the hooks still work, the warning shows
        return lambda: None

    def restore():
        try:
            for i, found in enumerate(warnings.filters):
                if found is entry:
                    del warnings.filters[i]
                    _filters_changed()
                    break
        except Exception:
            pass

    return restore


def _filters_changed():
    changed = getattr(warnings, "_filters_mutated", None)  # warnings' caches of filter decisions restart
    if changed is not None:
        changed()


def write_failure_message(file, exc, rows):
    """One line: which part could not be written, the OS error, and what it cost."""
    hint = _HINTS.get(getattr(exc, "errno", None))
    reason = f"{type(exc).__name__}: {exc}" + (f"; {hint}" if hint else "")
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
