"""The DuckDB database a reports.sql.engine.Trace runs in: a database of its own, or a catalogue of one the process shares.

Making a DuckDB database costs about 12 ms (its catalogue of built-in functions) and closing it about 3 ms, a quarter
of opening a small trace; the test suite and the library API open thousands. A Trace of at most SHARED_ROWS rows that
asks for no thread count runs instead in an in-memory database attached to a database the process shares
(`ATTACH ':memory:' AS optrace_<n>`, about 0.4 ms), through a cursor of its own whose default catalogue it is: its
tables and views are its own, removed (DETACH) when it closes or is collected. The shared database has the settings
a private one gets (its spill directory under the system's temporary directory, freed scan buffers given back as it
goes). A statement run through a Trace that may change a setting of the whole database (SET, RESET, PRAGMA, ...:
`Database.note`) retires it: Traces opened later get a new one, and it is closed, its spill directory removed, when
its last Trace closes (as it is when it spilled, and at exit). A forked child leaves its parent's databases as they
are (never closed or destroyed there) and makes its own.
"""

import atexit
import itertools
import os
import re
import shutil
import tempfile
import threading
import uuid
import weakref

__all__ = ["FLUSH_FREED_ROWS", "SHARED_ROWS", "Database", "connect"]

# Traces of at most this many rows have DuckDB give a scan's freed buffers back as it goes: 20-35 MB less at the
# peak of a 1M-row report in the same time; on 50M rows (128 ranks) its scans took 12-17% longer (benchmarks/README.md,
# stop 30).
FLUSH_FREED_ROWS = 4_000_000
# Traces of at most this many rows (and no thread count) run in the shared database, which gives freed buffers back
SHARED_ROWS = FLUSH_FREED_ROWS

# a statement that may change a setting of the whole database (DuckDB's SET and RESET change the global value of a
# global setting even without GLOBAL): one of a script that starts with one of these words, after any comments
_GLOBAL = re.compile(
    r"(?:^|;)(?:\s|--[^\n]*\n|/\*.*?\*/)*(?:SET|RESET|PRAGMA|LOAD|INSTALL|ATTACH|DETACH|CHECKPOINT|IMPORT)\b",
    re.IGNORECASE | re.DOTALL,
)
_NAMES = itertools.count()


def spill_directory():
    """A directory of its own under the system's temporary directory for DuckDB's spill files (made by DuckDB only
    when it spills): DuckDB's default is `.tmp` in the working directory, where a report must not write."""
    return os.path.join(tempfile.gettempdir(), f"optrace-duckdb-{os.getpid()}-{uuid.uuid4().hex}")


def _made(duckdb, threads=None, flush=True):
    """(a new DuckDB database of this process, its spill directory): `threads` threads (None: DuckDB's default);
    `flush`: it gives the memory of a scan's freed buffers back as it goes (FLUSH_FREED_ROWS)."""
    spill = spill_directory()
    db = duckdb.connect(config={"temp_directory": spill, **({"threads": threads} if threads else {})})
    _MADE.add(db)
    if flush:
        try:
            db.execute("SET allocator_bulk_deallocation_flush_threshold = '2MB'")
        except duckdb.Error:  # a DuckDB before the setting
            pass
    return db, spill


class _Shared:
    """The process's shared database: its connection, spill directory and open Traces (`users`)."""

    def __init__(self, duckdb):
        self.pid, self.users, self.dirty = os.getpid(), 0, False
        self.db, self.spill = _made(duckdb)

    def close(self):
        self.db.close()
        shutil.rmtree(self.spill, ignore_errors=True)


# the DuckDB databases this process made (a shared one, private ones), kept by a forked child (_keep_inherited)
_MADE = weakref.WeakSet()


def _keep_inherited():
    """In a forked child: the parent's DuckDB databases are never destroyed (destroying one in the child crashes it at
    exit: DuckDB waits on or frees the parent's threads and locks); their Traces' finalizers leave them alone too."""
    made = list(_MADE)
    if not made:
        return
    import ctypes

    for db in made:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(db))


if hasattr(os, "register_at_fork"):  # (POSIX: Windows has no fork)
    os.register_at_fork(after_in_child=_keep_inherited)

_LOCK = threading.RLock()  # (a Database collected while the lock is held releases under it)
_SHARED = None


def _close_shared():
    global _SHARED
    with _LOCK:
        if _SHARED is not None and _SHARED.pid == os.getpid():
            _SHARED.close()
        _SHARED = None


atexit.register(_close_shared)


class Database:
    """A Trace's database: `cursor` (a DuckDB connection whose default catalogue is the Trace's), `catalog` (its
    name), `spill` (its own spill directory, None in the shared database) and `close()` (also run when the Database
    is collected unclosed)."""

    def __init__(self, cursor, catalog, spill, shared=None):
        self.cursor, self.catalog, self.spill, self._dirty, self._shared = cursor, catalog, spill, [False], shared
        if shared is None:
            self._release = weakref.finalize(self, _close_private, cursor, spill, os.getpid())
        else:
            self._release = weakref.finalize(self, _detach, shared, cursor, self._dirty, catalog)
            self._release.atexit = False  # (the shared database is closed at exit: _close_shared)

    def note(self, statement):
        """Before `statement` runs: when it may change a setting of the whole shared database, Traces opened from now
        on get another, and this one is closed once its Traces are (the Traces open in it read the setting too)."""
        if self._shared is not None and not self._dirty[0] and _GLOBAL.search(statement):
            global _SHARED
            self._dirty[0] = True
            with _LOCK:
                if _SHARED is self._shared:
                    _SHARED = None

    def close(self):
        self._release()


def connect(duckdb, rows, threads):
    """The Database of a Trace of `rows` rows, with `threads` threads (None: DuckDB's default)."""
    if threads or rows > SHARED_ROWS:
        db, spill = _made(duckdb, threads, flush=rows <= FLUSH_FREED_ROWS)
        db.execute("SET enable_progress_bar = false")  # stdout is the report's
        return Database(db, "memory", spill)
    global _SHARED
    with _LOCK:
        if _SHARED is None or _SHARED.pid != os.getpid():  # (a forked child makes its own)
            _SHARED = _Shared(duckdb)
        shared = _SHARED
        shared.users += 1
    catalog = f"optrace_{next(_NAMES)}"
    try:
        cursor = shared.db.cursor()
        cursor.execute(f"ATTACH ':memory:' AS {catalog}; USE {catalog}; SET enable_progress_bar = false")
    except BaseException:
        _leave(shared, [False])
        raise
    return Database(cursor, catalog, None, shared)


def _close_private(db, spill, pid):
    if pid != os.getpid():  # a forked child's copy: the database and its spill directory are its parent's
        return
    db.close()
    shutil.rmtree(spill, ignore_errors=True)  # DuckDB removes its files at close, and the directory if it made it


def _detach(shared, cursor, dirty, catalog):
    """Remove a Trace's catalogue from the shared database and close its cursor (which its user may have closed)."""
    try:
        if shared.pid != os.getpid():  # a forked child's copy: the cursor and catalogue are its parent's
            return
        cursor.close()
        with _LOCK:  # (one statement at a time on the shared connection)
            if shared.pid == os.getpid() and _SHARED is shared:
                shared.db.execute(f"DETACH DATABASE IF EXISTS {catalog}")
    finally:
        _leave(shared, dirty)


def _leave(shared, dirty):
    """A Trace of `shared` closed: the database closed when it was its last and a statement `dirty` it or it spilled."""
    global _SHARED
    with _LOCK:
        shared.dirty = shared.dirty or dirty[0]
        shared.users -= 1
        if shared.users or not (shared.dirty or os.path.exists(shared.spill)):
            return
        if _SHARED is shared:
            _SHARED = None
        if shared.pid == os.getpid():
            shared.close()
