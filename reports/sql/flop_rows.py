"""The FLOP sections' rows of a run from the Trace's one read of its parts (reports.sql.rowpass), instead of
the query of flops.sql that decoded five list columns of every row again (reports.sql.flops).

`FlopRows`, fed each part in seq order, keeps what flops.sql's views hold of the run:

    walked   flop_rows: the rows flop_marked walks, with flop_rows' columns (each cell as flop_rows writes it)
    rest     flop_rest: the other rows' FLOPs summed per phase, optimizer op, FLOP kind, recompute flag, first input
             dtype and FLOPs > 0, each group at its first row's seq and step

`walked` is flop_marked's condition on flop_ops' op lists, read from flops.sql (tests/reports/sql/test_sql_flops.py checks them),
a mul or div's scalar operand tested as flop_marked tests it (one tensor input, or two of which one's shape has a
product of 1, a missing or empty shape counting as 1: list_product skips nulls and gives NULL for no item). The
FLOP sums are exact (integer halves), so `table` gives what flops.py's query gives of a run, row for row
(tests/reports/sql/test_sql_flops.py compares the frames).
"""

import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import packet
from reports.arrays import arrow_of, list_lengths, nulls_of, numpy_of, strings, whole
from reports.sql.kept_ops import sums
from reports.sql.rowpass import CodeBook, Codes

__all__ = ["FlopRows"]

_CATEGORICAL = ("phase", "op", "module", "flop_kind", "grad_mode")  # as flops.py gives them: categorical


def _packets():
    """{copies, hops, derives, scales: the op packets flops.sql's flop_ops lists for each}, read from flops.sql."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "flops.sql"), encoding="utf-8") as f:
        text = f.read()
    body = text[text.index("CREATE VIEW flop_ops") : text.index("CREATE VIEW flop_marked")]
    return {
        name: frozenset(re.findall(r"'([\w.]+)'", found))
        for found, name in re.findall(r"packet IN \(([^)]*)\) AS (\w+)", body)
    }


_PACKETS = _packets()
# flop_rows' and flop_rest's columns as DuckDB gives them: every column a FLOP section reads, the one list of them
# (reports.sql.flops selects these, reports.flops.rows.COLUMNS is `run` and these)
_INTS, _SHAPES = pa.list_(pa.field("l", pa.int64())), pa.list_(pa.field("l", pa.list_(pa.field("l", pa.int64()))))
SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("step", pa.int64()),
        ("phase", pa.string()),
        ("op", pa.string()),
        ("module", pa.string()),
        ("flop_kind", pa.string()),
        ("flops", pa.int64()),
        ("recompute", pa.bool_()),
        ("causal", pa.bool_()),
        ("input_storage_ids", _INTS),
        ("output_storage_ids", _INTS),
        ("input_dtypes", pa.list_(pa.field("l", pa.string()))),
        ("input_shapes", _SHAPES),
        ("output_shapes", _SHAPES),
        ("flops_bound", pa.bool_()),
        ("grad_mode", pa.string()),
    ]
)


def _product_is_one(shapes, k):
    """Per row of `shapes` (list<list<int64>>): whether its shape k has a product of 1 (a missing, null or empty shape
    and null dimensions count as 1), in float64 as list_product multiplies."""
    one = pc.list_slice(shapes, k, k + 1)
    rows = numpy_of(pc.list_parent_indices(one))
    inner = pc.list_flatten(one)
    out = np.ones(len(shapes), dtype=np.float64)
    if len(inner):
        dims = numpy_of(pc.list_flatten(inner), null=1).astype(np.float64)
        lengths = numpy_of(pc.list_value_length(inner), null=0)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        product = np.ones(len(lengths), dtype=np.float64)
        full = lengths > 0
        if full.any():
            product[full] = np.multiply.reduceat(dims, starts[full]) if len(dims) else 1.0
        out[rows] = product
    return out == 1


def _first_two(column, at):
    """list_slice(column.take(at), 0, 2) of a list column without null cells, made from its offsets (the kernel cost
    about 0.6 ms a part of 16,384 rows)."""
    chunk = whole(column)  # a part: one chunk
    offsets = numpy_of(chunk.offsets)
    starts = offsets[at].astype(np.int64)
    lengths = np.minimum(offsets[at + 1] - starts, 2)
    kept = np.zeros(len(at) + 1, dtype=np.int32)
    np.cumsum(lengths, out=kept[1:])
    items = np.repeat(starts - kept[:-1], lengths) + np.arange(kept[-1], dtype=np.int64)
    return pa.ListArray.from_arrays(arrow_of(kept), chunk.values.take(arrow_of(items)), type=chunk.type)


class FlopRows:
    """flop_rows and flop_rest of one run, fed its parts in seq order (a consumer of rowpass.read; `codes`: the
    rowpass.CodeBook the read's consumers share)."""

    columns = tuple(SCHEMA.names)
    holds = "flop_rest"  # the view it holds: the Trace's _ops grain then leaves out its keys (reports.sql.scan)

    def __init__(self, rows=None, codes=None):
        self.codes = codes if codes is not None else CodeBook()
        self.dtypes = Codes()  # the first input dtypes of flop_rest's rows (_first_dtypes)
        self._flags = {}  # {(column, test name): test of each name of the column, by code}
        self.walked = {c: [] for c in SCHEMA.names}  # per column, each part's walked rows: codes for _CATEGORICAL
        self.rest = {}  # {group key: [seq, step, FLOPs]}

    def _flag(self, column, name, test):
        """test(name) of each name of `column`'s codes, by code: made again only when a part brought new names."""
        names = self.codes[column].names
        found = self._flags.get((column, name))
        if found is None or len(found) != len(names):
            found = self._flags[column, name] = np.fromiter(map(test, names), dtype=bool, count=len(names))
        return found

    def feed(self, table):
        op, phase, kind = (self.codes[c].of(table.column(c)) for c in ("op", "phase", "flop_kind"))
        copies, hops, derives, scales = (
            self._flag("op", k, lambda v, k=k: packet(v) in _PACKETS[k])[op]
            for k in ("copies", "hops", "derives", "scales")
        )
        is_kind = {
            k: self._flag("flop_kind", k, lambda v, k=k: v == k)[kind]
            for k in ("matmul", "attention", "conv", "collective")
        }
        forward = self._flag("phase", "forward", lambda v: v == "forward")[phase]
        late = self._flag("phase", "late", lambda v: v in ("backward", "other"))[phase]
        scalar = np.zeros(len(op), dtype=bool)
        at = np.flatnonzero(scales)
        if len(at):
            n_in = list_lengths(table.column("input_storage_ids"))[at]
            shapes = table.column("input_shapes").take(arrow_of(at))
            scalar[at] = (n_in == 1) | (n_in == 2) & (_product_is_one(shapes, 0) | _product_is_one(shapes, 1))
        walked = (
            is_kind["matmul"]
            | is_kind["attention"]
            | is_kind["conv"] & forward
            | copies
            | late & (is_kind["collective"] | hops)
            | derives
            | scales & scalar
        )
        self._keep(table, np.flatnonzero(walked), (op, phase, kind), is_kind, scales)
        self._sum(table, np.flatnonzero(~walked), op, phase, kind)

    def _keep(self, table, at, codes, is_kind, scales):
        """The walked rows `at`, with flop_rows' columns (a cell flop_rows leaves null taken at a null index)."""
        index, w = arrow_of(at), self.walked
        mm = is_kind["matmul"][at]

        def masked(column, keep):
            return column.take(arrow_of(at, mask=~keep))

        for name, code in zip(("op", "phase", "flop_kind"), codes):
            w[name].append(_narrow(code[at]))
        w["module"].append(
            _narrow(np.where(mm | is_kind["attention"][at], self.codes["module"].of(table.column("module"))[at], -1))
        )
        if "grad_mode" in table.column_names:  # a v3 trace has none: null (reports.sql.engine)
            grad = table.column("grad_mode")
            w["grad_mode"].append(_narrow(np.where(nulls_of(grad)[at], -1, self.codes["grad_mode"].of(grad)[at])))
        else:
            w["grad_mode"].append(np.full(len(at), -1, dtype=np.int32))
        for name in ("seq", "step", "flops"):  # never null (the Trace's checks); `table` casts them back to int64
            values = numpy_of(table.column(name))[at]
            w[name].append(arrow_of(values if name == "flops" else _narrow(values)))
        causal = table.column("causal")
        w["causal"].append(
            arrow_of(numpy_of(causal, null=False)[at], mask=nulls_of(causal)[at] if causal.null_count else None)
        )
        w["recompute"].append(arrow_of(numpy_of(table.column("recompute"), null=False)[at]))  # null: not recomputed
        ids = table.select(["input_storage_ids", "output_storage_ids"]).take(index)  # one take for both
        w["input_storage_ids"].append(ids.column(0))
        w["output_storage_ids"].append(ids.column(1))
        w["input_dtypes"].append(_first_two(table.column("input_dtypes"), at))
        w["input_shapes"].append(
            masked(table.column("input_shapes"), (is_kind["attention"] | is_kind["conv"] | scales)[at])
        )
        w["output_shapes"].append(masked(table.column("output_shapes"), (is_kind["matmul"] | is_kind["conv"])[at]))
        w["flops_bound"].append(arrow_of(numpy_of(table.column("flops_bound"), null=False)[at], mask=~mm))

    def _sum(self, table, at, op, phase, kind):
        """The other rows' (`at`) FLOPs per flop_rest's group."""
        if not len(at):
            return
        optimizer = self._flag("phase", "optimizer", lambda v: v == "optimizer")[phase[at]]
        dtype = self._first_dtypes(table.column("input_dtypes"), at)
        recompute = numpy_of(table.column("recompute"), null=False)[at]
        flops = numpy_of(table.column("flops"))[at]
        keys = [phase[at], np.where(optimizer, op[at], -1) + 1, kind[at], recompute, dtype + 2, flops > 0]
        sizes = [len(self.codes[c].names) for c in ("phase", "op", "flop_kind")]
        sizes = [sizes[0], sizes[1] + 1, sizes[2], 2, len(self.dtypes.names) + 2, 2]
        packed = np.zeros(len(at), dtype=np.int64)  # one int per key (mixed radix): a sort of ints, not of rows
        for key, size in zip(keys, sizes):
            packed = packed * size + key
        # each row's group, numbered as first seen (Arrow's hash table: no sort of the rows)
        group = numpy_of(pc.dictionary_encode(arrow_of(packed)).indices).astype(np.int64)
        first_at = np.flatnonzero(np.concatenate(([True], group[1:] > np.maximum.accumulate(group)[:-1])))
        found = np.stack([key[first_at] for key in keys], axis=1)
        high, low = sums(flops, group, len(first_at))  # exact halves
        seq, step = numpy_of(table.column("seq"))[at[first_at]], numpy_of(table.column("step"))[at[first_at]]
        for key, s, st, hi, lo in zip(
            map(tuple, found.tolist()), seq.tolist(), step.tolist(), high.tolist(), low.tolist()
        ):
            key = (key[0], key[1] - 1, key[2], key[3], key[4] - 2, key[5])
            if key in self.rest:
                self.rest[key][2] += (hi << 32) + lo
            else:
                self.rest[key] = [s, st, (hi << 32) + lo]

    def _first_dtypes(self, column, at):
        """Code of each row `at`'s first input dtype (flop_rest's input_dtypes[1:1]): -1 none, -2 a null one."""
        chunk = whole(column)  # a part: one chunk
        offsets = numpy_of(chunk.offsets)
        start, has = offsets[at], offsets[at + 1] > offsets[at]
        values = chunk.values if pa.types.is_dictionary(chunk.type.value_type) else pc.dictionary_encode(chunk.values)
        codes = self.dtypes  # each name looked up once, not per row; the last: a null item (index -1)
        lookup = np.asarray([codes.code(v) for v in values.dictionary.to_pylist()] + [-2], dtype=np.int64)
        dtype = np.full(len(at), -1, dtype=np.int64)
        dtype[has] = lookup[numpy_of(values.indices, null=-1)[start[has]]]
        return dtype

    def table(self, wide, steps):
        """flop_rows, flop_rest and `steps` (flop_steps' rows of the run, after the others, in seq order) as one Table
        of SCHEMA in seq order, _CATEGORICAL columns dictionary-encoded as flops.py encodes them; None when `wide` (an
        int64 FLOP sum could wrap: flops.py's query reads them as float64)."""
        groups = sorted(self.rest.items(), key=lambda item: item[1][0])
        if wide or any(not -(2**63) <= total < 2**63 for _, (_, _, total) in groups):
            return None
        names = {c: self.codes[c].names for c in ("phase", "op", "flop_kind")} | {"dtype": self.dtypes.names}
        rest_seq = np.asarray([s for _, (s, _, _) in groups], dtype=np.int64)
        dtypes = [k[4] for k, _ in groups]  # -1 no first input dtype, -2 a null one
        rest = {
            "seq": arrow_of(rest_seq),
            "step": arrow_of(np.asarray([st for _, (_, st, _) in groups], dtype=np.int64)),
            "flops": arrow_of(np.asarray([total for _, (_, _, total) in groups], dtype=np.int64)),
            "recompute": arrow_of(np.asarray([k[3] for k, _ in groups], dtype=bool)),
            "input_dtypes": pa.ListArray.from_arrays(
                arrow_of(np.concatenate([[0], np.cumsum(np.asarray(dtypes) != -1)]).astype(np.int32)),
                strings([None if k == -2 else names["dtype"][k] for k in dtypes if k != -1]),
                type=SCHEMA.field("input_dtypes").type,
            ),
        }
        rest = {
            c: rest[c] if c in rest else pa.nulls(len(groups), SCHEMA.field(c).type)
            for c in SCHEMA.names
            if c not in _CATEGORICAL
        }
        rest_codes = {
            "phase": [k[0] for k, _ in groups],
            "op": [k[1] for k, _ in groups],
            "flop_kind": [k[2] for k, _ in groups],
            "module": [-1] * len(groups),
            "grad_mode": [-1] * len(groups),
        }
        steps_codes = {c: np.full(len(steps), -1, dtype=np.int64) for c in _CATEGORICAL}
        steps_codes["phase"] = self.codes["phase"].of(steps.column("phase"))
        # rest's groups between the walked rows, by seq (seq is unique in a run); the steps after them
        walked_seq = np.concatenate([np.zeros(0, np.int64), *(numpy_of(a) for a in self.walked["seq"])])
        cut = np.searchsorted(walked_seq, rest_seq).tolist()
        out = {}
        for c in SCHEMA.names:
            kind = SCHEMA.field(c).type
            if c in _CATEGORICAL:
                codes = np.concatenate([np.zeros(0, np.int64), *self.walked[c]])
                codes = np.insert(codes, cut, np.asarray(rest_codes[c], dtype=np.int64))
                out[c] = _categorical(np.concatenate([codes, steps_codes[c]]), self.codes[c].names)
                continue
            # each part in its own type (a part may store strings plain where another has a dictionary)
            parts = [
                chunk if chunk.type == kind else chunk.cast(kind) for part in self.walked[c] for chunk in _chunks(part)
            ]
            walked = pa.chunked_array(parts, type=kind)
            pieces, last = [], 0
            for i, at in enumerate(cut):
                pieces += [walked.slice(last, at - last), rest[c].slice(i, 1)]
                last = at
            pieces += [
                walked.slice(last),
                steps.column(c).cast(kind) if c in steps.column_names else pa.nulls(len(steps), kind),
            ]
            out[c] = pa.concat_arrays([chunk for piece in pieces for chunk in _chunks(piece)])
        self.walked = self.rest = None
        return pa.table(out)


def _narrow(values):
    """`values` (int64: codes, seq or step of the walked rows) in int32 where every one fits, as they are otherwise:
    what FlopRows holds of a run until `table` (a million rows' walked codes, seq and step took 7.5 MB in int64)."""
    fits = not len(values) or -(2**31) <= int(values.min()) and int(values.max()) < 2**31
    return values.astype(np.int32) if fits else values


def _chunks(values):
    return values.chunks if isinstance(values, pa.ChunkedArray) else [values]


def _categorical(codes, names):
    """Codes (-1: null) over `names` as the DictionaryArray pc.dictionary_encode makes of their strings: the dictionary
    holds the names used, in order of first appearance."""
    valid = codes >= 0
    used = codes[valid]
    first = np.full(len(names), len(used), dtype=np.int64)  # each code's first row among the valid ones (no sort)
    np.minimum.at(first, used, np.arange(len(used), dtype=np.int64))
    present = np.flatnonzero(first < len(used))
    seen = present[np.argsort(first[present])]  # the codes in order of first appearance
    lookup = np.zeros(len(names) + 1, dtype=np.int32)
    lookup[seen] = np.arange(len(seen), dtype=np.int32)
    indices = arrow_of(lookup[np.where(valid, codes, len(names))], mask=~valid)
    return pa.DictionaryArray.from_arrays(indices, strings([names[k] for k in seen.tolist()]))
