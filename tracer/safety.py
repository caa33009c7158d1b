"""Messages for the failures optrace survives without stopping the traced program, and the
one way they are emitted (`warn`)."""

import errno
import sys
import warnings

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


def write_failure_message(file, exc, rows):
    """One line: which part could not be written, the OS error, and what it cost."""
    hint = _HINTS.get(getattr(exc, "errno", None))
    reason = f"{type(exc).__name__}: {exc}" + (f"; {hint}" if hint else "")
    return (
        f"optrace: could not write {file} ({reason}); its {rows} rows are lost, the program goes on "
        "and the trace will say so"
    )
