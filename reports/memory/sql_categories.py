"""The memory categories of `optrace report` from a reports.sql.engine.Trace, without a frame of the trace.

    pandas reference (a loaded frame)        here (a Trace)
    reports.by_category(df) (at="peak")      by_category(trace)

The storage-lifetime model of reports/memory/lifetimes.py runs unchanged, so its result is the reference's, on
what DuckDB gives it: the scalar columns it reads at every row (seq, step, phase, bytes allocated, live bytes and
the lengths of the three storage id lists: `memory_rows`), the run's `lifetimes.Lists` aggregated by SQL one row
per storage (each storage's first appearance and first known size, the frees, the storages collectives used:
`memory_lists`), and the other list columns (input shapes, strides and dtypes, output shapes and dtypes) only at
the rows the model asks for (reports.loading.columns.Cells). No list column of the run is held in memory.
"""

import numpy as np
import pandas as pd
import pyarrow as pa

from reports._util import empty_frame
from reports.loading.columns import Cells, SharedRuns
from reports.memory.lifetimes import Lists, Storages
from reports.memory.memory import CATEGORY_DTYPES, categories_at
from reports.memory.resizes import COLLECTIVE_PREFIXES
from reports.sql.engine import literal

__all__ = ["by_category", "memory_lists", "memory_rows"]

_LISTS = ("input_storage_ids", "input_shapes", "input_strides", "input_dtypes", "output_storage_ids",
          "output_shapes", "output_dtypes", "output_storage_bytes", "freed_storage_ids")  # fmt: skip


def memory_rows(trace, run_index):
    """Run `run_index`'s rows in seq order, as a frame like reports.load's (`run` and `phase` categorical) with the
    columns the model reads at every row and the lengths of the id lists (`n_inputs`, `n_outputs`, `n_freed`);
    `attrs["runs"]` holds that run only and `attrs["cells"]` gives the list columns at the rows asked."""
    name, meta = list(trace.runs.items())[run_index]
    where = f"run_index = {run_index}"
    phases = [p for (p,) in trace.db.sql(f"SELECT DISTINCT phase FROM rows WHERE {where} ORDER BY phase").fetchall()]
    codes = f"(list_position([{', '.join(literal(p) for p in phases)}], phase) - 1)::SMALLINT" if phases else "0"
    # no ORDER BY: DuckDB keeps the files' order (preserve_insertion_order), which the Trace's checks found in seq
    # order; no null list either (the checks)
    got = trace.db.sql(f"SELECT seq, step, {codes} AS phase, bytes_allocated, live_bytes, len(input_storage_ids) AS "
                       f"n_inputs, len(output_storage_ids) AS n_outputs, len(freed_storage_ids) AS n_freed FROM rows "
                       f"WHERE {where}").fetchnumpy()  # fmt: skip
    columns = {c: np.asarray(v) for c, v in got.items()}  # int64 without nulls
    del got
    columns["phase"] = pd.Categorical.from_codes(columns["phase"], categories=phases)
    frame = pd.DataFrame(columns, copy=False)  # a block per column: not stacked into one copy
    if not frame["seq"].is_monotonic_increasing:
        frame = frame.sort_values("seq", kind="stable").reset_index(drop=True)
    frame.insert(0, "run", pd.Categorical.from_codes(np.zeros(len(frame), np.int8), categories=[name]))
    frame.attrs["runs"] = SharedRuns({name: meta})  # shared by derived frames, never deep-copied
    frame.attrs["cells"] = Cells([c for c in _LISTS if c in trace.columns],
                                 lambda column, seqs: _cells(trace, run_index, column, seqs))  # fmt: skip
    return frame


def memory_lists(trace, run_index, rows):
    """lifetimes.Lists of run `run_index`, whose rows are `rows` (memory_rows), by SQL over the trace."""
    db, where = trace.db, f"run_index = {run_index}"
    seq = rows["seq"].to_numpy()
    n = len(seq)

    def rows_of(seqs):
        return np.searchsorted(seq, np.asarray(seqs, dtype=np.int64))

    def offsets(column):
        found = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(rows[column].to_numpy(), out=found[1:])
        return found

    in_offsets, out_offsets, free_offsets = (offsets(c) for c in ("n_inputs", "n_outputs", "n_freed"))
    # a list item's key, (seq * 2 + side) * place + its place in the list: a BIGINT while it fits, else a HUGEINT
    place = 1 << max(1, int(max(rows["n_inputs"].max(), rows["n_outputs"].max()))).bit_length()
    key = "BIGINT" if (int(seq[-1]) * 2 + 2) * place < 2**63 else "HUGEINT"

    # each id's first appearance, (row, inputs before outputs, place), and its output_storage_bytes at its first
    # appearance as an output with bytes (rows whose sizes do not pair with their outputs one to one left out)
    first = db.sql(f"""
        WITH ids AS (
            SELECT seq, 0 AS side, unnest(input_storage_ids) AS sid,
                   generate_subscripts(input_storage_ids, 1) - 1 AS k, NULL::BIGINT AS nbytes
            FROM rows WHERE {where}
            UNION ALL
            SELECT seq, 1, unnest(output_storage_ids), generate_subscripts(output_storage_ids, 1) - 1,
                   unnest(CASE WHEN len(output_storage_bytes) = len(output_storage_ids) THEN output_storage_bytes
                               ELSE []::BIGINT[] END)
            FROM rows WHERE {where}),
        firsts AS (
            SELECT sid, min((seq::{key} * 2 + side) * {place} + k) AS key,
                   arg_min(nbytes, seq::{key} * {place} + k) FILTER (WHERE side = 1 AND nbytes >= 0) AS known
            FROM ids GROUP BY sid)
        SELECT sid, (key // {place} // 2)::BIGINT AS seq, (key // {place} % 2)::BIGINT AS side,
               (key % {place})::BIGINT AS k, coalesce(known, -1) AS known
        FROM firsts ORDER BY sid""").fetchnumpy()  # fmt: skip
    seen = first["sid"].astype(np.int64)
    first_row, as_output = rows_of(first["seq"]), first["side"].astype(bool)
    first_at = np.where(as_output, out_offsets[first_row], in_offsets[first_row]) + first["k"]
    freed = db.sql(f"SELECT seq, unnest(freed_storage_ids) AS sid, generate_subscripts(freed_storage_ids, 1) AS k "
                   f"FROM rows WHERE {where} AND len(freed_storage_ids) > 0 ORDER BY seq, k").fetchnumpy()  # fmt: skip
    free_rows, free_ids = rows_of(freed["seq"]), freed["sid"].astype(np.int64)
    top = max([-1] + [int(a.max()) for a in (seen, free_ids) if len(a)])
    known = np.full(top + 1, -1, dtype=np.int64)
    known[seen] = first["known"]
    collective = " OR ".join(f"starts_with(op, '{p}')" for p in COLLECTIVE_PREFIXES)
    comm = db.sql(f"SELECT DISTINCT unnest(list_concat(input_storage_ids, output_storage_ids)) AS sid FROM rows "
                  f"WHERE {where} AND ({collective}) ORDER BY sid").fetchnumpy()["sid"].astype(np.int64)  # fmt: skip

    def row_max():
        found = db.sql(f"SELECT seq, greatest(coalesce(list_max(input_storage_ids), -1), coalesce(list_max("
                       f"output_storage_ids), -1)) AS top FROM rows WHERE {where}").fetchnumpy()  # fmt: skip
        tops = np.full(n, -1, dtype=np.int64)
        tops[rows_of(found["seq"])] = found["top"]
        return tops

    return Lists(in_offsets, out_offsets, free_rows, free_ids, free_offsets, seen, first_row, as_output, first_at,
                 known, comm, row_max, top)  # fmt: skip


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
