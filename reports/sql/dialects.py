"""The report views in Spark SQL's and Trino's spelling, generated from the one DuckDB source by sqlglot.

    from reports.sql.dialects import views
    for statement in views("spark").values():   # after `rows` is defined over the trace's parts
        spark.sql(statement)

    python -m reports.sql.dialects spark        # every statement, each followed by a line holding only ';'
    python -m reports.sql.dialects trino --columns   # the trace's columns and their types, for a table's DDL

`views(dialect)` reads the view files of reports.sql.engine.VIEW_FILES (views.sql, then the others in name order:
the order in which a view reads only those before it), parses each view's SELECT as DuckDB's SQL and writes it in
the dialect: Spark's arrays are 0-based and its `size` counts a list, Trino's `cardinality`, DuckDB's string
`||` becomes Trino's `concat`, a backslash in a string literal is doubled for Spark. Two rules keep the meaning
where sqlglot's reading of DuckDB leaves it out:

  - DuckDB's `list[i]` is NULL past the list's end: it is written `try_element_at` (Spark) and `element_at`
    (Trino), which are NULL there too, where Spark's `list[i - 1]` (ANSI mode, Spark 4's default) and Trino's
    `list[i]` raise;
  - a function sqlglot does not know it passes through by its DuckDB name, which the dialect may lack, and a
    slice `list[a:b]` it leaves as it is: both raise ValueError here, naming the view (the source spells such a
    construct portably instead: `array_slice`, `array_length`, `list_min`).

Spark's statements make temporary views (`CREATE OR REPLACE TEMPORARY VIEW`: `rows` is one, from the parts'
DataFrame), Trino's views in the session's catalog and schema (`CREATE OR REPLACE VIEW`). docs/sql_dialects.md says
how to define `rows` in each and what differs (sums of int64 are int64 there, int128 in DuckDB). `columns(dialect)`:
the trace's columns (tracer.schema.ARROW_SCHEMA) with their types in the dialect, for an engine that needs a table
declared over the parts (Trino's Hive connector).
"""

import sys

import pyarrow as pa

from reports.errors import ReportError
from reports.sql.engine import VIEW_FILES, statements
from tracer.schema import ARROW_SCHEMA

__all__ = ["DIALECTS", "columns", "views"]

# dialect: how a view is created in it
DIALECTS = {"duckdb": "CREATE VIEW", "spark": "CREATE OR REPLACE TEMPORARY VIEW", "trino": "CREATE OR REPLACE VIEW"}


def views(dialect):
    """{view name: its CREATE statement in `dialect`} for every view of the report, in an order in which each reads
    only `rows` and the views before it. `dialect`: 'spark', 'trino' or 'duckdb' (the source, unchanged)."""
    _known(dialect)
    out = {}
    for path in VIEW_FILES:
        for name, body, _ in statements(path):
            select = body if dialect == "duckdb" else _transpile(name, body, dialect)
            out[name] = f"{DIALECTS[dialect]} {name} AS\n{select}"
    return out


def columns(dialect):
    """ "name TYPE, ..." of every column of the trace schema in `dialect` (strings plain or dictionary-encoded are
    VARCHAR / STRING, lists arrays)."""
    from sqlglot import exp

    _known(dialect)

    def duckdb_type(typ):
        if pa.types.is_dictionary(typ):
            return duckdb_type(typ.value_type)
        if pa.types.is_list(typ):
            return duckdb_type(typ.value_type) + "[]"
        return {"int64": "BIGINT", "string": "VARCHAR", "bool": "BOOLEAN"}[str(typ)]

    return ", ".join(
        f"{field.name} {exp.DataType.build(duckdb_type(field.type), dialect='duckdb').sql(dialect)}"
        for field in ARROW_SCHEMA
    )


def _known(dialect):
    if dialect not in DIALECTS:
        raise ReportError(f"dialect {dialect!r}: expected one of {', '.join(DIALECTS)}")


def _transpile(name, body, dialect):
    """One view's SELECT (DuckDB's SQL) in `dialect`, by sqlglot, with the rules of the module's docstring."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(body, read="duckdb")
    for node in tree.find_all(exp.Anonymous):
        raise ValueError(f"view {name}: sqlglot does not know DuckDB's {node.name}(); spell it portably in the source")
    for node in tree.find_all(exp.Bracket):
        if len(node.expressions) != 1 or isinstance(node.expressions[0], exp.Slice):
            raise ValueError(
                f"view {name}: {node.sql('duckdb')} is a slice sqlglot leaves as it is (or an index of "
                "several items); write array_slice"
            )
        node.set("safe", True)  # DuckDB's list[i] is NULL past the end
    return tree.sql(dialect=dialect, pretty=True, unsupported_level=sqlglot.ErrorLevel.RAISE)


def main(argv=None):
    """`python -m reports.sql.dialects DIALECT [--columns]`: print every view's statement, each followed by a line
    holding only ';' (the format of views.sql); with --columns, the trace's columns and types instead."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or args[1:] not in ([], ["--columns"]):
        print(f"usage: python -m reports.sql.dialects {{{','.join(DIALECTS)}}} [--columns]", file=sys.stderr)
        return 2
    try:
        if args[1:]:
            print(columns(args[0]))
            return 0
        found = views(args[0])
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for statement in found.values():
        print(statement)
        print(";")
    return 0


if __name__ == "__main__":
    sys.exit(main())
