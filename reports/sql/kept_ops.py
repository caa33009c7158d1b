"""reports.sql.scan's _ops grain of one run made from the Trace's one read of its parts (reports.sql.rowpass)
instead of a DuckDB scan of the files: the grain's dtype alone read two list columns of every row again (0.25 CPU-s of
a 1M-row report's open was that scan).

`Ops`, fed each part in seq order, groups its rows by the grain's keys (op, phase, FLOP kind, view flag, dtype, FLOPs,
algorithmic bytes, process group, group size) and keeps per group the grain's sums (exact integers, summed in 32-bit
halves as reports.sql.kept_views.Steps sums), least and greatest values; `table()` merges the parts' groups. It is the
grain without flop_rest's keys (a run whose FLOP rows a reports.sql.flop_rows.FlopRows kept, or a trace of several
runs: reports.sql.scan.grains) and with `null_lists` false (the read checked the lists). Where a column it reads
lacks (an older trace), holds a null the grain would group or sum in a way not written here, an addition of bytes
passes int64 (DuckDB raises) or a sum passes int64, `table()` gives None and the grain is scan.py's, over the files.
tests/reports/sql/test_sql_scan.py compares the grain with its definition.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import arrow_of, nulls_of, numpy_of, strings, whole
from reports.sql.rowpass import CodeBook, Codes

__all__ = ["Ops", "sums"]

_NONE = np.iinfo(np.int64).max
_MIX = np.uint64(0x9E3779B97F4A7C15)
# never null where the grain reads them (else the scan's grain)
_NOT_NULL = ("seq", "op", "phase", "flop_kind", "is_view", "flops", "bytes_read", "bytes_written", "bytes_allocated")
_NOT_NULL += ("duration_ns", "live_bytes")
_SUMMED = (
    "flops_sum",
    "bytes_sum",
    "bound_flops",
    "bound_rows",
    "bytes_allocated",
    "bytes_read",
    "bytes_written",
    "duration_ns",
    "time_ns",
    "message_bytes",
)
_ADDED = ("bound_rows", "bytes_allocated", "bytes_read", "bytes_written", "duration_ns", "time_ns", "message_bytes")
_MAXED = ("bytes_allocated", "bytes_read", "bytes_written", "duration_ns", "live_bytes")
_KEYS = ("op", "phase", "flop_kind", "is_view", "dtype", "flops", "bytes", "process_group", "group_size_null")
_KEYS += ("group_size",)


def _groups(keys):
    """(codes, firsts) of rows grouped by equal values of every array of `keys` (int64): each row's group (dense, from
    0) and each group's first row. The groups of a hash of the keys (Arrow's hash table: no sort of the rows), checked
    equal within each group (a collision: grouped by the keys themselves)."""
    h = np.zeros(len(keys[0]), dtype=np.uint64)
    for k in keys:
        h = (h ^ k.view(np.uint64)) * _MIX
    codes = numpy_of(pc.dictionary_encode(arrow_of(h.view(np.int64))).indices).astype(np.int64)
    # codes come numbered as first seen: a row starts a group where its code passes every code before it
    firsts = np.flatnonzero(np.concatenate(([True], codes[1:] > np.maximum.accumulate(codes)[:-1])))
    if all((k == k[firsts][codes]).all() for k in keys):
        return codes, firsts
    order = np.lexsort(keys[::-1])
    differ = np.zeros(max(len(order) - 1, 0), dtype=bool)
    for k in keys:
        ks = k[order]
        differ |= ks[1:] != ks[:-1]
    codes = np.empty(len(order), dtype=np.int64)
    codes[order] = np.cumsum(np.concatenate(([False], differ)))
    return codes, order[np.flatnonzero(np.concatenate(([True], differ)))]  # a stable sort: the least row first


def _packed(codes):
    """The small codes (int64 >= 0) of `codes` as bits of one int64 (equal where all are equal), or None when they take
    more than 63 bits."""
    packed, shift = np.zeros(len(codes[0]), dtype=np.int64), 0
    for k in codes:
        bits = int(k.max()).bit_length() if len(k) else 0
        if shift + bits > 63:
            return None
        packed |= k << shift
        shift += bits
    return packed


def sums(values, codes, groups):
    """Per group of `codes` (dense, below `groups`): the sum of int64 `values` as [high, low] 32-bit halves (int64)."""
    if not len(values) or max(int(values.max()), -int(values.min())) * len(values) < 2**53:  # exact in float64
        total = np.bincount(codes, weights=values, minlength=groups).astype(np.int64)
        return np.stack([total >> 32, total & 0xFFFFFFFF])
    high, low = np.zeros(groups, dtype=np.int64), np.zeros(groups, dtype=np.int64)
    np.add.at(high, codes, values >> 32)
    np.add.at(low, codes, values & 0xFFFFFFFF)
    return np.stack([high, low])


def _extreme(ufunc, values, codes, groups, start):
    """ufunc (np.maximum or np.minimum) of `values` per group of `codes`, from `start`."""
    out = np.full(groups, start, dtype=np.int64)
    ufunc.at(out, codes, values)
    return out


def _coalesce(column, other):
    """coalesce(column, other) of an int64 column and an array."""
    if not column.null_count:
        return numpy_of(column)
    return np.where(nulls_of(column), other, numpy_of(column, null=0))


class Ops:
    """reports.sql.scan's _ops grain of one run (without flop_rest's keys), fed its parts in seq order."""

    columns = (
        "seq",
        "op",
        "phase",
        "flop_kind",
        "is_view",
        "input_dtypes",
        "output_dtypes",
        "flops",
        "flops_bound",
        "bytes_read",
        "bytes_written",
        "bytes_allocated",
        "duration_ns",
        "busy_ns",
        "comm_bytes",
        "live_bytes",
        "process_group",
        "group_size",
    )
    grain = "_ops"

    @staticmethod
    def select(table, run, run_index, several):
        """The grain's rows of run `run_index` (named `run`, a SQL literal) from `table` (of `table()`), in the grain's
        columns and DuckDB types (`several`: the grain is the same for a trace of several runs)."""
        summed = ", ".join(f"CAST({c} AS HUGEINT) AS {c}" for c in _SUMMED[:-1])  # message_bytes after calls
        return (
            f"SELECT {run} AS run, {int(run_index)} AS run_index, op, phase, flop_kind, is_view, dtype, flops, bytes, "
            f"process_group, group_size, ops, {summed}, first_seq, calls, CAST(message_bytes AS HUGEINT) AS "
            "message_bytes, comm_first_seq, " + ", ".join(f"{c}_max" for c in _MAXED) + ", false AS null_lists "
            f"FROM {table}"
        )

    def __init__(self, rows=None, codes=None):
        self.codes = codes if codes is not None else CodeBook()
        self.dtypes = Codes()  # the grain's dtype (_dtypes)
        self.parts, self.failed = [], False

    def feed(self, table):
        if self.failed or not table.num_rows:
            return
        names = set(table.column_names)
        if any(c not in names for c in self.columns) or any(table.column(c).null_count for c in _NOT_NULL):
            self.failed = True
            return
        col = table.column
        is_view = numpy_of(col("is_view"))
        read, written = numpy_of(col("bytes_read")), numpy_of(col("bytes_written"))
        total = read + written  # wraps where DuckDB's addition raises: the scan's grain then
        if (((read ^ total) & (written ^ total)) < 0)[~is_view].any():
            self.failed = True
            return
        flops = numpy_of(col("flops"))
        group = col("process_group")
        pg = self.codes["process_group"].of(group)
        if group.null_count:
            pg = np.where(nulls_of(group), -1, pg)
        size = col("group_size")
        kinds = self.codes["flop_kind"]
        kind = kinds.of(col("flop_kind"))
        collective = kinds.flags(lambda k: k == "collective")[kind]
        keys = {
            **{c: self.codes[c].of(col(c)) for c in ("op", "phase")},
            "flop_kind": kind,
            "is_view": is_view.astype(np.int64),
            "dtype": self._dtypes(col("input_dtypes"), col("output_dtypes")),
            "flops": flops,
            "bytes": np.where(is_view | collective, 0, total),  # none for a view or a collective (scan.py's _ops)
            "process_group": pg,
            "group_size_null": nulls_of(size).astype(np.int64),
            "group_size": numpy_of(size, null=0),
        }
        bound = numpy_of(col("flops_bound"), null=False)
        comm, busy = col("comm_bytes"), col("busy_ns")
        seq, duration = numpy_of(col("seq")), numpy_of(col("duration_ns"))
        # summed per group: flops_sum, bytes_sum and bound_flops are the group's FLOPs or bytes (keys) times its rows
        # or bound rows (`table`); time_ns is duration_ns where no busy_ns is given, message_bytes 0 where no comm_bytes
        values = {"bound_rows": bound.astype(np.int64)}
        values.update({c: numpy_of(col(c)) for c in ("bytes_allocated", "bytes_read", "bytes_written")})
        values["duration_ns"] = duration
        values["time_ns"] = _coalesce(busy, duration) if busy.null_count < len(busy) else None
        values["message_bytes"] = numpy_of(comm, null=0) if comm.null_count < len(comm) else None
        has_comm = ~nulls_of(comm) if comm.null_count else None
        small = _packed([keys[c] + (c == "process_group") for c in _KEYS if c not in ("flops", "bytes", "group_size")])
        wide = [keys["flops"], keys["bytes"], keys["group_size"]]
        codes, first = _groups([small, *wide] if small is not None else list(keys.values()))
        groups = len(first)  # each group's first row is its least seq (rows come in seq order)
        found = {c: k[first] for c, k in keys.items()}
        found["ops"] = np.bincount(codes, minlength=groups)
        for c, v in values.items():
            found[c] = None if v is None else sums(v, codes, groups)
        if has_comm is None:  # every row or none has comm_bytes
            found["calls"] = found["ops"] if not comm.null_count else np.zeros(groups, dtype=np.int64)
            found["comm_first_seq"] = seq[first] if not comm.null_count else np.full(groups, _NONE)
        else:
            found["calls"] = np.bincount(codes[has_comm], minlength=groups)
            found["comm_first_seq"] = _extreme(np.minimum, seq[has_comm], codes[has_comm], groups, _NONE)
        found["first_seq"] = seq[first]
        for c in _MAXED:
            found[c + "_max"] = _extreme(np.maximum, numpy_of(col(c)), codes, groups, np.iinfo(np.int64).min)
        self.parts.append(found)

    def _dtypes(self, inputs, outputs):
        """Code of each row's dtype as the grain reads it (views.sql row_dtype): its first input dtype where that is a
        non-empty string, else its first output dtype, else ''."""
        empty = self.dtypes.code("")
        first_in = self._first(inputs, -1, skip_empty=True)
        return np.where(first_in >= 0, first_in, self._first(outputs, empty, skip_empty=False))

    def _first(self, column, fill, skip_empty):
        """Code of each row's first item of `column` (a list of dtype strings): `fill` for none, a null one, and with
        `skip_empty` an empty string."""
        chunk = whole(column)
        offsets = numpy_of(chunk.offsets)
        has = offsets[1:] > offsets[:-1]
        values = chunk.values if pa.types.is_dictionary(chunk.values.type) else pc.dictionary_encode(chunk.values)
        codes = self.dtypes
        lookup = np.asarray(  # each name looked up once, not per row; the last: a null item (index -1)
            [fill if skip_empty and v == "" else codes.code(v) for v in values.dictionary.to_pylist()] + [fill],
            dtype=np.int64,
        )
        found = np.full(len(has), fill, dtype=np.int64)
        found[has] = lookup[numpy_of(values.indices, null=-1)[offsets[:-1][has]]]
        return found

    def table(self):
        """The groups as a Table for `select` (sums as int64); None where the grain is the scan's (see the module
        docstring)."""
        if self.failed:
            return None
        parts, self.parts = self.parts, None
        if not parts:
            return None  # no row: the scan's grain (an empty one)
        if any(p["time_ns"] is None for p in parts):  # a part without busy_ns: time_ns is its duration_ns
            for p in parts:
                p["time_ns"] = p["duration_ns"] if p["time_ns"] is None else p["time_ns"]
        for p in parts:
            if p["message_bytes"] is None:
                p["message_bytes"] = np.zeros((2, len(p["ops"])), dtype=np.int64)
        runs = {c: np.concatenate([p[c] for p in parts], axis=-1) for c in parts[0]}
        codes, first = _groups([runs[c] for c in _KEYS])
        groups = len(first)
        out = {c: runs[c][first] for c in _KEYS}
        out["ops"] = _extreme(np.add, runs["ops"], codes, groups, 0)
        for c in _ADDED:  # halves summed per group, then joined exactly
            high = _extreme(np.add, runs[c][0], codes, groups, 0)
            low = _extreme(np.add, runs[c][1], codes, groups, 0)
            high, low = high + (low >> 32), low & 0xFFFFFFFF
            if high.max() >= 2**31 or high.min() < -(2**31):  # a total past int64: the scan's grain
                return None
            out[c] = high * (1 << 32) + low
        for c, key, count in (
            ("flops_sum", "flops", "ops"),
            ("bytes_sum", "bytes", "ops"),
            ("bound_flops", "flops", "bound_rows"),
        ):
            exact = [k * n for k, n in zip(out[key].tolist(), out[count].tolist())]
            if any(not -(2**63) <= v < 2**63 for v in exact):
                return None
            out[c] = np.asarray(exact, dtype=np.int64)
        out["calls"] = _extreme(np.add, runs["calls"], codes, groups, 0)
        out["first_seq"] = _extreme(np.minimum, runs["first_seq"], codes, groups, _NONE)
        out["comm_first_seq"] = _extreme(np.minimum, runs["comm_first_seq"], codes, groups, _NONE)
        for c in _MAXED:
            out[c + "_max"] = _extreme(np.maximum, runs[c + "_max"], codes, groups, np.iinfo(np.int64).min)
        no_comm = out["calls"] == 0
        names = {c: self.codes[c].names for c in ("op", "phase", "flop_kind", "process_group")}
        names["dtype"] = self.dtypes.names
        columns = {c: strings([names[c][k] for k in out[c].tolist()]) for c in ("op", "phase", "flop_kind", "dtype")}
        columns["is_view"] = arrow_of(out["is_view"].astype(bool))
        columns["flops"], columns["bytes"] = arrow_of(out["flops"]), arrow_of(out["bytes"])
        columns["process_group"] = strings(
            [names["process_group"][k] if k >= 0 else None for k in out["process_group"]]
        )
        columns["group_size"] = arrow_of(out["group_size"], mask=out["group_size_null"].astype(bool))
        columns["ops"] = arrow_of(out["ops"])
        for c in _SUMMED:
            columns[c] = arrow_of(out[c], mask=no_comm) if c == "message_bytes" else arrow_of(out[c])
        columns["first_seq"], columns["calls"] = arrow_of(out["first_seq"]), arrow_of(out["calls"])
        columns["comm_first_seq"] = arrow_of(out["comm_first_seq"], mask=no_comm)
        for c in _MAXED:
            columns[c + "_max"] = arrow_of(out[c + "_max"])
        return pa.table(columns)
