"""The memory categories of `optrace report` from a reports.sql.engine.Trace, without a frame of the trace and
without pandas.

    the library (a loaded frame)             here (a Trace)
    reports.by_category(df) (at="peak")      by_category(trace): a pyarrow.Table of the same columns and values

Both run the one storage-lifetime model (reports.memory.lifetimes.Storages, reports.memory.live.categories_at) on
numpy arrays; here they come from one scan of the run (memory_rows; reports.memory.row_scan fed the Trace's read
of the parts, or Arrow batches of 65,536 rows of a DuckDB scan of its own): the scalar columns it reads at every row
(seq, step, phase, bytes allocated, live bytes and the lengths of the three storage id lists) and the run's
`lifetimes.Lists`, one entry per storage (each storage's first appearance and first known size, found batch by batch
with numpy as the library's feed reads them from a frame, reports.memory.frame_rows; the frees), with the storages
collectives used (`memory_lists`); the other list columns (input shapes, strides and dtypes, output shapes and dtypes)
only at the rows the model asks for (kept by that read where it was the Trace's, else read then). No list column of
the run is held in memory.
"""

import numpy as np
import pyarrow as pa

from reports.arrays import arrow_of, empty_table, numpy_of, strings, whole
from reports.memory.lifetimes import Storages
from reports.memory.live import categories_at
from reports.memory.resizes import COLLECTIVE_PREFIXES
from reports.memory.row_scan import Scan
from reports.memory.run_rows import RunRows
from reports.sql.engine import literal

__all__ = ["by_category", "give_back", "memory_lists", "memory_rows"]

_LISTS = (
    "input_storage_ids",
    "input_shapes",
    "input_strides",
    "input_dtypes",
    "output_storage_ids",
    "output_shapes",
    "output_dtypes",
    "output_storage_bytes",
    "freed_storage_ids",
)


_BATCH = 1 << 16  # rows per Arrow batch of the one scan of memory_rows


def memory_rows(trace, run_index):
    """Run `run_index`'s rows in seq order, as a reports.memory.run_rows.RunRows: the columns the model reads at every
    row, the list columns at the rows it asks for (read from the trace), and the run's Lists (`lists`).

    One scan of the run reads those columns and the id lists, a batch of rows at a time (reports.memory.row_scan):
    the lists are not kept, only what memory_lists gives (each id's first appearance and first known size, the frees).
    The scan is the one the Trace made as it checked the run's rows (Trace(keep=[Scan]): reports.sql.rowpass),
    else a DuckDB scan of its own."""
    give_back()
    where = f"run_index = {run_index}"
    phases = [p for (p,) in trace.db.sql(f"SELECT DISTINCT phase FROM _steps WHERE {where} ORDER BY phase").fetchall()]
    scan = trace.take_kept(Scan, run_index) or _scan(trace, run_index, phases, order=False)
    columns = scan.finish(trace.paths[run_index], phases)
    seq = columns["seq"]
    if not (seq[1:] > seq[:-1]).all():  # DuckDB keeps the files' order, which the Trace's checks found in seq
        scan = _scan(trace, run_index, phases, order=True)  # order (so this is for safety only)
        columns = scan.finish(trace.paths[run_index], phases)
    seq = columns["seq"]
    kept, present = scan.kept_cells(), {c for c in _LISTS if c in trace.columns}

    def cell_lists(column, positions=None, kind=pa.int64()):
        if column not in present:
            raise KeyError(column)  # as a frame without the column
        found = _cells(trace, run_index, column, seq if positions is None else seq[positions], kept)
        return found if kind is None or found.type == pa.list_(kind) else found.cast(pa.list_(kind))

    comm = scan.kept_comm()
    comm = _comm(trace.db, where) if comm is None else comm
    lists = scan.lists(columns, comm, _row_max(trace.db, where, seq))
    return RunRows(columns, phases, cell_lists, lambda c, at=None: cell_lists(c, at, None).to_pylist(), lists)


def give_back():
    """Hand the pages the C library's malloc holds freed back to the system (glibc's malloc_trim; elsewhere nothing),
    before the model's arrays are made: the parts reports.sql.rowpass decodes on its reading thread live in that
    thread's malloc arena, whose freed pages glibc keeps where they are not at the arena's top. Some runs of a
    million-row report peaked up to 28 MB higher than the others, the pages freed as the Trace's open ended still held
    by the process; the trim takes about 0.5 ms."""
    global _TRIM
    if _TRIM is None:
        import ctypes

        try:
            _TRIM = ctypes.CDLL(None).malloc_trim
        except (AttributeError, OSError, TypeError):  # not glibc
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None  # glibc's malloc_trim, False where there is none; found when give_back is first called


def _scan(trace, run_index, phases, order):
    """A Scan of run `run_index` fed by one DuckDB scan of its rows (phase as its index in `phases`)."""
    codes = f"(list_position([{', '.join(literal(p) for p in phases)}], phase) - 1)::SMALLINT" if phases else "0"
    reader = trace.db.sql(
        f"SELECT seq, step, {codes} AS phase, bytes_allocated, live_bytes, input_storage_ids, "
        f"output_storage_ids, output_storage_bytes, freed_storage_ids FROM rows WHERE run_index = "
        f"{run_index}" + (" ORDER BY seq" if order else "")
    ).to_arrow_reader(_BATCH)
    scan = Scan(trace._ops()[run_index])  # the run's rows (run_totals): each column filled in place, batch by batch
    for batch in reader:
        scan.feed(batch)
    return scan


def _comm(db, where):
    """The ids collective rows read or wrote, ascending."""
    collective = " OR ".join(f"starts_with(op, '{p}')" for p in COLLECTIVE_PREFIXES)
    return (
        db.sql(
            f"SELECT DISTINCT unnest(list_concat(input_storage_ids, output_storage_ids)) AS sid FROM rows "
            f"WHERE {where} AND ({collective}) ORDER BY sid"
        )
        .fetchnumpy()["sid"]
        .astype(np.int64)
    )


def _row_max(db, where, seq):
    """Lists.row_max: each row's highest input or output id (-1: none), read when asked (rows at `seq`)."""

    def row_max():
        found = db.sql(
            f"SELECT seq, greatest(coalesce(list_max(input_storage_ids), -1), coalesce(list_max("
            f"output_storage_ids), -1)) AS top FROM rows WHERE {where}"
        ).fetchnumpy()
        tops = np.full(len(seq), -1, dtype=np.int64)
        tops[np.searchsorted(seq, np.asarray(found["seq"], dtype=np.int64))] = found["top"]
        return tops

    return row_max


def memory_lists(trace, run_index, rows):
    """lifetimes.Lists of run `run_index`, whose rows are `rows` (memory_rows, which read them in its scan)."""
    return rows.lists


def _cells(trace, run_index, column, seqs, kept=None):
    """Column `column`'s cells at rows `seqs` (distinct) of run `run_index`, in the order of `seqs`, as Arrow: from
    `kept` (a Table of seq and some columns at some rows, ascending: row_scan.Scan.kept_cells) when it holds them."""
    seqs = np.asarray(seqs, dtype=np.int64)
    if kept is not None and column in kept.column_names:
        have = numpy_of(kept.column("seq"))
        at = np.minimum(np.searchsorted(have, seqs), max(len(have) - 1, 0))
        if len(have) and (have[at] == seqs).all() or not len(seqs):
            return whole(kept.column(column)).take(arrow_of(at if len(seqs) else at[:0]))
    if not len(seqs):
        return whole(trace.db.sql(f"SELECT {column} FROM rows LIMIT 0").to_arrow_table().column(0))
    trace.db.register("_wanted", pa.Table.from_arrays([arrow_of(np.unique(seqs))], names=["seq"]))
    try:
        found = trace.db.sql(
            f"SELECT seq, {column} FROM rows WHERE run_index = {run_index} "
            "AND seq IN (SELECT seq FROM _wanted) ORDER BY seq"
        ).to_arrow_table()
    finally:
        trace.db.unregister("_wanted")
    at = np.searchsorted(numpy_of(found.column("seq")), seqs)
    return whole(found.column(column)).take(arrow_of(at))


SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("category", pa.string()),
        ("bytes", pa.int64()),
        ("seq", pa.int64()),
        ("live_pct", pa.float64()),
    ]
)  # reports.memory.memory.CATEGORY_DTYPES


def by_category(trace):
    """reports.by_category(df) (bytes live per category at each run's peak) of every run of the trace, as a
    pyarrow.Table (SCHEMA: its columns and their order)."""
    tables = [_at_peak(trace, i, name, meta) for i, (name, meta) in enumerate(trace.runs.items())]
    tables = [t for t in tables if t is not None]
    return pa.concat_tables(tables) if tables else empty_table(SCHEMA)


def _at_peak(trace, run_index, name, meta):
    """by_category's rows of one run (None: the run has no rows); its rows and model let go on return, before the
    next run's are read (compare holds two or more runs)."""
    rows = memory_rows(trace, run_index)
    if not len(rows):
        return None
    found = categories_at(Storages(name, meta, rows), "peak")
    columns = [strings(found[c]) if c in ("run", "category") else arrow_of(found[c]) for c in SCHEMA.names]
    return pa.Table.from_arrays(columns, schema=SCHEMA)
