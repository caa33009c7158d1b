"""The SQL text the engine runs: the view files and their statements (`statements`: [(view name, its SELECT,
portable?)] of a .sql file, parsed once per process), literals (`literal`; `file_literal`: a part file's path as DuckDB
must be given it) and tracer.schema's columns in a select from a run's parts (`named_columns`) or from a table in
memory (`typed_column`)."""

import os
import re

import pyarrow as pa

from tracer.schema import ARROW_SCHEMA

__all__ = ["GLOB", "VIEWS_SQL", "VIEW_FILES", "file_literal", "literal", "named_columns", "statements", "typed_column"]

VIEWS_SQL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "views.sql")
# Further view files, each read after views.sql in name order: a report family's views in a file of its own.
VIEW_FILES = (
    VIEWS_SQL,
    *sorted(
        os.path.join(os.path.dirname(VIEWS_SQL), f)
        for f in os.listdir(os.path.dirname(VIEWS_SQL))
        if f.endswith(".sql") and f != "views.sql"
    ),
)
CREATE = re.compile(r"^CREATE VIEW (\w+) AS\s*$", re.MULTILINE)
GLOB = re.compile(r"([*?\[])")


SQL_TYPES = {"string": "VARCHAR", "bool": "BOOLEAN", "int64": "BIGINT"}  # of tracer.schema's columns


def named_columns(lacking):
    """The trace's columns by name, for a select from one run's parts: a column its version lacks (`lacking`) as a
    typed NULL."""

    def null(field):
        typ = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        return f'CAST(NULL AS {SQL_TYPES[str(typ)]}) AS "{field.name}"'

    return ", ".join(null(f) if f.name in lacking else f'"{f.name}"' for f in ARROW_SCHEMA)


def _sql_type(typ):
    """DuckDB's name of an Arrow type of tracer.schema (a dictionary as its values)."""
    if pa.types.is_dictionary(typ):
        return _sql_type(typ.value_type)
    if pa.types.is_list(typ):
        return _sql_type(typ.value_type) + "[]"
    return SQL_TYPES[str(typ)]


def typed_column(field, present):
    """A column of an in-memory table (Trace.over) as `rows` reads it: cast to its schema type, or a typed NULL."""
    value = f'"{field.name}"' if present else "NULL"
    return f'CAST({value} AS {_sql_type(field.type)}) AS "{field.name}"'


_PARSED = {}  # {path: ((mtime_ns, size), statements)}: each .sql file parsed once per process (every Trace reads them)


def statements(path=VIEWS_SQL):
    """[(view name, its SELECT, portable?)] of views.sql in order: `portable` when its comment says the
    view runs unchanged in polars' SQL too. Parsed again only when the file changed (its mtime or size)."""
    found = os.stat(path)
    stamp = (found.st_mtime_ns, found.st_size)
    cached = _PARSED.get(path)
    if cached is None or cached[0] != stamp:
        cached = _PARSED[path] = (stamp, _parse(path))
    return list(cached[1])


def _parse(path):
    """statements() of the file at `path`, read now."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for chunk in re.split(r"^;\s*$", text, flags=re.MULTILINE):
        found = CREATE.search(chunk)
        if not found:
            continue
        comment = chunk[: found.start()].strip().splitlines()
        portable = any(line.startswith("-- portable") for line in comment[-12:])
        out.append((found.group(1), chunk[found.end() :].strip(), portable))
    return out


def literal(text):
    """A SQL string literal holding `text`."""
    return "'" + str(text).replace("'", "''") + "'"


def file_literal(path):
    """A part file as DuckDB must be given it: absolute, its glob characters escaped ([*], [?], [[])."""
    return literal(GLOB.sub(r"[\1]", os.path.abspath(path)))
