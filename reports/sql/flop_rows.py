"""The FLOP sections' rows of a run from the Trace's one read of its parts (reports/sql/rowpass.py), instead of
the query of flops.sql that decoded five list columns of every row again (reports/sql/flops.py).

`FlopRows`, fed each part in seq order, keeps what flops.sql's views hold of the run:

    walked   flop_rows: the rows flop_marked walks, with flop_rows' columns (each cell as flop_rows writes it)
    rest     flop_rest: the other rows' FLOPs summed per phase, optimizer op, FLOP kind, recompute flag, first input
             dtype and FLOPs > 0, each group at its first row's seq and step

`walked` is flop_marked's condition on the same op lists (the Python ones flops.sql copies: tests/test_sql_flops.py),
a mul or div's scalar operand tested as flop_marked tests it (one tensor input, or two of which one's shape has a
product of 1, a missing or empty shape counting as 1: list_product skips nulls and gives NULL for no item). The
FLOP sums are exact (integer halves), so `table` gives what flops.py's query gives of a run, row for row
(tests/test_sql_flops.py compares the frames).
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import ONE_TO_ONE_COPIES, packet
from reports.flops.roles import _ADDS, _GATHERS, _GRADIENT_MOVES, DERIVED, GRADIENT_PLACES, SCALED
from reports.sql.rowpass import Codes

__all__ = ["FlopRows"]

_COPIES, _HOPS = ONE_TO_ONE_COPIES | _GATHERS, _ADDS | GRADIENT_PLACES | _GRADIENT_MOVES
# flop_rows' and flop_rest's columns as DuckDB gives them (reports/sql/flops.py _ROWS)
_INTS, _SHAPES = pa.list_(pa.field("l", pa.int64())), pa.list_(pa.field("l", pa.list_(pa.field("l", pa.int64()))))
SCHEMA = pa.schema([("seq", pa.int64()), ("step", pa.int64()), ("phase", pa.string()), ("op", pa.string()),
                    ("module", pa.string()), ("flop_kind", pa.string()), ("flops", pa.int64()), ("recompute", pa.bool_()),
                    ("causal", pa.bool_()), ("input_storage_ids", _INTS), ("output_storage_ids", _INTS),
                    ("input_dtypes", pa.list_(pa.field("l", pa.string()))), ("input_shapes", _SHAPES),
                    ("output_shapes", _SHAPES), ("flops_bound", pa.bool_())])  # fmt: skip


def _product_is_one(shapes, k):
    """Per row of `shapes` (list<list<int64>>): whether its shape k has a product of 1 (a missing, null or empty shape
    and null dimensions count as 1), in float64 as list_product multiplies."""
    one = pc.list_slice(shapes, k, k + 1)
    rows = pc.list_parent_indices(one).to_numpy()
    inner = pc.list_flatten(one)
    out = np.ones(len(shapes), dtype=np.float64)
    if len(inner):
        dims = pc.fill_null(pc.list_flatten(inner), 1).to_numpy().astype(np.float64)
        lengths = pc.fill_null(pc.list_value_length(inner), 0).to_numpy()
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        product = np.ones(len(lengths), dtype=np.float64)
        full = lengths > 0
        if full.any():
            product[full] = np.multiply.reduceat(dims, starts[full]) if len(dims) else 1.0
        out[rows] = product
    return out == 1


class FlopRows:
    """flop_rows and flop_rest of one run, fed its parts in seq order (a consumer of rowpass.read)."""

    columns = tuple(SCHEMA.names)
    holds = "flop_rest"  # the view it holds: the Trace's _ops grain then leaves out its keys (reports/sql/scan.py)

    def __init__(self, rows=None):
        self.op, self.phase, self.kind, self.dtype = Codes(), Codes(), Codes(), Codes()
        self.walked, self.rest = [], {}  # Tables of walked rows; {group key: [seq, step, FLOPs]} in order of first seq

    def feed(self, table):
        op, phase, kind = self.op.of(table.column("op")), self.phase.of(table.column("phase")), self.kind.of(table.column("flop_kind"))
        packets = [packet(v) for v in self.op.names]
        copies, hops, derives, scales = (np.fromiter((p in names for p in packets), dtype=bool, count=len(packets))[op]
                                         for names in (_COPIES, _HOPS, DERIVED, SCALED))  # fmt: skip
        is_kind = {k: self.kind.flags(lambda v, k=k: v == k)[kind] for k in ("matmul", "attention", "conv", "collective")}
        forward = self.phase.flags(lambda v: v == "forward")[phase]
        late = self.phase.flags(lambda v: v in ("backward", "other"))[phase]
        scalar = np.zeros(len(op), dtype=bool)
        at = np.flatnonzero(scales)
        if len(at):
            n_in = pc.list_value_length(table.column("input_storage_ids").take(at)).to_numpy()
            shapes = table.column("input_shapes").take(at)
            scalar[at] = (n_in == 1) | (n_in == 2) & (_product_is_one(shapes, 0) | _product_is_one(shapes, 1))
        walked = (is_kind["matmul"] | is_kind["attention"] | is_kind["conv"] & forward | copies
                  | late & (is_kind["collective"] | hops) | derives | scales & scalar)  # fmt: skip
        self._keep(table, walked, is_kind, scales)
        self._sum(table, ~walked, op, phase, kind)

    def _keep(self, table, walked, is_kind, scales):
        """The walked rows, with flop_rows' columns."""
        at = pa.array(np.flatnonzero(walked))
        rows = table.take(at)
        mm = pa.array(is_kind["matmul"][walked])
        shaped = pa.array((is_kind["attention"] | is_kind["conv"] | scales)[walked])
        out_shaped = pa.array((is_kind["matmul"] | is_kind["conv"])[walked])

        def text(name):
            return rows.column(name).cast(pa.string())

        columns = {
            "seq": rows.column("seq"), "step": rows.column("step"), "phase": text("phase"), "op": text("op"),
            "module": pc.if_else(mm, text("module").combine_chunks(), None), "flop_kind": text("flop_kind"),
            "flops": rows.column("flops"), "recompute": pc.fill_null(rows.column("recompute"), False),
            "causal": rows.column("causal"), "input_storage_ids": rows.column("input_storage_ids"),
            "output_storage_ids": rows.column("output_storage_ids"),
            "input_dtypes": pc.list_slice(rows.column("input_dtypes"), 0, 2).cast(SCHEMA.field("input_dtypes").type),
            "input_shapes": _where(shaped, rows.column("input_shapes"), _SHAPES),
            "output_shapes": _where(out_shaped, rows.column("output_shapes"), _SHAPES),
            "flops_bound": pc.if_else(mm, pc.fill_null(rows.column("flops_bound"), False).combine_chunks(), None),
        }  # fmt: skip
        self.walked.append(pa.table({n: _cast(v, SCHEMA.field(n).type) for n, v in columns.items()}, schema=SCHEMA))

    def _sum(self, table, rest, op, phase, kind):
        """The other rows' FLOPs per flop_rest's group."""
        at = np.flatnonzero(rest)
        if not len(at):
            return
        optimizer = self.phase.flags(lambda v: v == "optimizer")[phase[at]]
        dtype = self._first_dtypes(table.column("input_dtypes"), at)
        recompute = pc.fill_null(table.column("recompute").take(at), False).to_numpy()
        flops = table.column("flops").take(at).to_numpy()
        keys = [phase[at], np.where(optimizer, op[at], -1) + 1, kind[at], recompute, dtype + 2, flops > 0]
        sizes = [len(self.phase.names), len(self.op.names) + 1, len(self.kind.names), 2, len(self.dtype.names) + 2, 2]
        packed = np.zeros(len(at), dtype=np.int64)  # one int per key (mixed radix): a sort of ints, not of rows
        for key, size in zip(keys, sizes):
            packed = packed * size + key
        order = np.argsort(packed, kind="stable")  # each group's rows together, in row order
        starts = np.flatnonzero(np.concatenate(([True], packed[order][1:] != packed[order][:-1])))
        first_at = order[starts]  # each group's first row
        found = np.stack([key[first_at] for key in keys], axis=1)
        flops = flops[order]
        high, low = np.add.reduceat(flops >> 32, starts), np.add.reduceat(flops & 0xFFFFFFFF, starts)  # exact halves
        seq, step = table.column("seq").to_numpy()[at[first_at]], table.column("step").to_numpy()[at[first_at]]
        for key, s, st, hi, lo in zip(map(tuple, found.tolist()), seq.tolist(), step.tolist(), high.tolist(), low.tolist()):
            key = (key[0], key[1] - 1, key[2], key[3], key[4] - 2, key[5])
            if key in self.rest:
                self.rest[key][2] += (hi << 32) + lo
            else:
                self.rest[key] = [s, st, (hi << 32) + lo]

    def _first_dtypes(self, column, at):
        """Code of each row `at`'s first input dtype (flop_rest's input_dtypes[1:1]): -1 none, -2 a null one."""
        chunk = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        offsets = chunk.offsets.to_numpy()
        start, has = offsets[at], offsets[at + 1] > offsets[at]
        values = chunk.values if pa.types.is_dictionary(chunk.type.value_type) else pc.dictionary_encode(chunk.values)
        first = values.take(pa.array(start[has]))
        dtype = np.full(len(at), -1, dtype=np.int64)
        dtype[has] = np.where(np.asarray(first.is_null()), -2, self.dtype.of(first))
        return dtype

    def table(self, wide):
        """flop_rows and flop_rest of the run as one Table of SCHEMA, in seq order (flops float64 when `wide`: an int64
        sum could wrap, as flops.py reads it then); None when a FLOP sum does not fit an int64 (flops.py's query)."""
        walked = pa.concat_tables(self.walked) if self.walked else SCHEMA.empty_table()
        groups = sorted(self.rest.items(), key=lambda item: item[1][0])
        if any(not -(2**63) <= total < 2**63 for _, (_, _, total) in groups) or wide:
            return None
        names = self.phase.names, self.kind.names, self.op.names, self.dtype.names
        rest = pa.table({
            "seq": [s for _, (s, _, _) in groups], "step": [st for _, (_, st, _) in groups],
            "phase": [names[0][k[0]] for k, _ in groups],
            "op": [names[2][k[1]] if k[1] >= 0 else None for k, _ in groups],
            "module": pa.nulls(len(groups), pa.string()), "flop_kind": [names[1][k[2]] for k, _ in groups],
            "flops": [total for _, (_, _, total) in groups], "recompute": [bool(k[3]) for k, _ in groups],
            "causal": pa.nulls(len(groups), pa.bool_()),
            "input_storage_ids": pa.nulls(len(groups), _INTS), "output_storage_ids": pa.nulls(len(groups), _INTS),
            "input_dtypes": [[] if k[4] == -1 else [None] if k[4] == -2 else [names[3][k[4]]] for k, _ in groups],
            "input_shapes": pa.nulls(len(groups), _SHAPES), "output_shapes": pa.nulls(len(groups), _SHAPES),
            "flops_bound": pa.nulls(len(groups), pa.bool_()),
        }, schema=SCHEMA)  # fmt: skip
        # rest's groups between the walked rows, by seq (seq is unique in a run)
        cut = np.searchsorted(walked.column("seq").to_numpy(), rest.column("seq").to_numpy())
        pieces, last = [], 0
        for i, c in enumerate(cut.tolist()):
            pieces += [walked.slice(last, c - last), rest.slice(i, 1)]
            last = c
        return pa.concat_tables([*pieces, walked.slice(last)])


def _where(mask, column, kind):
    """column where mask, else null."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return pc.if_else(mask, column.cast(kind), pa.nulls(len(column), kind))


def _cast(values, kind):
    return values if values.type == kind else values.cast(kind)
