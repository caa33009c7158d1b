"""Rows to Parquet: one part file per flushed row group, renamed into place.

A part is written under a hidden temporary name and renamed when complete, so
a reader (or a process killed mid-write) never sees a half-written part:
pyarrow's dataset discovery skips names that start with '.'.
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from tracer.errors import TraceError
from tracer.schema import ARROW_SCHEMA, METADATA_KEY, PART_GLOB, part_name

_TYPES = [field.type for field in ARROW_SCHEMA]


def prepare_directory(path):
    """Check that `path` can hold a trace and clear an earlier trace there.

    Raises TraceError (before anything runs) when the parent directory is
    missing or not writable, or when `path` is a file or a directory holding
    anything other than an earlier optrace trace."""
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise TraceError(f"cannot write trace {path!r}: directory {parent!r} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TraceError(f"cannot write trace {path!r}: directory {parent!r} is not writable")
    try:
        _clear_or_create(path)
    except OSError as exc:
        raise TraceError(f"cannot write trace {path!r}: {exc.strerror or exc}") from None
    return path


def _clear_or_create(path):
    if os.path.isdir(path):
        import fnmatch

        names = os.listdir(path)
        other = [n for n in names if not (fnmatch.fnmatch(n, PART_GLOB) or n.startswith(".part-"))]
        if other:
            raise TraceError(
                f"cannot write trace {path!r}: it is a directory holding files that are not optrace parts "
                f"(e.g. {sorted(other)[0]!r}); choose a new path"
            )
        for name in names:
            os.remove(os.path.join(path, name))
    elif os.path.exists(path):
        raise TraceError(f"cannot write trace {path!r}: a file of that name exists; a trace is a directory of parts")
    else:
        os.mkdir(path)


class PartWriter:
    """Writes lists of row tuples (in schema column order) as numbered parts."""

    def __init__(self, directory):
        self.directory = directory
        self.parts = 0
        self.rows = 0

    def write(self, rows, metadata):
        columns = list(zip(*rows)) if rows else [[] for _ in _TYPES]
        arrays = [pa.array(col, type=typ) for col, typ in zip(columns, _TYPES)]
        blob = json.dumps(metadata, default=str).encode()
        table = pa.Table.from_arrays(arrays, schema=ARROW_SCHEMA.with_metadata({METADATA_KEY: blob}))
        name = part_name(self.parts)
        tmp = os.path.join(self.directory, "." + name + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, os.path.join(self.directory, name))
        self.parts += 1
        self.rows += len(rows)
