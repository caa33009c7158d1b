"""The small parts of a trace kept in memory for merging (SmallParts): neighbouring small files become one during
the run, and all of them one part at a clean close (tracer.store.writer.PartWriter.roll, merge_parts)."""

import sys

from tracer.store.row_buffer import RowBuffer


class _File:
    """One file of a trace's small parts, as SmallParts keeps it: the parts it holds, its merge level (0: a part as
    written), its rows (one RowBuffer), the storage roles its parts learned, the metadata of its newest part (the
    newest file's only: the others' is dropped) and the bytes it takes."""

    __slots__ = ("first", "last", "level", "buffer", "roles", "metadata", "nbytes")

    def __init__(self, first, last, level, buffer, metadata):
        self.first, self.last, self.level, self.buffer, self.metadata = first, last, level, buffer, metadata
        self.roles = metadata.get("storage_roles", {})
        self.nbytes = buffer.nbytes() + sys.getsizeof(self) + _sizeof_roles(self.roles)

    @property
    def buffers(self):
        """Its rows as the list of RowBuffers PartWriter._merge concatenates."""
        return [self.buffer]


def _sizeof_roles(roles):
    """The bytes of a storage_roles dict: {role: [storage id, ...]} (small ints: those above 256 counted as 32 bytes)."""
    return sys.getsizeof(roles) + sum(sys.getsizeof(ids) + 32 * len(ids) for ids in roles.values())


def _roles(group):
    """The storage roles of the parts in `group`: each part's metadata holds those learned since the part before."""
    roles = {}
    for file in group:
        for key, ids in file.roles.items():
            roles.setdefault(key, []).extend(ids)
    return roles


class SmallParts:
    """The newest files of a trace's small parts (under SMALL_ROWS rows and MAX_BYTES / FANOUT bytes each), with
    their rows, for merging.

    A reader pays a file open and a footer per part (about 0.25 ms each with pyarrow or DuckDB),
    so many small parts (`flush_rows=1`, a run that flushes often) are written again as fewer:
    - during the run, FANOUT neighbouring files of one level become one file of the next level
      (`part-000000-000063.parquet`). One-row parts of a few tensors become files of 64 and of 4,096 rows:
      a run killed after 10,000 of them leaves 46 files, not 10,000;
    - at a clean close, when every part was small and all are still kept, its MIN_PARTS or more parts become
      one part.
    What it keeps is bounded in bytes, whatever the rows: the newest files' buffers, at most MAX_BYTES (RowBuffer.nbytes
    with the objects that hold them); older files stay as they are, and a part of MAX_BYTES / FANOUT bytes or more is
    not small (FANOUT of them could not be merged)."""

    FANOUT = 64
    MIN_PARTS = 64
    SMALL_ROWS = 1024
    MAX_BYTES = 2 << 20  # 2 MiB

    def __init__(self):
        self.files = []  # _File, oldest first: the trace's newest files, all small
        self.kept = 0  # bytes of `files` (_File.nbytes)
        self.open = True  # every part written so far is in `files`: the whole trace can become one part
        self.stopped = False  # a merge failed: nothing more is kept

    def add(self, index, rows, metadata):
        """Keep part `index`, just written, when it is small: a copy of its RowBuffer, with no spare room."""
        if self.stopped:
            return
        last = self.files[-1].buffer if self.files else None
        small = len(rows) < self.SMALL_ROWS and 8 * rows.values() < self.MAX_BYTES // self.FANOUT  # before a copy
        file = _File(index, index, 0, rows.compacted(), metadata) if small else None
        if (
            file is None
            or file.nbytes >= self.MAX_BYTES // self.FANOUT
            or (last is not None and rows.first_seq != last.first_seq + len(last))
        ):
            self.files, self.kept, self.open = [], 0, False  # a big part or a seq gap: nothing merges across it
            return
        if self.files:
            self.files[-1].metadata = None  # only the newest file's is read (`due`, `ready`)
        self.files.append(file)
        self.kept += file.nbytes
        while self.kept > self.MAX_BYTES:  # the oldest leave memory; their files stay as they are
            self.kept -= self.files.pop(0).nbytes
            self.open = False

    def due(self):
        """The newest FANOUT files when they are of one level, else None (together they take at most MAX_BYTES)."""
        group = self.files[-self.FANOUT :]
        if len(group) < self.FANOUT or any(f.level != group[-1].level for f in group):
            return None
        return group

    def merged(self, span, metadata):
        """The newest FANOUT files are one file now, covering parts `span`: its rows are kept as one RowBuffer."""
        group = self.files[-self.FANOUT :]
        del self.files[-self.FANOUT :]
        file = _File(*span, group[-1].level + 1, RowBuffer.concatenate([f.buffer for f in group]), metadata)
        self.files.append(file)
        self.kept += file.nbytes - sum(f.nbytes for f in group)
        while (
            self.kept > self.MAX_BYTES and len(self.files) > 1
        ):  # one buffer instead of FANOUT: fewer bytes, but bounded
            self.kept -= self.files.pop(0).nbytes
            self.open = False

    def stop(self):
        """No more merging in this trace (a merge failed)."""
        self.files, self.kept, self.open, self.stopped = [], 0, False, True

    def ready(self, parts):
        """Whether the trace's `parts` parts, in more than one file, can become one at close."""
        return self.open and parts >= self.MIN_PARTS and len(self.files) > 1
