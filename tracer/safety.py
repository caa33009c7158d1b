"""Messages for the failures optrace survives without stopping the traced program."""

import errno

_HINTS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded", errno.EROFS: "the file system is read-only"}


def write_failure_message(file, exc, rows):
    """One line: which part could not be written, the OS error, and what it cost."""
    hint = _HINTS.get(getattr(exc, "errno", None))
    reason = f"{type(exc).__name__}: {exc}" + (f"; {hint}" if hint else "")
    return (
        f"optrace: could not write {file} ({reason}); its {rows} rows are lost, the program goes on "
        "and the trace will say so"
    )
