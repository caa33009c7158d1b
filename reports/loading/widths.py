"""How many list items and string bytes a part may hold, checked from its Parquet footer before any row is decoded.

A list column compresses without bound: one cell of 50,000,000 int64 zeros is a few KB on disk (a run of one
dictionary index) and 400 MB decoded, more as a frame. Every reader opens each part's footer first
(reports.loading.integrity.check_parts, for report, compare, export and plan alike); there, for every row group,
each list column's value count (the footer's `num_values` of the column chunk: one per item, one per empty or null
list) must be at most

    ITEMS_SLACK + rows x MAX_ITEMS_PER_ROW, and at most MAX_ITEMS in any case,

and each string column's bytes (the footer's `total_uncompressed_size` of the column chunk: its dictionary and
indices, or its plain strings, before compression; one string of 300,000,000 bytes is 14 KB with zstd and took
`optrace report` to 5.3 GB) at most

    STRING_SLACK + rows x MAX_STRING_BYTES_PER_ROW,

or the part is refused with one ReportError naming the file, the column, the count and the bound.

Why these bounds cover every part the tracer writes (tracer.store.writer.PartWriter):
  MAX_ITEMS_PER_ROW  65,536 items per row on average: a foreach over 8,192 tensors of 8 dims in every row of a
                     part. A traced row holds one shape, stride, dtype and storage id per tensor argument; a
                     training step's rows average under 20 items (tests: 45-op traces average 3).
  ITEMS_SLACK        16,777,216 items in one row group beyond that, so one row may be as wide as an op over
                     2,097,152 tensors of 8 dims (16,777,216 of 0 or 1 dims), in a part of a single row:
                     a program that passes that many tensors to one op holds them first (about 3 GB of Python
                     tensor objects), and the tracer holds the row's lists before it writes them.
  MAX_ITEMS          268,435,456 items (2 GiB of int64) in one column chunk, whatever its rows: pyarrow writes at
                     most 1,048,576 rows in a row group (ParquetWriter.write_table's row_group_size), so the
                     tracer reaches it only with rows of 256 items on average in a row group of a million rows,
                     after holding all of them in memory before the write (several GB).
  STRING_SLACK       16,777,216 bytes of strings in a column chunk, and MAX_STRING_BYTES_PER_ROW 4,096 per row
                     beyond: the tracer's strings are op, module, device and process group names and dtypes, each
                     written once in a part's dictionary; a module path of 4,096 bytes on every row of a part, or
                     16 MB of distinct names in a part of one row, is far past any model's.
"""

import os

from reports.errors import ReportError

__all__ = [
    "ITEMS_SLACK",
    "MAX_ITEMS",
    "MAX_ITEMS_PER_ROW",
    "MAX_STRING_BYTES_PER_ROW",
    "STRING_SLACK",
    "check_widths",
    "items_bound",
    "string_bound",
]

MAX_ITEMS_PER_ROW = 2**16
ITEMS_SLACK = 2**24
MAX_ITEMS = 2**28
MAX_STRING_BYTES_PER_ROW = 2**12
STRING_SLACK = 2**24


def items_bound(rows):
    """The most list items (value count of one column chunk) a row group of `rows` rows may hold."""
    return min(ITEMS_SLACK + max(int(rows), 0) * MAX_ITEMS_PER_ROW, MAX_ITEMS)


def string_bound(rows):
    """The most bytes of strings (uncompressed size of one column chunk) a row group of `rows` rows may hold."""
    return STRING_SLACK + max(int(rows), 0) * MAX_STRING_BYTES_PER_ROW


def check_widths(path, part, info, cache=None):
    """ReportError when a list column of part file `part` (its footer `info`, a pyarrow FileMetaData) holds more
    items in a row group than items_bound allows, or a string column more bytes than string_bound; nothing is
    decoded. `cache`: a dict kept across the parts of one trace (the list and string columns of a schema, found once)."""
    cache = {} if cache is None else cache
    if cache.get("schema") is None or not info.schema.equals(cache["schema"]):
        cache["schema"] = info.schema
        cache["lists"] = [j for j in range(info.num_columns) if info.schema.column(j).max_repetition_level > 0]
        cache["strings"] = [j for j in range(info.num_columns) if info.schema.column(j).physical_type == "BYTE_ARRAY"]
    for i in range(info.num_row_groups):
        group = info.row_group(i)
        strings = string_bound(group.num_rows)
        for j in cache["strings"]:
            chunk = group.column(j)
            if chunk.total_uncompressed_size > strings:
                raise ReportError(
                    f"{path}: column {chunk.path_in_schema.split('.')[0]!r} of {os.path.basename(part)} holds "
                    f"{chunk.total_uncompressed_size:,} bytes of strings in {group.num_rows:,} row(s); "
                    f"expected at most {strings:,} ({STRING_SLACK:,} + {MAX_STRING_BYTES_PER_ROW:,} per "
                    "row): a damaged or hand-made part, not read"
                )
        bound = items_bound(group.num_rows)
        for j in cache["lists"]:
            chunk = group.column(j)
            if chunk.num_values > bound:
                name = chunk.path_in_schema.split(".")[0]
                cap = (
                    "the most in any row group"
                    if bound == MAX_ITEMS
                    else f"{ITEMS_SLACK:,} + {MAX_ITEMS_PER_ROW:,} per row"
                )
                raise ReportError(
                    f"{path}: column {name!r} of {os.path.basename(part)} holds {chunk.num_values:,} list "
                    f"items in {group.num_rows:,} row(s); expected at most {bound:,} ({cap}): a damaged "
                    "or hand-made part, not read"
                )
