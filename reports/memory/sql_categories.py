"""The memory categories of `optrace report` from a reports.sql.engine.Trace, without a frame of the trace.

    pandas reference (a loaded frame)        here (a Trace)
    reports.by_category(df) (at="peak")      by_category(trace)

The storage-lifetime model of reports/memory/lifetimes.py runs unchanged on every row of the run, so its
result is the reference's, but on a frame of the narrow columns it reads at every row (seq, step, op, phase,
module, the storage id lists, the output dtypes and storage bytes, bytes allocated, live bytes). The wide
list columns (input shapes, strides and dtypes, output shapes) it reads only at the rows where a storage is
first seen as an input or where a row makes several storages of unknown size: those cells come from DuckDB
for those rows when asked (reports.loading.columns.Cells). On a million-row trace the frame is about 160 MB
of Arrow where the whole rows were 560 MB.
"""

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from reports.loading.columns import Cells, SharedRuns, to_pandas
from reports.memory.memory import CATEGORY_DTYPES, STORAGE_COLUMNS
from reports.memory.memory import by_category as reference_by_category
from reports._util import empty_frame

__all__ = ["by_category", "memory_rows"]


def memory_rows(trace, run_index):
    """Run `run_index`'s rows with the narrow columns, as a frame like reports.load's (`run` categorical, list
    columns Arrow-backed), `attrs["runs"]` holding that run only and `attrs["cells"]` giving the wide ones."""
    name, meta = list(trace.runs.items())[run_index]
    columns = [c for c in (*STORAGE_COLUMNS, "output_storage_bytes") if c in trace.columns and c not in _WIDE]
    # no ORDER BY: DuckDB keeps the files' order (preserve_insertion_order), which the Trace's checks found in seq
    # order; sorting a million rows of lists would double the memory
    table = trace.db.sql(f"SELECT {', '.join(columns)} FROM rows WHERE run_index = {run_index}").to_arrow_table()
    for c in ("op", "phase", "module"):  # categorical, as reports.load gives them (a few distinct values)
        if c in table.column_names:
            table = table.set_column(table.column_names.index(c), c, pc.dictionary_encode(table.column(c)))
    frame = to_pandas(table, "arrow")
    if not frame["seq"].is_monotonic_increasing:
        frame = frame.sort_values("seq", kind="stable").reset_index(drop=True)
    frame.insert(0, "run", pd.Categorical.from_codes(np.zeros(len(frame), np.int8), categories=[name]))
    frame.attrs["runs"] = SharedRuns({name: meta})  # shared by derived frames, never deep-copied
    frame.attrs["cells"] = Cells([c for c in _WIDE if c in trace.columns], lambda column, seqs: _cells(trace, run_index,
                                                                                                       column, seqs))
    return frame


_WIDE = ("input_shapes", "input_strides", "input_dtypes", "output_shapes")  # read by the model at a few rows only


def _cells(trace, run_index, column, seqs):
    """Column `column`'s cells at rows `seqs` (distinct) of run `run_index`, in the order of `seqs`, as Arrow."""
    import pyarrow as pa

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
    for i in range(len(trace.runs)):
        rows = memory_rows(trace, i)
        if len(rows):
            frames.append(reference_by_category(rows))
    if not frames:
        return empty_frame(CATEGORY_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(CATEGORY_DTYPES)
