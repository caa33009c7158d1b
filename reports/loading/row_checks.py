"""The checks of a trace's rows (reports.loading.validate lists them all): column types, nulls, value ranges,
storage ids, the values of string columns and seq order, from the rows themselves (check_rows, check_schema) or from
the parts' Parquet statistics (check_footers)."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import numpy_of
from reports.errors import ReportError
from tracer.schema import ARROW_SCHEMA, FLOP_KINDS, GRAD_MODES, PHASES

MAX_ROW_FLOPS = (
    10**18
)  # 1 EFLOP in one op: ~1,000 s of an H100; a bigger count is damage (and sums near int64 overflow)
MAX_BYTES = 2**60  # 1 EiB in one op or live at once
ID_SLACK = 2**20  # storage ids allowed beyond 16 per row (parameters, storages of lost rows)
NOT_NULL = frozenset(
    {
        "seq",
        "step",
        "op",
        "phase",
        "module",
        "input_shapes",
        "input_dtypes",
        "input_strides",
        "output_shapes",
        "output_dtypes",
        "output_strides",
        "device",
        "input_storage_ids",
        "output_storage_ids",
        "freed_storage_ids",
        "is_view",
        "inplace",
        "flops",
        "flop_kind",
        "bytes_allocated",
        "live_bytes",
        "bytes_read",
        "bytes_written",
        "duration_ns",
        "recompute",
        "output_storage_bytes",
        "start_ns",
        "layout",
        "process_group",
    }
)
STORAGE_ID_COLUMNS = ("input_storage_ids", "output_storage_ids", "freed_storage_ids")
# column: (lowest, highest, what it counts): values outside are damage
RANGES = {
    "seq": (0, None, "op index"),
    "step": (0, None, "step"),
    "flops": (0, MAX_ROW_FLOPS, "FLOPs"),
    "bytes_allocated": (0, MAX_BYTES, "bytes"),
    "live_bytes": (0, MAX_BYTES, "bytes"),
    "bytes_read": (0, MAX_BYTES, "bytes"),
    "bytes_written": (0, MAX_BYTES, "bytes"),
    "duration_ns": (0, None, "ns"),
    "busy_ns": (0, None, "ns"),
    "start_ns": (0, None, "ns since the epoch"),
    "comm_bytes": (0, MAX_BYTES, "bytes"),
    "group_size": (1, None, "ranks"),
    "output_storage_bytes": (0, MAX_BYTES, "bytes"),
}
# string column: the values the tracer writes (tracer.schema); another is damage (the phases would not add up)
ALLOWED = {"phase": PHASES, "flop_kind": FLOP_KINDS, "grad_mode": GRAD_MODES}
_EXPECTED = {field.name: field.type for field in ARROW_SCHEMA}
# The list columns that hold a list in every row: their Parquet statistics cannot tell a null cell from an empty
# list, so a reader that checks from the statistics scans these cells (reports.sql.engine).
LIST_NOT_NULL = tuple(f.name for f in ARROW_SCHEMA if f.name in NOT_NULL and pa.types.is_list(f.type))
# Of those, the lists of integers check_rows also refuses a null item in (the statistics count one as an empty list).
ITEMS_NOT_NULL = tuple(name for name in LIST_NOT_NULL if name in STORAGE_ID_COLUMNS or name in RANGES)


def _same_type(got, expected):
    """`got` is `expected`, up to how strings are stored (plain, large or dictionary-encoded)."""
    if pa.types.is_dictionary(expected):
        expected = expected.value_type
    if pa.types.is_dictionary(got) and pa.types.is_integer(got.index_type):
        got = got.value_type
    if pa.types.is_string(expected) or pa.types.is_large_string(expected):
        return pa.types.is_string(got) or pa.types.is_large_string(got)
    if pa.types.is_list(expected):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and _same_type(
            got.value_type, expected.value_type
        )
    return got == expected


def _type_name(typ):
    return str(typ).replace("dictionary<values=string, indices=int32, ordered=0>", "string")


def check_schema(path, name, schema):
    """Raise ReportError for the first column of `schema` (a part's Arrow schema) whose type is not the trace schema's."""
    for field in schema:
        expected = _EXPECTED.get(field.name)
        if expected is None or _same_type(field.type, expected):
            continue
        if pa.types.is_null(field.type) and field.name not in NOT_NULL:
            continue  # a column of nulls only, where nulls are allowed
        raise ReportError(
            f"{path}: column {field.name!r} of {name} has type {_type_name(field.type)}, "
            f"expected {_type_name(expected)} (not written by optrace, or damaged)"
        )


def max_storage_id(rows):
    """The highest storage id a trace of `rows` rows (on disk, lost or missing) can hold."""
    return ID_SLACK + 16 * max(int(rows), 0)


def _at(table, index):
    """' at seq S' for row `index` of `table`, or ' at row R' when its seq is unknown."""
    if "seq" in table.column_names:
        seq = table.column("seq")[index].as_py()
        if seq is not None:
            return f" at seq {seq}"
    return f" at row {index}"


def _first(mask):
    return int(np.flatnonzero(mask.to_numpy(zero_copy_only=False))[0])


def _values(column):
    """(flat values, row of a value's index) of a column of ints or of lists of ints (chunks kept as they are)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return column, lambda i: i

    def row_of(i):  # only when a value is bad: the list that holds it
        offsets = np.concatenate([[0], np.cumsum([len(c.flatten()) for c in chunks])])
        chunk = int(np.searchsorted(offsets, i, side="right") - 1)
        local = chunks[chunk].offsets.to_numpy()
        return sum(len(c) for c in chunks[:chunk]) + int(
            np.searchsorted(local - local[0], i - offsets[chunk], side="right") - 1
        )

    return pa.chunked_array([c.flatten() for c in chunks], type=column.type.value_type), row_of


def check_rows(path, table, id_limit, last_seq=None):
    """Raise ReportError for the first null, out-of-range value or non-increasing seq in `table`
    (a Table or RecordBatch of a trace's rows, in write order). `last_seq`: the seq before the
    table's first row (batches read one after another). Returns the table's last seq."""
    for name in table.column_names:
        column = table.column(name)
        expected = _EXPECTED.get(name)
        if expected is None:
            continue
        if name in NOT_NULL and column.null_count:
            index = _first(pc.is_null(column))
            raise ReportError(
                f"{path}: column {name!r} is null{_at(table, index)} ({column.null_count} null value(s)); "
                f"expected {_type_name(expected)} values"
            )
        if name in ALLOWED:
            _check_allowed(path, table, name, column)
            continue
        limits = RANGES.get(name)
        ids = name in STORAGE_ID_COLUMNS
        if limits is None and not ids:
            continue
        values, row_of = _values(column)
        if not pa.types.is_integer(values.type) or not len(values):
            continue
        if (name in NOT_NULL or ids) and values.null_count:
            raise ReportError(
                f"{path}: column {name!r} holds a null item{_at(table, row_of(_first(pc.is_null(values))))}; "
                "expected int64 items"
            )
        low, high, unit = limits if limits is not None else (0, id_limit, "storage id")
        if ids:
            high = id_limit
        extremes = pc.min_max(values)
        lo, hi = extremes["min"].as_py(), extremes["max"].as_py()
        if lo is not None and lo < low:
            bad = row_of(_first(pc.less(values, low)))
        elif hi is not None and high is not None and hi > high:
            over = pc.greater(values, high)
            if name == "flops" and "flops_bound" in table.column_names:  # a count clamped to int64 is a flagged bound
                over = pc.and_(over, pc.invert(pc.fill_null(table.column("flops_bound"), False)))
                if not pc.any(over).as_py():
                    continue
            bad = row_of(_first(over))
        else:
            continue
        raise _out_of_range(path, name, lo if lo < low else hi, _at(table, bad), low, high, unit)
    if "seq" in table.column_names and len(table):
        seq = numpy_of(table.column("seq"))  # (Array.to_numpy loads pandas)
        if last_seq is not None:
            seq = np.concatenate([[last_seq], seq])
        back = np.flatnonzero(np.diff(seq) <= 0)
        if len(back):
            i = int(back[0])
            raise ReportError(
                f"{path}: seq {int(seq[i + 1])} follows seq {int(seq[i])}; expected seq to increase "
                "row by row (a part or rows repeated?)"
            )
        return int(seq[-1])
    return last_seq


def _check_allowed(path, table, name, column):
    """ReportError for the first value of string column `name` that is not one of ALLOWED[name]."""
    found = pc.unique(column)
    if pa.types.is_dictionary(found.type):
        found = found.dictionary_decode()
    bad = [v for v in found.to_pylist() if v is not None and v not in ALLOWED[name]]
    if bad:
        raise _not_allowed(path, name, bad[0], _at(table, _first(pc.equal(column.cast(pa.string()), bad[0]))))


def _not_allowed(path, name, value, where):
    return ReportError(
        f"{path}: column {name!r} holds {value!r}{where}; expected one of {', '.join(ALLOWED[name])} "
        "(a damaged or hand-edited trace?)"
    )


def _out_of_range(path, name, value, where, low, high, unit):
    bound = f"{low} to {high:,}" if high is not None else f">= {low}"
    return ReportError(
        f"{path}: column {name!r} holds {value:,}{where}; expected {unit} {bound} (a damaged or hand-edited trace?)"
    )


def check_footers(path, footers, columns, id_limit, cache=None):
    """check_rows for the `columns` a reader leaves in the files, from each part's Parquet statistics
    (null counts, min and max; no read): `footers` [(part file, FileMetaData)]. A part written without
    statistics has those columns read and checked row by row. List columns: storage id ranges only
    (none when `id_limit` is None). `cache`: a dict kept across calls for the parts of one trace."""
    import os

    import pyarrow.parquet as pq

    if not columns:
        return
    wanted = {}
    for name in columns:
        if name in STORAGE_ID_COLUMNS and id_limit is not None or name in RANGES and pa.types.is_list(_EXPECTED[name]):
            wanted[f"{name}.list.element"] = name
        elif name in _EXPECTED and not pa.types.is_list(_EXPECTED[name]):
            wanted[name] = name
    cache = {} if cache is None else cache
    for part, info in footers:
        where = f" in {os.path.basename(part)}"
        if "schema" not in cache or not info.schema.equals(
            cache["schema"]
        ):  # the leaf columns to look at, once per schema
            cache["schema"] = info.schema
            cache["leaves"] = [j for j in range(info.num_columns) if info.schema.column(j).path in wanted]
        leaves = cache["leaves"]
        for i in range(info.num_row_groups):
            group = info.row_group(i)
            for j in leaves:
                chunk = group.column(j)
                name = wanted[chunk.path_in_schema]
                stats = chunk.statistics
                if stats is None or stats.null_count is None:
                    present = set(info.schema.to_arrow_schema().names)  # a missing column: the reader names it
                    check_rows(
                        path, pq.ParquetFile(part).read(columns=sorted(set(wanted.values()) & present)), id_limit
                    )
                    break
                if name in NOT_NULL and stats.null_count and name == chunk.path_in_schema:
                    raise ReportError(
                        f"{path}: column {name!r} is null{where} ({stats.null_count} null value(s)); "
                        f"expected {_type_name(_EXPECTED[name])} values"
                    )
                limits = RANGES.get(name) or ((0, id_limit, "storage id") if name in STORAGE_ID_COLUMNS else None)
                if limits is None or not stats.has_min_max or not isinstance(stats.min, int):
                    continue
                low, high, unit = limits
                high = id_limit if name in STORAGE_ID_COLUMNS else high
                if stats.min < low:
                    raise _out_of_range(path, name, stats.min, where, low, high, unit)
                if high is not None and stats.max > high:
                    raise _out_of_range(path, name, stats.max, where, low, high, unit)
