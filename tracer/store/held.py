"""A trace directory held by descriptor (tracer.store.directory's writer side): files are created, renamed, listed and
removed relative to the directory the Tracer entered, never through its path again, and created only as new regular
files (O_EXCL, O_NOFOLLOW). `Held.check` says when the path stopped naming that directory."""

import json
import os

from tracer.schema import MARKER_NAME, marker_json, read_regular

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class DirectoryReplaced(OSError):
    """The trace's path no longer names the directory the Tracer entered: nothing more is written to it."""


class Held:
    """A trace directory held by descriptor from entry to close (see the module docstring): `fd` refers to the
    directory entered, wherever it is moved; `check()` raises DirectoryReplaced once the path names another."""

    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        found = os.fstat(self.fd)
        self.identity = (found.st_dev, found.st_ino)
        self.lost = None  # why the path stopped naming the directory, once seen: for good

    def check(self):
        """Raise DirectoryReplaced when the path no longer names the directory entered (or the descriptor is closed)."""
        if self.lost is None:
            self.lost = self._replaced()
        if self.lost is not None:
            raise DirectoryReplaced(
                f"the path no longer names the trace directory entered: it {self.lost}; nothing more is written to it"
            )

    def _replaced(self):
        if self.fd is None:
            return "was released (the trace closed)"
        try:
            found = os.stat(self.path)  # while the descriptor is held, its inode cannot be given to a new directory
        except OSError as exc:
            return f"is gone ({exc.strerror or exc})"
        if (found.st_dev, found.st_ino) != self.identity:
            return "names another directory now (moved, deleted and made again, or replaced by a link)"
        return None

    def entry(self, name):
        """`name` in this directory, as write_table takes it (see Entry)."""
        return Entry(self, name)

    def create(self, name):
        """A new regular file `name`, opened for writing: never an existing one, never through a link."""
        return open(name, "wb", opener=self._exclusive)

    def _exclusive(self, name, flags):
        return os.open(name, flags | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666, dir_fd=self.at())

    def replace(self, source, target):
        os.replace(source, target, src_dir_fd=self.at(), dst_dir_fd=self.at())

    def remove(self, name):
        os.remove(name, dir_fd=self.at())

    def exists(self, name):
        try:
            os.stat(name, dir_fd=self.at(), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def listdir(self):
        return os.listdir(self.at())

    def trace_id(self):
        """The trace id of the marker in this directory (read through the descriptor), or None."""
        try:
            return _id_in(marker_json(read_regular(MARKER_NAME, 1 << 16, self.at())))
        except OSError:
            return None

    def at(self):
        """The descriptor; DirectoryReplaced once released (a None dir_fd would name the working directory)."""
        if self.fd is None:
            raise DirectoryReplaced(
                "the trace directory was released (the trace closed); nothing more is written to it"
            )
        return self.fd

    def close(self):
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class Entry(str):
    """A file in a held directory: the str is its path, for messages and tests; `create()` makes it through the
    directory's descriptor (Held.create), so a replaced path never receives it."""

    def __new__(cls, held, name):
        entry = super().__new__(cls, os.path.join(held.path, name))
        entry.held, entry.name, entry.created = held, name, False
        return entry

    def create(self):
        f = self.held.create(self.name)
        self.created = True  # what a failed write may remove: never a file optrace did not create
        return f


def _id_in(raw):
    try:
        facts = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        return None
    trace_id = facts.get("trace_id") if isinstance(facts, dict) else None
    return trace_id if isinstance(trace_id, str) else None
