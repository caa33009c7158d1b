"""Could optrace have written this? Column types, nulls, value ranges, storage ids and bounded JSON.

A trace is read only after its values pass these checks; anything else is one
ReportError naming the trace, the column or field, the bad value and what was
expected, never a traceback deep inside a report and never a figure made from it:

  types    every column's Arrow type is the one tracer/schema.py ARROW_SCHEMA gives it
           (read from the table, so a column added there is checked too); a string
           column may be stored plain or dictionary-encoded
  nulls    the columns NOT_NULL names hold none (a column added to the schema may hold
           nulls until it is named there; causal, busy_ns, comm_bytes, group_size do)
  ranges   counts, bytes and times are >= 0; FLOPs at most MAX_ROW_FLOPS per row, bytes at
           most MAX_BYTES, storage ids below `max_storage_id` (ids are handed out one by one as
           storages appear, so a trace of n rows cannot use ids far beyond n)
  values   phase, flop_kind and grad_mode hold only the values tracer/schema.py names (ALLOWED; grad_mode
           may be null: unknown, before v4)
  seq      strictly increasing in write order (a repeated part or a repeated row is refused)
  JSON     the metadata and the marker are bounded in size and nesting depth before they
           are parsed, and their fields must have the types the tracer writes, their numbers
           finite and in the ranges META_RANGES gives (tokens > 0, a step time > 0, rank < world_size)
"""

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.errors import ReportError
from tracer.schema import ARROW_SCHEMA, FLOP_KINDS, GRAD_MODES, MAX_TOKENS, PHASES, ROLE_RECORDS

__all__ = [
    "ALLOWED",
    "ITEMS_NOT_NULL",
    "MAX_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_ROW_FLOPS",
    "check_footers",
    "check_metadata",
    "check_metadata_ids",
    "check_rows",
    "check_schema",
    "max_storage_id",
    "parse_json",
]

MAX_JSON_DEPTH = 64  # the tracer's metadata nests 4 deep
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
# string column: the values the tracer writes (tracer/schema.py); another is damage (the phases would not add up)
ALLOWED = {"phase": PHASES, "flop_kind": FLOP_KINDS, "grad_mode": GRAD_MODES}
_EXPECTED = {field.name: field.type for field in ARROW_SCHEMA}
# The list columns that hold a list in every row: their Parquet statistics cannot tell a null cell from an empty
# list, so a reader that checks from the statistics scans these cells (reports/sql/engine.py).
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
        seq = table.column("seq").to_numpy()
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


# ------------------------------------------------------------------ JSON: the metadata and the marker
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def parse_json(path, raw, what, where, limit, invalid=ReportError):
    """`raw` (bytes or str) parsed as JSON, after checking its size (at most `limit` bytes) and nesting
    depth (at most MAX_JSON_DEPTH): a hostile file cannot exhaust memory or the stack. ReportError otherwise;
    for text that is not JSON, `invalid` when given."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > limit:
        raise ReportError(f"{path}: {what} is {len(raw):,} bytes ({where}), more than the {limit:,} optrace reads")
    depth = raw.count(b"[") + raw.count(b"{")  # at most this deep: most metadata needs no closer look
    if depth > MAX_JSON_DEPTH:
        brackets = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
        step = (
            (brackets == ord("[")).astype(np.int64)
            + (brackets == ord("{"))
            - (brackets == ord("]"))
            - (brackets == ord("}"))
        )
        depth = int(np.cumsum(step).max(initial=0))
    if depth > MAX_JSON_DEPTH:
        raise ReportError(
            f"{path}: {what} nests {depth} levels deep ({where}), more than the {MAX_JSON_DEPTH} optrace reads"
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        if invalid is not ReportError:
            return invalid
        raise ReportError(f"{path}: {what} is not valid JSON ({where}: {str(exc).splitlines()[0]})") from None


_INT, _NUM, _STR, _BOOL, _OBJ, _LIST = "an int", "a number", "a string", "a boolean", "an object", "a list"
# field: what it must be when present and not null (the fields the reports read)
META_FIELDS = {
    "schema_version": _INT,
    "complete": _BOOL,
    "run_name": _STR,
    "tokens": _INT,
    "root_module": _STR,
    "trace_id": _STR,
    "rows": _INT,
    "parts": _INT,
    "lost_rows": _INT,
    "record_errors": _INT,
    "backward_unnamed_rows": _INT,
    "rank": _INT,
    "world_size": _INT,
    "device": _OBJ,
    "params": _OBJ,
    "parameters": _OBJ,
    "storage_roles": _OBJ,
    "step_time": _OBJ,
    "ceiling": _OBJ,
    "bandwidth": _OBJ,
    "timing": _OBJ,
    "unsharded_parameters": _OBJ,
    "compiled_ran_eagerly": _BOOL,
    "attention": _OBJ,
    "compiled_regions_eager": _OBJ,
    "untraced_optimizer_steps": _INT,
    "cycles_without_step": _INT,
    "optimizer_state_found_late": _INT,
    "optimizer_params": _INT,
    "error": _STR,
    "process_groups": _LIST,
}
DEVICE_FIELDS = {
    "type": _STR,
    "name": _STR,
    "cores": _INT,
    "threads": _INT,
    "mhz": _NUM,
    "max_mhz": _NUM,
    "isa": _LIST,
    "multi_processor_count": _INT,
    "total_memory_bytes": _INT,
    "fake": _BOOL,
}
PARAMETER_FIELDS = {"storage_id": _INT, "numel": _INT, "shape": _LIST, "dtype": _STR}
PARAMETER_NEEDED = ("storage_id", "numel", "dtype")  # read by every report of a parameter
PARAMETER_TABLES = (("parameters", "parameter"), ("unsharded_parameters", "unsharded parameter"))  # (key, word)
NESTED = {
    "params": dict.fromkeys(("total", "trainable", "embedding"), _INT),
    "step_time": {"median_s": _NUM},
    "ceiling": {"flops_per_s": _NUM, "dtype": _STR},
    "bandwidth": {"bytes_per_s": _NUM},
    "device": DEVICE_FIELDS,
    "compiled_regions_eager": {"calls": _INT, "names": _OBJ, "other_calls": _INT},
}
COUNTS = (
    "rows",
    "parts",
    "lost_rows",
    "record_errors",
    "backward_unnamed_rows",
    "untraced_optimizer_steps",
    "cycles_without_step",
    "optimizer_state_found_late",
    "optimizer_params",
)
# (where, field): (lowest, highest, what it counts, whether the lowest itself is out): a number outside, or not
# finite, is damage. `where`: None for the metadata itself, else the object it is in.
META_RANGES = {
    (None, "schema_version"): (1, None, "a schema version", False),
    (None, "tokens"): (1, MAX_TOKENS, "tokens per step", False),
    (None, "world_size"): (1, None, "ranks", False),
    (None, "rank"): (0, None, "a rank", False),
    ("step_time", "median_s"): (0, None, "seconds", True),
    ("ceiling", "flops_per_s"): (0, None, "FLOP/s", True),
    ("bandwidth", "bytes_per_s"): (0, None, "bytes/s", True),
    ("device", "mhz"): (0, None, "MHz", False),
    ("device", "max_mhz"): (0, None, "MHz", False),  # 0: unknown, no peak
    ("device", "cores"): (1, None, "a count", False),
    ("device", "threads"): (1, None, "a count", False),
    ("device", "multi_processor_count"): (1, None, "a count", False),
    ("device", "total_memory_bytes"): (0, MAX_BYTES, "bytes", False),
    **{("params", key): (0, MAX_BYTES, "a count", False) for key in ("total", "trainable", "embedding")},
}


def _is(value, kind):
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {_STR: str, _BOOL: bool, _OBJ: dict, _LIST: list}[kind])


def _check_fields(path, what, found, fields):
    for key, kind in fields.items():
        value = found.get(key)
        if value is not None and not _is(value, kind):
            raise ReportError(f"{path}: {what} {key!r} is {_short(value)}, expected {kind}")


def _check_range(path, what, key, value, low, high, unit, open_low):
    """ReportError when the number `value` (None: absent) is not finite or is outside `low` (excluded when
    `open_low`) to `high` (None: no bound)."""
    if value is None or (
        math.isfinite(value) and (value > low if open_low else value >= low) and (high is None or value <= high)
    ):
        return
    bound = f"> {low}" if open_low else f"{low} to {high:,}" if high is not None else f">= {low}"
    raise ReportError(f"{path}: {what} {key!r} is {_short(value)}, expected {unit} {bound}")


def _short(value):
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_metadata(path, meta, what="optrace metadata", where=None, roles_only=False):
    """Raise ReportError when a field the reports read has another type than the tracer writes.
    `roles_only`: only the storage roles (all that is read of a part's metadata but the newest's)."""
    if not isinstance(meta, dict):
        raise ReportError(f"{path}: {what} is not a JSON object")
    what = f"{what} ({where})" if where else what
    if roles_only:
        _check_roles(path, what, meta)
        return
    _check_fields(path, what, meta, META_FIELDS)
    for key in COUNTS:
        if (meta.get(key) or 0) < 0:
            raise ReportError(f"{path}: {what} {key!r} is {meta[key]}, expected a count >= 0")
    for key, fields in NESTED.items():
        if meta.get(key) is not None:
            _check_fields(path, f"{what} {key}", meta[key], fields)
    for (within, key), limits in META_RANGES.items():
        found = meta if within is None else meta.get(within) or {}
        _check_range(path, what if within is None else f"{what} {within}", key, found.get(key), *limits)
    rank, world = meta.get("rank"), meta.get("world_size")
    if rank is not None and world is not None and rank >= world:
        raise ReportError(f"{path}: {what} 'rank' is {rank}, expected a rank 0 to {world - 1} (world_size {world})")
    _check_groups(path, what, meta.get("process_groups") or [], world)
    for key, kind in PARAMETER_TABLES:
        for name, info in (meta.get(key) or {}).items():
            if not isinstance(info, dict):
                raise ReportError(f"{path}: {what} {kind} {name!r} is {_short(info)}, expected an object")
            _check_fields(path, f"{what} {kind} {name!r}", info, PARAMETER_FIELDS)
            missing = [field for field in PARAMETER_NEEDED if info.get(field) is None]
            if missing:  # the tracer has written them since its first version
                raise ReportError(f"{path}: {what} {kind} {name!r} has no {', '.join(map(repr, missing))}")
            _check_range(path, f"{what} {kind} {name!r}", "numel", info["numel"], 0, MAX_BYTES, "a count", False)
            if not all(_is(d, _INT) and d >= 0 for d in info.get("shape") or ()):
                raise ReportError(
                    f"{path}: {what} {kind} {name!r} shape is {_short(info['shape'])}, expected a list of ints >= 0"
                )
    _check_roles(path, what, meta)


def _check_groups(path, what, groups, world):
    """ReportError for a process group that is not an object, or whose `ranks` are not global ranks (ints from 0,
    below world_size when known): the plan places a group's ranks on nodes from them."""
    expected = f"a rank 0 to {world - 1:,}" if world else "a rank >= 0"
    for group in groups:
        ranks = group.get("ranks") if isinstance(group, dict) else None
        if not isinstance(group, dict) or ranks is not None and not isinstance(ranks, list):
            raise ReportError(f"{path}: {what} process group {_short(group)} is not {{name, size, ranks: [rank, ...]}}")
        for r in ranks or ():
            if not (_is(r, _INT) and 0 <= r < (world or 2**63)):
                raise ReportError(
                    f"{path}: {what} process group {_short(group.get('name'))} has rank {_short(r)}, "
                    f"expected {expected}"
                )


def _check_roles(path, what, meta):
    roles = meta.get("storage_roles")
    if roles is not None and not isinstance(roles, dict):
        raise ReportError(f"{path}: {what} 'storage_roles' is {_short(roles)}, expected an object")
    for key, ids in (roles or {}).items():
        fields = ROLE_RECORDS.get(key)
        if fields is not None:  # size records: [[id, bytes], ...] or [[seq, id, bytes], ...]
            if not isinstance(ids, list) or not all(
                isinstance(r, list) and len(r) == len(fields) and all(_is(v, _INT) and v >= 0 for v in r) for r in ids
            ):
                raise ReportError(
                    f"{path}: {what} storage_roles {key!r} is {_short(ids)}, expected a list of "
                    f"[{', '.join(fields)}] records of ints >= 0"
                )
        elif not isinstance(ids, list) or not (_ints(ids) or all(_is(i, _INT) for i in ids)):
            raise ReportError(f"{path}: {what} storage_roles {key!r} is {_short(ids)}, expected a list of storage ids")


def _ints(values):
    """Whether every value is a plain int (what JSON gives): a quick yes for the common case, before the
    checks that name a bad value (a bool, an int subclass or anything else takes those)."""
    return all(type(v) is int for v in values)


def check_metadata_ids(path, meta, id_limit):
    """Raise ReportError when a storage id of the metadata (parameters, storage roles) is beyond `id_limit`."""
    found = [
        (f"{kind} {name!r}", info.get("storage_id"))
        for key, kind in PARAMETER_TABLES
        for name, info in (meta.get(key) or {}).items()
    ]
    for key, ids in (meta.get("storage_roles") or {}).items():
        at = ROLE_RECORDS[key].index("id") if key in ROLE_RECORDS else None
        values = ids if at is None else [i[at] for i in ids]
        if _ints(values) and (not values or 0 <= min(values) and max(values) <= id_limit):
            continue  # every id in range: nothing to name (the loop below names the first one out of range)
        found += [(f"storage_roles {key!r}", sid) for sid in values]
    for where, sid in found:
        if sid is not None and not 0 <= sid <= id_limit:
            raise ReportError(
                f"{path}: optrace metadata {where} has storage id {sid:,}; expected 0 to {id_limit:,} "
                "(a damaged or hand-edited trace?)"
            )
