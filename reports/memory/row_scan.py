"""What the memory categories read of a run's rows, from one scan of them a batch at a time in seq order
(reports.memory.sql_categories): the scalar columns the lifetime model reads at every row, and what it reads
of the storage id lists (`lifetimes.Lists`), without keeping the lists.

    scan = Scan(rows)          the run's row count: each column filled in place
    scan.feed(batch)           an Arrow Table or batch of Scan.columns (phase as names or as codes), in seq order
    columns = scan.finish(phases)

The Trace's read of the parts feeds it (Trace(keep=[Scan]): reports.sql.rowpass), or a DuckDB scan of its own
does (sql_categories.py). Fed by the Trace's read, which holds every column, it also keeps what the model would
otherwise ask DuckDB for in a scan each: the input dtypes, shapes and strides of the rows where a storage is first
seen as an input (`cells`: the only rows whose cells the model reads, lifetimes.Storages._inputs) and the ids
collective ops read or wrote (`comm`).
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import unique
from reports.arrays import arrow_of, empty_table, list_lengths, list_values, nulls_of, numpy_of
from reports.errors import ReportError
from reports.memory.id_space import PER_ID, SLACK, lowest
from reports.memory.resizes import COLLECTIVE_PREFIXES
from reports.memory.run_rows import Lists
from reports.sql.rowpass import CodeBook

__all__ = ["CELLS", "Scan"]

_NONE = np.iinfo(np.int64).max
_FIRST_ROWS = 1 << 16  # rows the arrays hold before the first batch (Scan grows them up to the rows counted)
_NARROWED = ("seq", "step")  # int32 while fed where they fit (Scan.__init__)
CELLS = ("input_dtypes", "input_shapes", "input_strides")  # kept at the rows where a storage is first seen as an input


class _Firsts:
    """Per storage id, the least flat position it was seen at so far (_NONE: not seen), the array grown as ids come,
    up to id `cap` (which Scan raises with the rows it was fed); ids from `cap` up (a damaged trace's:
    reports.memory.id_space) are kept as they come, in `far`, and sorted out in `pairs`."""

    def __init__(self):
        self.at = np.full(0, _NONE, dtype=np.int64)
        self.cap, self.far = 0, []

    def add(self, ids, positions):
        """Note `ids` at `positions` (increasing)."""
        far = ids >= self.cap
        if far.any():
            self.far.append((ids[far], positions[far]))
            ids, positions = ids[~far], positions[~far]
        if len(ids) and int(ids.max()) >= len(self.at):
            grown = np.full(max(int(ids.max()) + 1, min(2 * len(self.at), self.cap)), _NONE, dtype=np.int64)
            grown[: len(self.at)] = self.at
            self.at = grown
        np.minimum.at(self.at, ids, positions)

    def new(self, ids, positions):
        """add(ids, positions), returning where an id was first seen here (it took that position); an id from `cap`
        up counts as new each time (`pairs` keeps its first)."""
        self.add(ids, positions)
        near = ids < self.cap
        if near.all():
            return self.at[ids] == positions
        hit = np.ones(len(ids), dtype=bool)
        hit[near] = self.at[ids[near]] == positions[near]
        return hit

    def pairs(self):
        """(ids seen, ascending; the least position of each)."""
        seen = np.flatnonzero(self.at != _NONE)
        at = self.at[seen]
        if self.far:  # an id far when it came may be in `at` too, the cap raised since
            far_ids, far_at = (np.concatenate(a) for a in zip(*self.far))
            seen, at = lowest(np.concatenate([seen, far_ids]), np.concatenate([at, far_at]))
        return seen, at


def _first_seen(first_in, first_out):
    """(every id seen as an input or an output ascending, its first input position, its first output position; _NONE:
    never seen so), from the two _Firsts: a presence mask over the ids below the caps (the tracer hands ids out densely),
    a sorted union only where a damaged trace's far ids came (reports.memory.id_space)."""
    if first_in.far or first_out.far:
        (in_ids, in_at), (out_ids, out_at) = first_in.pairs(), first_out.pairs()
        seen = np.union1d(in_ids, out_ids)
        fin, fout = np.full(len(seen), _NONE, dtype=np.int64), np.full(len(seen), _NONE, dtype=np.int64)
        fin[np.searchsorted(seen, in_ids)], fout[np.searchsorted(seen, out_ids)] = in_at, out_at
        return seen, fin, fout
    size = max(len(first_in.at), len(first_out.at))
    fin, fout = (
        f.at if len(f.at) == size else np.concatenate([f.at, np.full(size - len(f.at), _NONE, dtype=np.int64)])
        for f in (first_in, first_out)
    )
    seen = np.flatnonzero((fin != _NONE) | (fout != _NONE))
    return seen, fin[seen], fout[seen]


class Scan:
    """What memory_rows reads of a run, fed its rows a batch at a time in seq order (see the module docstring)."""

    columns = (
        "seq",
        "step",
        "phase",
        "op",
        "bytes_allocated",
        "live_bytes",
        "input_storage_ids",
        "output_storage_ids",
        "output_storage_bytes",
        "freed_storage_ids",
        *CELLS,
    )
    _NAMES = ("seq", "step", "phase", "bytes_allocated", "live_bytes", "n_inputs", "n_outputs", "n_freed")

    def __init__(self, rows, codes=None):
        """`rows`: the run's row count in its footers, a claim: arrays grow to it as rows come, never before; `codes`:
        the reports.sql.rowpass.CodeBook the consumers of the Trace's read share (the op names' codes)."""
        self.ops, self._collective = (codes if codes is not None else CodeBook())["op"], np.zeros(0, dtype=bool)
        # seq and step in int32 while fed where their values fit (int64 from the first batch whose values do not:
        # 8 MB a million rows held through the Trace's open), in int64 from `finish`
        kinds = {c: np.int32 for c in ("seq", "step", "n_inputs", "n_outputs", "n_freed")} | {"phase": np.int16}
        self.n, self.done, self.named = rows, 0, {}  # named: {phase: code} where phases come as strings
        self.arrays = {c: np.empty(min(rows, _FIRST_ROWS), kinds.get(c, np.int64)) for c in self._NAMES}
        self.first_in, self.first_out, self.first_size = _Firsts(), _Firsts(), _Firsts()
        # each id's size at its first appearance with one (-1: none yet), by id below first_size's cap; (ids,
        # positions, sizes) of the ids from it up as they came (`far_sizes`); each batch's freed ids
        self.sizes, self.far_sizes, self.freed = np.full(0, -1, dtype=np.int64), [], []
        self.taken = [0, 0]  # inputs and outputs before this batch
        self.cells, self.comm, self.held = [], [], ()  # with CELLS and op in the batches (held): see the docstring

    def feed(self, batch):
        if self.done + batch.num_rows > self.n:  # more rows than the trace's checks counted: a trace changed while read
            self.done += batch.num_rows
            return
        end = self.done + batch.num_rows
        if end > len(self.arrays["seq"]):  # room for the batch, 16 times over up to the rows counted (np.empty's
            # pages are taken as rows fill them: a copy of what was read, not a page of room, is what a growth costs)
            size = min(self.n, max(end, 16 * len(self.arrays["seq"])))
            self.arrays = {c: self._grown(a, size) for c, a in self.arrays.items()}
        for firsts in (self.first_in, self.first_out, self.first_size):  # ids a run of `end` rows hands out, with slack
            firsts.cap = SLACK + PER_ID * end
        arrays, names, self.held = self.arrays, self._NAMES, batch.schema.names
        rows = slice(self.done, end)
        for c in names[:5]:
            values = self._phases(batch.column(c)) if c == "phase" else numpy_of(batch.column(c))
            if c in _NARROWED and arrays[c].dtype != values.dtype and not _fits(values):
                arrays[c] = self._grown(arrays[c], len(arrays[c]), values.dtype)
            arrays[c][rows] = values
        ids = []
        for c, length in zip(("input_storage_ids", "output_storage_ids", "freed_storage_ids"), names[5:]):
            column = batch.column(c)  # no null list or item: the Trace's checks
            arrays[length][rows] = list_lengths(column)
            ids.append(list_values(column))
        (ins, outs, frees), counts = ids, arrays["n_outputs"][rows]
        self.done += batch.num_rows
        at_in = np.arange(self.taken[0], self.taken[0] + len(ins), dtype=np.int64)
        at_out = np.arange(self.taken[1], self.taken[1] + len(outs), dtype=np.int64)
        new_in = self.first_in.new(ins, at_in)
        self.first_out.add(outs, at_out)
        # a copy (a view would keep the whole batch alive: DuckDB's Arrow batch is one allocation), int32 where it fits
        self.freed.append(frees.astype(np.int32) if _fits(frees) else frees.copy())
        # the sizes of rows whose output_storage_bytes pair with their outputs one to one, where >= 0
        sizes = batch.column("output_storage_bytes")  # null lists in a v1 trace's rows (the column came in v2)
        lengths, values = list_lengths(sizes, null=0), list_values(sizes)
        ok = lengths == counts
        sids, at, values = (
            (outs, at_out, values)
            if ok.all()
            else (outs[np.repeat(ok, counts)], at_out[np.repeat(ok, counts)], values[np.repeat(ok, lengths)])
        )
        with_size = values >= 0
        sids, at, values = sids[with_size], at[with_size], values[with_size]
        new = self.first_size.new(sids, at)  # an earlier batch's first size stays
        self._keep_sizes(sids, at, values, new)
        if all(c in self.held for c in CELLS):
            self._keep_cells(batch, ins[new_in], at_in[new_in] - self.taken[0], arrays["n_inputs"][rows], counts)
        if "op" in self.held:
            self._keep_comm(batch)
        self.taken[0] += len(ins)
        self.taken[1] += len(outs)

    def _keep_sizes(self, sids, at, values, new):
        """Note the sizes of the ids `new` marks (first seen with a size at `at`): by id below first_size's cap, as
        they come from it up (a damaged trace's far ids, reports.memory.id_space)."""
        held = len(self.first_size.at)
        if held > len(self.sizes):  # first_size grew: as far
            grown = np.full(held, -1, dtype=np.int64)
            grown[: len(self.sizes)] = self.sizes
            self.sizes = grown
        near = sids < self.first_size.cap
        if near.all():
            self.sizes[sids[new]] = values[new]
            return
        pick = new & near
        self.sizes[sids[pick]] = values[pick]
        pick = new & ~near
        self.far_sizes.append((sids[pick], at[pick], values[pick]))

    def _known(self):
        """Lists.known: [ids ascending, each one's size at its first appearance with one] (a far id may come more
        than once, the cap raised since: its least position's size)."""
        near = np.flatnonzero(self.sizes >= 0)
        if not self.far_sizes:
            return np.stack([near, self.sizes[near]])
        ids, at, values = (
            np.concatenate([first, *(p[k] for p in self.far_sizes)])
            for k, first in enumerate((near, self.first_size.at[near], self.sizes[near]))
        )
        ids, first = lowest(ids, at)
        order = np.argsort(at, kind="stable")  # a flat output position names one id: each position once
        return np.stack([ids, values[order][np.searchsorted(at[order], first)]])

    def _grown(self, array, size, kind=None):
        """`array`'s rows so far in an array of `size` rows (the rest untouched: no page of it taken yet), of dtype
        `kind` (None: `array`'s)."""
        grown = np.empty(size, array.dtype if kind is None else kind)
        grown[: self.done] = array[: self.done]
        return grown

    def _keep_cells(self, batch, sids, at, n_inputs, n_outputs):
        """CELLS at the rows of this batch where an id is first seen as an input (`sids` at input positions `at` in the
        batch) and not before as an output (an output of an earlier row: inputs come before outputs in a row)."""
        in_rows = np.searchsorted(np.cumsum(n_inputs), at, side="right")  # the row of each input position
        known = self.first_out.at  # holds this batch's outputs already
        seen = (
            np.where(sids < len(known), known[np.minimum(sids, len(known) - 1)], _NONE)
            if len(known)
            else np.full(len(sids), _NONE, dtype=np.int64)
        )
        out_start = np.concatenate([[0], np.cumsum(n_outputs)]).astype(np.int64) + self.taken[1]
        out_rows = (
            np.searchsorted(out_start, np.where(seen != _NONE, seen, 0), side="right") - 1
        )  # -1: an earlier batch
        first = (seen == _NONE) | (out_rows >= in_rows)
        picked = arrow_of(unique(in_rows[first]).astype(np.int64))
        if len(picked):
            taken = batch.select(["seq", *CELLS]).take(picked)  # one take for the four columns
            cells = [taken.column(c) for c in ("seq", *CELLS)]
            cells[1] = cells[1].cast(pa.list_(pa.string()))  # input_dtypes as DuckDB gives them
            self.cells.append(pa.Table.from_arrays(cells, names=["seq", *CELLS]))

    def _keep_comm(self, batch):
        """The ids of the batch's collective rows (resizes.COLLECTIVE_PREFIXES)."""
        op = batch.column("op")
        codes, names = self.ops.of(op), self.ops.names
        if len(self._collective) != len(names):  # each op name tested once, not per row
            self._collective = np.fromiter((n.startswith(COLLECTIVE_PREFIXES) for n in names), bool, len(names))
        hits = self._collective[codes]
        at = np.flatnonzero(hits & ~nulls_of(op) if op.null_count else hits)
        if len(at):
            rows = arrow_of(at.astype(np.int64))
            for c in ("input_storage_ids", "output_storage_ids"):
                self.comm.append(numpy_of(pc.list_flatten(batch.column(c).take(rows))))

    def _phases(self, column):
        """Phase codes of a column of codes, or of phase names (numbered as first seen, for `finish` to renumber)."""
        if pa.types.is_integer(column.type):
            return numpy_of(column)
        codes = []
        for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
            chunk = chunk if pa.types.is_dictionary(chunk.type) else pc.dictionary_encode(chunk)
            index = [self.named.setdefault(p, len(self.named)) for p in chunk.dictionary.to_pylist()]
            codes.append(
                np.asarray(index, dtype=np.int16)[numpy_of(chunk.indices)] if index else np.zeros(len(chunk), np.int16)
            )
        return np.concatenate(codes) if codes else np.zeros(0, np.int16)

    def finish(self, path, phases):
        """{column: array} of memory_rows (phases numbered as in `phases`); then `lists` and `kept_cells` read what
        was kept. `path`: the run's, for the error of a trace that changed while read."""
        if self.done != self.n:
            raise ReportError(
                f"{path}: {self.done} rows read where the trace held {self.n} when opened (it changed "
                "while read): read the trace again"
            )
        arrays = self.arrays
        if self.named:
            lookup = np.zeros(len(self.named), dtype=np.int16)
            for p, code in self.named.items():  # a part's dictionary may hold a phase no row of it has
                lookup[code] = phases.index(p) if p in phases else 0
            arrays["phase"] = lookup[arrays["phase"]]
        for c in _NARROWED:  # as the model reads them
            arrays[c] = arrays[c].astype(np.int64, copy=False)
        self.free_ids = np.concatenate(self.freed) if self.freed else np.zeros(0, np.int32)
        self.freed = None
        return arrays

    def kept_comm(self):
        """The ids collective rows read or wrote, ascending (comm of Lists); None when the batches held no op."""
        return unique(np.concatenate([np.zeros(0, np.int64), *self.comm])) if "op" in self.held else None

    def kept_cells(self):
        """A Table of seq and CELLS at the rows kept (ascending seq); None when the batches held no CELLS."""
        if not all(c in self.held for c in CELLS):
            return None
        if self.cells:
            return pa.concat_tables(self.cells)
        types = [pa.int64(), pa.list_(pa.string()), pa.list_(pa.list_(pa.int64())), pa.list_(pa.list_(pa.int64()))]
        return empty_table(pa.schema(list(zip(("seq", *CELLS), types))))

    def lists(self, columns, comm, row_max):
        """The run's lifetimes.Lists; `columns`: what `finish` gave, `comm` and `row_max` as Lists holds them. Once: the
        firsts, sizes and counts (n_inputs, n_outputs, n_freed, taken out of `columns`) the feed kept are let go as the
        Lists is made, each once read; ids, rows and flat positions in int32 where they fit (a million rows' Lists
        took 34 MB in int64, 26 MB so)."""
        n = len(columns["seq"])
        known = self._known()
        self.sizes = self.far_sizes = self.first_size = None

        def offsets(column):  # int32 where the positions fit (half the memory of int64: 4 MB a million rows)
            counts = columns.pop(column)
            kind = np.int32 if int(counts.sum(dtype=np.int64)) < 2**31 else np.int64
            found = np.zeros(n + 1, dtype=kind)
            np.cumsum(counts, dtype=kind, out=found[1:])
            return found

        free_counts = columns["n_freed"]
        in_offsets, out_offsets, free_offsets = (offsets(c) for c in ("n_inputs", "n_outputs", "n_freed"))
        narrow = n < 2**31  # rows in int32
        free_rows = np.repeat(np.arange(n, dtype=np.int32 if narrow else np.int64), free_counts)
        del free_counts
        seen, fin, fout = _first_seen(self.first_in, self.first_out)
        self.first_in = self.first_out = None
        row_in = _rows_of(in_offsets, fin)
        row_out = _rows_of(out_offsets, fout)
        # the first appearance: the least row, inputs before outputs within a row
        as_output = (fout != _NONE) & ((fin == _NONE) | (row_out < row_in))
        first_row = _narrow(np.where(as_output, row_out, row_in), narrow)
        del row_in, row_out
        flat = in_offsets.dtype == out_offsets.dtype == np.int32  # flat positions in int32
        first_at = _narrow(np.where(as_output, fout, fin), flat)
        del fin, fout
        free_ids = self.free_ids
        top = max([-1] + [int(a.max()) for a in (seen, free_ids) if len(a)])
        return Lists(
            in_offsets,
            out_offsets,
            free_rows,
            free_ids,
            free_offsets,
            _narrow(seen, top < 2**31),
            first_row,
            as_output,
            first_at,
            known.astype(np.int64, copy=False),
            comm,
            row_max,
            top,
        )


def _rows_of(offsets, positions):
    """The row of each flat position (_NONE: any row, as_output masks it), from the rows' `offsets`."""
    found = np.searchsorted(offsets, np.where(positions != _NONE, positions, 0), side="right")
    found -= 1
    return found


def _fits(values):
    """Whether every one of `values` fits int32 (none: they do)."""
    return not len(values) or -(2**31) <= int(values.min()) and int(values.max()) < 2**31


def _narrow(values, fits):
    """`values` in int32 where `fits` (every value below 2**31), else as they are."""
    return values.astype(np.int32) if fits else values
