"""The memory categories of `optrace report` from a reports.sql.engine.Trace, without a frame of the trace.

    pandas reference (a loaded frame)        here (a Trace)
    reports.by_category(df) (at="peak")      by_category(trace)

The storage-lifetime model of reports/memory/lifetimes.py runs unchanged, so its result is the reference's, on
what one scan of the run gives it (memory_rows, Arrow batches of 65,536 rows): the scalar columns it reads at every
row (seq, step, phase, bytes allocated, live bytes and the lengths of the three storage id lists) and the run's
`lifetimes.Lists`, one entry per storage (each storage's first appearance and first known size, found batch by batch
with numpy as the reference finds them; the frees), with the storages collectives used (`memory_lists`); the other
list columns (input shapes, strides and dtypes, output shapes and dtypes) only at the rows the model asks for
(reports.loading.columns.Cells). No list column of the run is held in memory.
"""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import empty_frame
from reports.errors import ReportError
from reports.loading.columns import Cells, SharedRuns
from reports.memory.lifetimes import Lists, Storages
from reports.memory.memory import CATEGORY_DTYPES, categories_at
from reports.memory.resizes import COLLECTIVE_PREFIXES
from reports.sql.engine import literal

__all__ = ["by_category", "memory_lists", "memory_rows"]

_LISTS = ("input_storage_ids", "input_shapes", "input_strides", "input_dtypes", "output_storage_ids",
          "output_shapes", "output_dtypes", "output_storage_bytes", "freed_storage_ids")  # fmt: skip


_BATCH = 1 << 16  # rows per Arrow batch of the one scan of memory_rows
_NONE = np.iinfo(np.int64).max


class _Firsts:
    """Per storage id, the least flat position it was seen at so far (_NONE: not seen), the array grown as ids come."""

    def __init__(self):
        self.at = np.full(0, _NONE, dtype=np.int64)

    def add(self, ids, positions):
        """Note `ids` at `positions` (increasing)."""
        if len(ids) and int(ids.max()) >= len(self.at):
            grown = np.full(max(int(ids.max()) + 1, 2 * len(self.at)), _NONE, dtype=np.int64)
            grown[: len(self.at)] = self.at
            self.at = grown
        np.minimum.at(self.at, ids, positions)

    def new(self, ids, positions):
        """add(ids, positions), returning where an id was first seen here (it took that position)."""
        self.add(ids, positions)
        return self.at[ids] == positions

    def of(self, size):
        return np.concatenate([self.at[:size], np.full(max(0, size - len(self.at)), _NONE, dtype=np.int64)])


def memory_rows(trace, run_index):
    """Run `run_index`'s rows in seq order, as a frame like reports.load's (`run` and `phase` categorical) with the
    columns the model reads at every row and the lengths of the id lists (`n_inputs`, `n_outputs`, `n_freed`);
    `attrs["runs"]` holds that run only and `attrs["cells"]` gives the list columns at the rows asked.

    One scan of the run reads those columns and the id lists, a batch of rows at a time: the lists are not kept, only
    what memory_lists gives (each id's first appearance and first known size, the frees), in `attrs["lists"]`."""
    name, meta = list(trace.runs.items())[run_index]
    where = f"run_index = {run_index}"
    phases = [p for (p,) in trace.db.sql(f"SELECT DISTINCT phase FROM _steps WHERE {where} ORDER BY phase").fetchall()]
    columns, lists = _scan(trace, run_index, phases, order=False)
    seq = columns["seq"]
    if not (seq[1:] > seq[:-1]).all():  # DuckDB keeps the files' order, which the Trace's checks found in seq
        columns, lists = _scan(trace, run_index, phases, order=True)  # order (so this is for safety only)
    columns["phase"] = pd.Categorical.from_codes(columns["phase"], categories=phases)
    frame = pd.DataFrame(columns, copy=False)  # a block per column: not stacked into one copy
    frame.insert(0, "run", pd.Categorical.from_codes(np.zeros(len(frame), np.int8), categories=[name]))
    frame.attrs["runs"] = SharedRuns({name: meta})  # shared by derived frames, never deep-copied
    frame.attrs["cells"] = Cells([c for c in _LISTS if c in trace.columns],
                                 lambda column, seqs: _cells(trace, run_index, column, seqs))  # fmt: skip
    frame.attrs["lists"] = _Kept(lists(frame))
    return frame


class _Kept:
    """attrs["lists"]: the run's Lists, shared (not deep-copied) by derived frames."""

    def __init__(self, value):
        self.value = value

    def __deepcopy__(self, memo):
        return self


def _scan(trace, run_index, phases, order):
    """({column: array} of memory_rows, a function of the frame giving its Lists) from one scan of run `run_index`."""
    db, where = trace.db, f"run_index = {run_index}"
    codes = f"(list_position([{', '.join(literal(p) for p in phases)}], phase) - 1)::SMALLINT" if phases else "0"
    reader = db.sql(f"SELECT seq, step, {codes} AS phase, bytes_allocated, live_bytes, input_storage_ids, "
                    f"output_storage_ids, output_storage_bytes, freed_storage_ids FROM rows WHERE {where}"
                    + (" ORDER BY seq" if order else "")).to_arrow_reader(_BATCH)  # fmt: skip
    names = ("seq", "step", "phase", "bytes_allocated", "live_bytes", "n_inputs", "n_outputs", "n_freed")
    n = trace._ops()[run_index]  # the run's rows (run_totals): each column filled in place, batch by batch
    kinds = {"phase": np.int16, "n_inputs": np.int32, "n_outputs": np.int32, "n_freed": np.int32}
    columns = {c: np.empty(n, kinds.get(c, np.int64)) for c in names}
    done = 0
    first_in, first_out, first_size = _Firsts(), _Firsts(), _Firsts()
    known, freed = [], []  # (ids, sizes) at their first appearance with a size in a batch; the freed ids
    taken = [0, 0]  # inputs and outputs before this batch
    for batch in reader:
        if done + batch.num_rows > n:  # more rows than the trace's checks counted: a trace changed while read
            done += batch.num_rows
            continue
        rows = slice(done, done + batch.num_rows)
        for c in names[:5]:
            columns[c][rows] = batch.column(c).to_numpy()
        ids = []
        for c, length in zip(("input_storage_ids", "output_storage_ids", "freed_storage_ids"), names[5:]):
            column = batch.column(c)  # no null list or item: the Trace's checks
            columns[length][rows] = pc.list_value_length(column).to_numpy()
            ids.append(column.flatten().to_numpy())
        (ins, outs, frees), counts = ids, columns["n_outputs"][rows]
        done += batch.num_rows
        at_in = np.arange(taken[0], taken[0] + len(ins), dtype=np.int64)
        at_out = np.arange(taken[1], taken[1] + len(outs), dtype=np.int64)
        first_in.add(ins, at_in)
        first_out.add(outs, at_out)
        freed.append(frees.copy())  # a view would keep the whole batch alive (DuckDB's Arrow batch is one allocation)
        # the sizes of rows whose output_storage_bytes pair with their outputs one to one, where >= 0
        sizes = batch.column("output_storage_bytes")
        lengths, values = pc.list_value_length(sizes).to_numpy(), sizes.flatten().to_numpy()
        ok = lengths == counts
        sids, at, values = (outs, at_out, values) if ok.all() else (
            outs[np.repeat(ok, counts)], at_out[np.repeat(ok, counts)], values[np.repeat(ok, lengths)])  # fmt: skip
        with_size = values >= 0
        sids, at, values = sids[with_size], at[with_size], values[with_size]
        new = first_size.new(sids, at)  # an earlier batch's first size stays
        known.append((sids[new], values[new]))
        taken[0] += len(ins)
        taken[1] += len(outs)
    if done != n:
        raise ReportError(f"{trace.paths[run_index]}: {done} rows read where the trace held {n} when opened (it "
                          "changed while read): read the trace again")
    free_ids = np.concatenate(freed).astype(np.int64, copy=False) if freed else np.zeros(0, np.int64)

    def lists(rows):
        n = len(rows)

        def offsets(column):
            found = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(rows[column].to_numpy(), out=found[1:])
            return found

        in_offsets, out_offsets, free_offsets = (offsets(c) for c in ("n_inputs", "n_outputs", "n_freed"))
        size = max(len(first_in.at), len(first_out.at))
        fin, fout = first_in.of(size), first_out.of(size)
        seen = np.flatnonzero((fin != _NONE) | (fout != _NONE))
        fin, fout = fin[seen], fout[seen]
        row_in = np.searchsorted(in_offsets, np.where(fin != _NONE, fin, 0), side="right") - 1
        row_out = np.searchsorted(out_offsets, np.where(fout != _NONE, fout, 0), side="right") - 1
        # the first appearance: the least row, inputs before outputs within a row
        as_output = (fout != _NONE) & ((fin == _NONE) | (row_out < row_in))
        first_row, first_at = np.where(as_output, row_out, row_in), np.where(as_output, fout, fin)
        free_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(free_offsets))
        top = max([-1] + [int(a.max()) for a in (seen, free_ids) if len(a)])
        sizes = np.full(top + 1, -1, dtype=np.int64)
        for sids, values in known:
            sizes[sids] = values
        return Lists(in_offsets, out_offsets, free_rows, free_ids, free_offsets, seen, first_row, as_output, first_at,
                     sizes, _comm(db, where), _row_max(db, where, rows["seq"].to_numpy()), top)  # fmt: skip

    return columns, lists


def _comm(db, where):
    """The ids collective rows read or wrote, ascending."""
    collective = " OR ".join(f"starts_with(op, '{p}')" for p in COLLECTIVE_PREFIXES)
    return db.sql(f"SELECT DISTINCT unnest(list_concat(input_storage_ids, output_storage_ids)) AS sid FROM rows "
                  f"WHERE {where} AND ({collective}) ORDER BY sid").fetchnumpy()["sid"].astype(np.int64)  # fmt: skip


def _row_max(db, where, seq):
    """Lists.row_max: each row's highest input or output id (-1: none), read when asked (rows at `seq`)."""

    def row_max():
        found = db.sql(f"SELECT seq, greatest(coalesce(list_max(input_storage_ids), -1), coalesce(list_max("
                       f"output_storage_ids), -1)) AS top FROM rows WHERE {where}").fetchnumpy()  # fmt: skip
        tops = np.full(len(seq), -1, dtype=np.int64)
        tops[np.searchsorted(seq, np.asarray(found["seq"], dtype=np.int64))] = found["top"]
        return tops

    return row_max


def memory_lists(trace, run_index, rows):
    """lifetimes.Lists of run `run_index`, whose rows are `rows` (memory_rows, which read them in its scan)."""
    return rows.attrs["lists"].value


def _cells(trace, run_index, column, seqs):
    """Column `column`'s cells at rows `seqs` (distinct) of run `run_index`, in the order of `seqs`, as Arrow."""
    seqs = np.asarray(seqs, dtype=np.int64)
    if not len(seqs):
        return trace.db.sql(f"SELECT {column} FROM rows LIMIT 0").to_arrow_table().column(0).combine_chunks()
    trace.db.register("_wanted", pa.table({"seq": np.unique(seqs)}))
    try:
        found = trace.db.sql(f"SELECT seq, {column} FROM rows WHERE run_index = {run_index} "
                             "AND seq IN (SELECT seq FROM _wanted) ORDER BY seq").to_arrow_table()  # fmt: skip
    finally:
        trace.db.unregister("_wanted")
    at = np.searchsorted(found.column("seq").to_numpy(), seqs)
    return found.column(column).combine_chunks().take(pa.array(at))


def by_category(trace):
    """reports.by_category(df) (bytes live per category at each run's peak) of every run of the trace."""
    frames = []
    for i, (name, meta) in enumerate(trace.runs.items()):
        rows = memory_rows(trace, i)
        if len(rows):
            lists = memory_lists(trace, i, rows)
            frames.append(categories_at(Storages(name, meta, rows, lists), "peak"))
    if not frames:
        return empty_frame(CATEGORY_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(CATEGORY_DTYPES)
