"""The trace directory: which directories optrace may write into, replace, and lock.

optrace replaces only a trace it wrote itself. It knows one by its marker
(`schema.MARKER_NAME`: a zero-row Parquet file that every engine reading the directory
skips or reads as no rows; its footer holds the trace's identity), written before the
first part; never by file names, which other tools share (`pyarrow.dataset.write_dataset`
and Spark both write `part-*.parquet`). The JSON marker of earlier traces
(`LEGACY_MARKER_NAME`) is recognised too, and a trace written before markers existed
by every file in it being a Parquet part carrying optrace metadata. A directory whose
only entries are `rank=R` optrace traces (a distributed run) is a trace too. Anything
else at the path is refused with one line, before the model runs, and nothing is touched.

One writer per directory: the writer holds an OS lock (flock; `filelock`'s soft lock where the
file system has none) on an empty file (`LOCK_NAME`); a second writer is refused while it is held.
The OS releases it when the process ends, however it ends, so a killed writer's lock blocks no one; the
file is removed when the trace closes (before the unlock: a writer that opened it
meanwhile finds it unlinked and retries on a new file), and an empty one left by a
killed writer is skipped by every engine.

From entry to close the writer holds the directory by descriptor (`Held`): parts, temporaries, the marker and the
lock file are opened, renamed and removed relative to it, never through the path again, and only as regular files
created by optrace (O_EXCL, O_NOFOLLOW). When the path stops naming that directory (it was moved, deleted and made
again by another run, or replaced by a symlink to another trace or to a user's directory), nothing more is written:
the rows count as lost (`DirectoryReplaced`), and the other trace or the user's files are left as they were.
"""

import errno
import functools
import json
import os
import re
import stat
import uuid

import pyarrow.parquet as pq

from tracer.errors import TraceError
from tracer.schema import (
    LEGACY_MARKER_NAME,
    MARKER_NAME,
    PART_GLOB,
    footer_metadata,
    marker_facts,
    marker_file,
    marker_json,
    merged_name,
)
from tracer.store.held import _CLOEXEC, _NOFOLLOW, DirectoryReplaced, Held, _id_in  # noqa: F401 (DirectoryReplaced: re-exported)
from tracer.store.lock import LOCK_NAME, _held, _lock

MARKER_TMP = "._optrace.parquet.tmp"  # the first marker is written here, then renamed into place
MARKER_BYTES = 4096  # the marker is padded to this size, so its closing rewrite needs no new space
RANK_PREFIX = "rank="
_TMP_SUFFIX = ".tmp"
# A part being written: `.part-000003.parquet.<trace_id>.<pid>.<random>.tmp` (a merged one: `.part-000000-000099.parquet...`).
# Only a name of this form carrying the trace's own id (its marker's) is optrace's; a user's `.part-x.tmp` is not.
_TEMPORARY = re.compile(
    r"\.part-\d{6,}(?:-\d{6,})?\.parquet\.(?P<trace_id>[0-9a-f]{32})\.\d+\.[0-9a-f]{8}" + re.escape(_TMP_SUFFIX)
)
# The part name the entry probe tries (`probe`): a merged part of part numbers a run of a billion parts reaches,
# in a name longer than every temporary's (_TEMPORARY).
_LONGEST_PART = 999_999_999
_PROBE = re.compile(r"\.optrace-probe-part-9+-9+\.parquet\.[0-9a-f]{32}\.\d+\.[0-9a-f]{8}" + re.escape(_TMP_SUFFIX))


def prepare_directory(path, trace_id=None):
    """Check that `path` can hold a trace, lock it, clear an earlier optrace trace there,
    and write the marker naming `trace_id` (a new one when None). Returns the absolute path.

    Missing parent directories are created (and removed again when the trace cannot start).
    Raises TraceError (before anything runs, nothing touched) when a parent cannot be created
    or is not writable, when `path` is a file, a directory holding anything but
    an optrace trace, or a trace another live process is writing."""
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    made = make_parents(path)
    try:
        return _prepare(path, parent, trace_id)
    except BaseException:
        remove_made(made)
        raise


def make_parents(path):
    """Create the missing parent directories of `path` (the user asked for that path); the list of those made,
    outermost first, for `remove_made` when the trace cannot start. A parent that cannot be made is a TraceError."""
    made, parent = [], os.path.dirname(path)
    while parent and not os.path.isdir(parent) and not os.path.lexists(parent):
        made.insert(0, parent)
        parent = os.path.dirname(parent)
    for directory in made:
        try:
            os.mkdir(directory)
        except FileExistsError:  # made meanwhile (another rank of the same job)
            if not os.path.isdir(directory):
                remove_made(made[: made.index(directory)])
                raise TraceError(f"cannot write trace {path!r}: {directory!r} is not a directory") from None
        except OSError as exc:
            remove_made(made[: made.index(directory)])
            raise TraceError(
                f"cannot write trace {path!r}: cannot create directory {directory!r} ({exc.strerror or exc})"
            ) from None
    return made


def remove_made(made):
    """Remove the (empty) directories `make_parents` made, innermost first; what holds anything stays."""
    for directory in reversed(made):
        try:
            os.rmdir(directory)
        except OSError:
            return


def _prepare(path, parent, trace_id):
    if not os.path.isdir(parent):
        raise TraceError(f"cannot write trace {path!r}: {parent!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TraceError(f"cannot write trace {path!r}: directory {parent!r} is not writable")
    trace_id = trace_id or uuid.uuid4().hex
    made = False
    try:
        if os.path.isdir(path):
            foreign = foreign_entry(path)
            if foreign is not None:
                raise TraceError(
                    f"cannot write trace {path!r}: it is a directory holding {foreign!r}, which optrace did not "
                    "write; choose a new path"
                )
        elif os.path.lexists(path):
            raise TraceError(
                f"cannot write trace {path!r}: a file of that name exists; a trace is a directory of parts"
            )
        else:
            os.mkdir(path)
            made = True
        held = Held(path)
        try:
            _lock(path, held)
            if (path, held.identity) not in _probed:  # a directory probed before: the same names fit
                probe(held)  # before anything at the path is removed: a path refused here is left as it was
                _probed[path, held.identity] = None
                if len(_probed) > _PROBED_MAX:
                    del _probed[next(iter(_probed))]
            _clear(path)
            data = marker_file(_padded({"format": "optrace", "trace_id": trace_id}))
            with held.create(MARKER_TMP) as f:  # whole or absent: an interrupted write
                f.write(data)  # leaves no cut marker, which DuckDB and polars would refuse
            held.replace(MARKER_TMP, MARKER_NAME)
        except BaseException:
            try:
                held.remove(MARKER_TMP)
            except OSError:
                pass
            release_directory(path, held)
            if made:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
            raise
    except OSError as exc:
        raise TraceError(f"cannot write trace {path!r}: {exc.strerror or exc}") from None
    return held


# The directories `probe` passed in this process, by (absolute path, (st_dev, st_ino) of the directory): the same path
# naming the same directory on the same file system fits the same names and opens the same way, so a later trace there
# skips the probe (about 0.2 ms). A directory made again or mounted over at the path has another identity. The oldest
# past _PROBED_MAX are forgotten (probed again: only slower).
_probed = {}
_PROBED_MAX = 4096


def probe(held):
    """Refuse (TraceError, one line) a trace path where the writer or a reader cannot open the trace's files, by doing
    what they do with a file named like the longest part a run writes (a temporary of a merged part): the writer
    creates it in the held directory, a reader opens it by its whole path with pyarrow (as pyarrow and DuckDB read
    parts). A path that is not UTF-8, or whose part files pass the file system's limits on names (NAME_MAX, PATH_MAX),
    would otherwise lose every row. The probe file is removed; one left by a kill is optrace's (_PROBE)."""
    import pyarrow as pa

    name = f".optrace-probe-{merged_name(_LONGEST_PART, _LONGEST_PART)}.{uuid.uuid4().hex}.{os.getpid()}.{os.urandom(4).hex()}"
    entry = held.entry(name + _TMP_SUFFIX)
    try:
        with entry.create():
            pass
        try:
            pa.OSFile(entry).close()
        finally:
            held.remove(entry.name)
    except UnicodeError:
        raise TraceError(
            f"cannot write trace {held.path!r}: the path is not valid UTF-8, and the Parquet readers "
            "(pyarrow, DuckDB) open files by UTF-8 paths; choose a UTF-8 name"
        ) from None
    except OSError as exc:
        reason = "its name is too long" if exc.errno == errno.ENAMETOOLONG or "too long" in str(exc) else one_line(exc)
        raise TraceError(
            f"cannot write trace {_abbreviated(held.path)}: a part file there cannot be written and read "
            f"back ({reason}: {len(entry)} characters); choose a shorter path"
        ) from None


def one_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _abbreviated(path, keep=120):
    """repr(path), its middle left out when it is longer than `keep` characters."""
    return (
        repr(path)
        if len(path) <= keep
        else repr(path[: keep // 2]) + f" ... ({len(path):,} characters) ... " + repr(path[-keep // 2 :])
    )


def _padded(facts):
    text = json.dumps(facts)
    return text + " " * max(MARKER_BYTES - len(text), 0)


def write_facts(directory, facts):
    """Rewrite the marker in place with the trace's closing facts (rows, lost_rows, complete).

    `directory`: a Held directory (the writer's: the marker is opened through its descriptor, and rewritten only while
    it names the trace `facts` names, else TraceError), or a path. The marker's facts were padded to MARKER_BYTES, so
    the new marker has the same length and this needs no new disk space: the facts reach the disk even when it is
    full and the last part could not be written."""
    text = _padded(facts)
    if len(text) > MARKER_BYTES:
        raise TraceError(f"trace facts are {len(text)} bytes, more than the marker's {MARKER_BYTES}")
    held = directory if isinstance(directory, Held) else None
    path = held.path if held is not None else os.fspath(directory)
    marker = os.path.join(path, MARKER_NAME)
    data = marker_file(text)
    flags = os.O_RDWR | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(MARKER_NAME, flags, dir_fd=held.at()) if held is not None else os.open(marker, flags)
    with open(fd, "r+b") as f:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise TraceError(f"trace marker {marker!r} is not a regular file")
        if len(data) != found.st_size:
            raise TraceError(f"trace marker {marker!r} is {found.st_size} bytes, expected {len(data)}")
        if held is not None:
            owner = _id_in(marker_json(f.read(found.st_size)))
            if owner != facts.get("trace_id"):
                raise TraceError(
                    f"trace marker {marker!r} names trace {owner!r}, not {facts.get('trace_id')!r}; left as it is"
                )
            f.seek(0)
        f.write(data)


def release_directory(path, held=None):
    """Remove the lock file of `path` (through `held`, its descriptor, when given: never the lock of a directory that
    took its place), release this process's lock on it (a missing one is fine), and close `held`."""
    lock = _held.pop(os.path.abspath(path), None)
    try:
        if held is None:
            os.remove(os.path.join(path, LOCK_NAME))
        elif held.fd is not None:
            held.remove(LOCK_NAME)
    except OSError:
        pass
    if lock is not None:
        try:
            lock.release()
        except Exception:  # the OS drops it at exit anyway, and its file is gone: it blocks no one
            pass
    if held is not None:
        held.close()


def temporary_name(path, name, trace_id):
    """A hidden name for a part being written: unique to the trace, the process and the call."""
    return os.path.join(path, f".{name}.{trace_id}.{os.getpid()}.{os.urandom(4).hex()}{_TMP_SUFFIX}")


def _trace_id(path):
    """The trace id the marker of directory `path` names, or None."""
    trace_id = (marker_facts(path) or {}).get("trace_id")
    return trace_id if isinstance(trace_id, str) else None


def _is_own_temporary(name, trace_id):
    """Whether `name` is a temporary part of the trace whose id `trace_id()` gives (left by a run killed mid-write):
    the marker is read only for a name of that form."""
    match = _TEMPORARY.fullmatch(name)
    return match is not None and match["trace_id"] == trace_id()


def foreign_entry(path):
    """The first entry of directory `path` that optrace did not write, or None.

    optrace's entries: the marker (or a legacy one), the lock, temporary parts named with the marker's trace
    id, parts carrying optrace metadata, and `rank=R` directories holding only such entries
    (a distributed run)."""
    trace_id = functools.cache(lambda: _trace_id(path))  # the marker's, read at most once (None: no marker)
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if (
            name in (MARKER_NAME, LEGACY_MARKER_NAME, LOCK_NAME, MARKER_TMP)
            or _is_own_temporary(name, trace_id)
            or _PROBE.fullmatch(name)
        ):
            if not _is_regular(full):  # a link, a FIFO, a directory of that name: the user's
                return name
            continue
        if name.startswith(RANK_PREFIX) and os.path.isdir(full) and not os.path.islink(full):
            inner = foreign_entry(full)
            if inner is not None:
                return os.path.join(name, inner)
            continue
        try:
            found = os.lstat(full)
        except OSError:
            return name
        if not stat.S_ISREG(found.st_mode) or not _is_part_name(name):  # a link, a directory, a FIFO: the user's
            return name
        if not written_here(full, found) and not _has_optrace_metadata(full):  # named like a part: is it optrace's?
            return name
    return None


def _is_regular(full):
    try:
        return stat.S_ISREG(os.lstat(full).st_mode)
    except OSError:
        return False


def _is_part_name(name):
    import fnmatch

    return fnmatch.fnmatch(name, PART_GLOB)


# The parts this process wrote and left in place, by absolute path: (device, inode, size, mtime, ctime) of each as
# renamed into place. A file that still has all five is that part, unchanged (a write, truncation, rename or utime
# changes its ctime), so `foreign_entry` need not read its footer again (about 0.6 ms a part with pyarrow) when a
# later trace of the process replaces the trace at the same path. Forgotten as the files are removed (`forget`), and
# the oldest past _WRITTEN_MAX (a part forgotten is read again: only slower).
_written = {}
_WRITTEN_MAX = 65536


def _identity(found):
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns


def wrote(full, found):
    """Note that this process wrote the part at `full` (an absolute path), whose lstat is `found`."""
    _written.pop(full, None)  # the newest last
    _written[full] = _identity(found)
    if len(_written) > _WRITTEN_MAX:
        del _written[next(iter(_written))]


def forget(full):
    _written.pop(full, None)


def written_here(full, found=None):
    """Whether `full` is a part this process wrote, unchanged since (`_written`): the same regular file, not a link.
    `found`: its lstat, when the caller has it."""
    known = _written.get(full)
    if known is None:
        return False
    try:
        found = os.lstat(full) if found is None else found
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and _identity(found) == known


def _has_optrace_metadata(file):
    try:
        return footer_metadata(pq.read_metadata(file)) is not None
    except Exception:
        return False


def _clear(path):
    """Remove what an earlier optrace trace left at `path` (checked by foreign_entry: every
    entry is optrace's, so every one but the lock goes)."""
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if name == LOCK_NAME:
            continue
        if name.startswith(RANK_PREFIX) and os.path.isdir(full):
            _clear(full)
            release_directory(full)
            os.rmdir(full)
        else:
            os.remove(full)
            forget(full)
