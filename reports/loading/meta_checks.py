"""The checks of a trace's JSON (reports.loading.validate lists them all): the metadata and the marker are bounded
in size and nesting depth before they are parsed (parse_json), and their fields must have the types the tracer
writes, their numbers finite and in the ranges META_RANGES gives (check_metadata, check_metadata_ids)."""

import json
import math
import re

import numpy as np

from reports.errors import ReportError
from reports.loading.row_checks import MAX_BYTES
from tracer.schema import MAX_TOKENS, ROLE_RECORDS

MAX_JSON_DEPTH = 64  # the tracer's metadata nests 4 deep

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
    "collectives_untimed": _INT,
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
    "collectives_untimed",
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
    return set(map(type, values)) <= _INT_ONLY  # (the types collected in C: a generator took 0.02 s a 1M-row trace)


_INT_ONLY = frozenset({int})


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
