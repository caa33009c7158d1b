"""A Tracer's parts as they are written (tracer.store.writer.PartWriter), and what became of them: the rows a failed
write lost, its first error, the parts a Ctrl-C stopped mid-write, the merging of small parts, and a late part
after close. Never raises an OSError into the program: a failure is a warning and a count in the metadata."""

import os

from tracer.safety import describe_exception, warn, write_failure_message
from tracer.store.directory import write_facts
from tracer.store.writer import RowBuffer


class TraceOutput:
    """Writes one trace's parts through its PartWriter. A forked child (`in_child()`) writes nothing.

    writer      the trace's tracer.store.writer.PartWriter.
    roles       its tracer.recording.metadata.Roles: the storage roles of a part that could not be written go back to it.
    in_child    whether this is a forked copy of the process that entered the Tracer."""

    def __init__(self, writer, roles, in_child):
        self.writer = writer
        self._roles = roles
        self._in_child = in_child
        self.pending = []  # (rows, metadata) of parts a KeyboardInterrupt stopped mid-write
        self.write_error = None  # "file: OS error" of the first failed write
        self.lost_rows = 0  # rows whose part could not be written

    def write(self, rows, meta, roll=True):
        """Write one part; whether it was written. A failed write loses its rows (seq keeps counting; their storage
        roles are kept), warns once naming the file and the OS error, and never raises into the program; a
        KeyboardInterrupt mid-write keeps the rows for `write_pending` and goes on up. `roll`: merge the small parts
        now due (PartWriter.roll); at close `merge` makes one part of them all instead."""
        if self._in_child():
            return False
        file = self.writer.next_part()
        try:
            self.writer.write(rows, meta)
        except Exception as exc:
            self.lost_rows += len(rows)
            self._roles.put_back(meta["storage_roles"])
            if self.write_error is None:
                self.write_error = f"{os.path.basename(file)}: {describe_exception(exc)}"
                warn(write_failure_message(file, exc, len(rows)))
            return False
        except BaseException:
            self.pending.append((rows, meta))
            raise
        if roll:
            self.merge(self.writer.roll)
        return True

    def write_pending(self):
        """At close: write the parts a KeyboardInterrupt stopped mid-write."""
        pending, self.pending = self.pending, []
        for rows, meta in pending:
            self.write(rows, meta, roll=False)

    def merge(self, merge=None):
        """Many small parts become fewer during the run and one at close (tracer.store.small_parts.SmallParts). A
        failure keeps them, warns and stops the merging for this trace."""
        if self.lost_rows or self._in_child():
            return
        try:
            (merge or self.writer.merge_parts)()
        except Exception as exc:
            self.writer.small.stop()
            warn(
                f"optrace: trace {self.writer.directory!r}: merging its small parts failed "
                f"({describe_exception(exc)}); nothing is lost: optrace reads the parts as they are"
            )

    def late_part(self, what, metadata, facts):
        """After close, one empty part carrying `metadata()`, and the marker's facts (`facts()`) counting it, if the
        trace at the path is still this one; never raises into the program (a failure is a warning). Whether the
        part was written."""
        if not self.writer.reopen():  # held by descriptor again, while its marker names this trace
            warn(
                f"optrace: {what}: the trace at {self.writer.directory!r} is no longer this Tracer's "
                "(another run replaced it); nothing written"
            )
            return False
        try:
            if not self.write(RowBuffer(), metadata(), roll=False):
                return False
            try:  # the marker counts the late part too: a reader names it missing when it is deleted
                write_facts(self.writer.held, facts())
            except Exception as exc:
                warn(
                    f"optrace: {what}: updating the marker of {self.writer.directory!r} failed "
                    f"({describe_exception(exc)}); the part is written"
                )
        finally:
            self.writer.held.close()
        return True
