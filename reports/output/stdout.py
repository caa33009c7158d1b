"""stdout for the length of one `optrace` command: what happens when it cannot be written.

    with checked_stdout():      sys.stdout wrapped; an OSError writing or flushing it is StdoutError
        ...                     (a ReportError: one line, status 2), flushed before the block ends

  * a full disk, /dev/full, an I/O error: `StdoutError` ("cannot write to stdout (No space left on device)"),
    which every command prints as its one line and exits 2 with, as for bad input;
  * a closed pipe (`optrace report T | head -1`): BrokenPipeError is left as it is, and the command exits 0
    without a word (`quiet`): the reader has what it wanted, as with `git log | head` or `cat file | head`.

Either way the bytes still buffered are dropped (stdout pointed at /dev/null), so the interpreter's flush at exit
raises nothing a second time.
"""

import contextlib
import os
import sys

from reports.errors import ReportError

__all__ = ["StdoutError", "checked_stdout", "quiet"]


class StdoutError(ReportError):
    """stdout could not be written (not a closed pipe): the command's one line."""


class _Checked:
    """A text stream whose write and flush turn an OSError (but a broken pipe) into StdoutError."""

    def __init__(self, stream):
        self._stream = stream

    def _call(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(f"cannot write to stdout ({exc.strerror or exc})") from None

    def write(self, text):
        return self._call(self._stream.write, text)

    def writelines(self, lines):
        return self._call(self._stream.writelines, lines)

    def flush(self):
        return self._call(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def checked_stdout():
    """sys.stdout wrapped in _Checked for the block, flushed at its end (the last buffered lines are written, or
    fail, inside it); the stream before is put back after. On a failure the unwritten bytes are dropped (`quiet`)."""
    before = sys.stdout
    sys.stdout = _Checked(before)
    try:
        yield
        sys.stdout.flush()
    except (StdoutError, BrokenPipeError):
        quiet(before)
        raise
    finally:
        sys.stdout = before


def quiet(stream):
    """Point `stream`'s file descriptor at /dev/null and drop what it buffers: nothing more to write, so the flush at
    exit cannot fail again. A stream with no descriptor (a test's capture) is left as it is."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
