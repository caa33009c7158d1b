"""Could optrace have written this? Column types, nulls, value ranges, storage ids and bounded JSON.

A trace is read only after its values pass these checks; anything else is one
ReportError naming the trace, the column or field, the bad value and what was
expected, never a traceback deep inside a report and never a figure made from it:

  types    every column's Arrow type is the one tracer.schema.ARROW_SCHEMA gives it
           (read from the table, so a column added there is checked too); a string
           column may be stored plain or dictionary-encoded
  nulls    the columns NOT_NULL names hold none (a column added to the schema may hold
           nulls until it is named there; causal, busy_ns, comm_bytes, group_size do)
  ranges   counts, bytes and times are >= 0; FLOPs at most MAX_ROW_FLOPS per row, bytes at
           most MAX_BYTES, storage ids below `max_storage_id` (ids are handed out one by one as
           storages appear, so a trace of n rows cannot use ids far beyond n)
  values   phase, flop_kind and grad_mode hold only the values tracer.schema names (ALLOWED; grad_mode
           may be null: unknown, before v4)
  seq      strictly increasing in write order (a repeated part or a repeated row is refused)
  JSON     the metadata and the marker are bounded in size and nesting depth before they
           are parsed, and their fields must have the types the tracer writes, their numbers
           finite and in the ranges META_RANGES gives (tokens > 0, a step time > 0, rank < world_size)

The checks of the rows are in reports.loading.row_checks, those of the JSON in reports.loading.meta_checks; every
public name of both is importable from here.
"""

from reports.loading.meta_checks import (
    COUNTS,
    DEVICE_FIELDS,
    MAX_JSON_DEPTH,
    META_FIELDS,
    META_RANGES,
    NESTED,
    PARAMETER_FIELDS,
    PARAMETER_NEEDED,
    PARAMETER_TABLES,
    check_metadata,
    check_metadata_ids,
    parse_json,
)
from reports.loading.row_checks import (
    ALLOWED,
    ID_SLACK,
    ITEMS_NOT_NULL,
    LIST_NOT_NULL,
    MAX_BYTES,
    MAX_ROW_FLOPS,
    NOT_NULL,
    RANGES,
    STORAGE_ID_COLUMNS,
    check_footers,
    check_rows,
    check_schema,
    max_storage_id,
)

# every public name of the checks, from here as before they had modules of their own
__all__ = [
    "ALLOWED",
    "COUNTS",
    "DEVICE_FIELDS",
    "ID_SLACK",
    "ITEMS_NOT_NULL",
    "LIST_NOT_NULL",
    "MAX_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_ROW_FLOPS",
    "META_FIELDS",
    "META_RANGES",
    "NESTED",
    "NOT_NULL",
    "PARAMETER_FIELDS",
    "PARAMETER_NEEDED",
    "PARAMETER_TABLES",
    "RANGES",
    "STORAGE_ID_COLUMNS",
    "check_footers",
    "check_metadata",
    "check_metadata_ids",
    "check_rows",
    "check_schema",
    "max_storage_id",
    "parse_json",
]
