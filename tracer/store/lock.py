"""The lock of a trace directory: one writer per directory (see tracer.store.directory).

The writer holds an exclusive flock on an empty file (`LOCK_NAME`), opened through the directory's descriptor
(tracer.store.held.Held): a regular file, never through a link. A second writer is refused while it is held; the OS
releases it when the process ends, however it ends. Where the file system has no flock (ENOSYS), filelock decides: it
warns and takes a soft lock. `tracer.store.directory.release_directory` removes the file, then unlocks."""

import errno
import os
import stat

try:
    import fcntl
except ImportError:  # no flock (Windows): filelock's lock
    fcntl = None

from tracer.errors import TraceError
from tracer.safety import warn
from tracer.store.held import _CLOEXEC, _NOFOLLOW

LOCK_NAME = ".optrace.lock"
_held = {}  # absolute path -> the lock this process holds on it (_Flock, or filelock's where there is no flock)


def _lock(path, held):
    """Take the OS lock of `path` (held by descriptor: `held`) for this process, or raise TraceError: another process
    holds it. flock on LOCK_NAME, opened through the descriptor (`_Flock`); where the file system has no flock, filelock
    decides (it warns and takes a soft lock)."""
    try:
        lock = _flock(held)
    except BlockingIOError:
        raise TraceError(
            f"cannot write trace {path!r}: another process is writing it (it holds the lock {LOCK_NAME}); "
            "choose another path or wait for it to finish"
        ) from None
    if lock is None:
        lock = _filelock(path)
    _held[os.path.abspath(path)] = lock


_LOCK_TRIES = 16


def _flock(held):
    """An exclusive flock on the lock file of the held directory (made when missing: a regular file, never through a
    link), without waiting: BlockingIOError while another holds it; None where the file system has no flock (ENOSYS) or
    the platform none. A lock file the writer that held it unlinked as it closed
    (tracer.store.directory.release_directory) is opened again (what filelock does: an unlinked file locks nothing)."""
    if fcntl is None:
        return None
    flags = os.O_RDWR | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC
    for _ in range(_LOCK_TRIES):
        try:
            fd, created = os.open(LOCK_NAME, flags | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=held.at()), True
        except FileExistsError:
            try:
                fd, created = os.open(LOCK_NAME, flags, dir_fd=held.at()), False
            except FileNotFoundError:  # removed meanwhile
                continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{LOCK_NAME} is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_nlink:
                return _Flock(fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno == errno.ENOSYS:  # filelock's soft lock takes the file's absence as unlocked
                if created:
                    held.remove(LOCK_NAME)
                return None
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise BlockingIOError(exc.errno, "locked") from None
            raise
        os.close(fd)  # unlinked meanwhile: unlocked by its writer's close; open the new one
    raise BlockingIOError(errno.EAGAIN, "the lock file kept being replaced")


class _Flock:
    """This process's flock on a trace directory's lock file: released by tracer.store.directory.release_directory
    (after the file's removal), dropped by the OS when the process ends. A forked child closes its copy of the
    descriptor at the fork (`_close_in_child`): it never unlocks the parent's lock, and the parent's death releases it."""

    _all = set()  # the held ones, for `_close_in_child`

    def __init__(self, fd):
        self.fd = fd
        _Flock._all.add(self)

    def release(self):
        fd, self.fd = self.fd, None
        _Flock._all.discard(self)
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    @classmethod
    def _close_in_child(cls):
        for lock in cls._all:
            fd, lock.fd = lock.fd, None
            try:
                os.close(fd)  # not an unlock: the lock is the open file's, the parent's too
            except OSError:
                pass
        cls._all = set()
        for path, lock in list(_held.items()):
            if isinstance(lock, cls):
                del _held[path]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Flock._close_in_child)


def _filelock(path):
    """filelock's lock of `path`, where there is no flock: it takes a soft lock (and warns), or raises TraceError."""
    from filelock import FileLock, SoftFileLock, Timeout

    file = os.path.join(path, LOCK_NAME)
    refused = None
    try:
        lock = FileLock(file, timeout=0, thread_local=False)
        try:
            lock.acquire()  # where the file system has no flock, filelock warns and takes a soft lock instead
        except Warning as warning:  # the program's filters made that warning an error: take the soft lock here
            refused = warning  # (no warnings filter is changed: they are the whole process's, every thread's)
            lock = SoftFileLock(file, timeout=0, thread_local=False)
            lock.acquire()
    except Timeout:
        raise TraceError(
            f"cannot write trace {path!r}: another process is writing it (it holds the lock {LOCK_NAME}); "
            "choose another path or wait for it to finish"
        ) from None
    if refused is not None:
        warn(f"optrace: trace {path!r}: {refused}")
    return lock
