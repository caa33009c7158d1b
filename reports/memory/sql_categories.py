"""The memory categories of `optrace report` from a reports.sql.engine.Trace, without a frame of the trace.

    pandas reference (a loaded frame)        here (a Trace)
    reports.by_category(df) (at="peak")      by_category(trace)

SQL (reports/sql/memory.sql) finds the rows where the storage-lifetime model of reports/memory/lifetimes.py
learns something: the first row naming each storage (as an input, as an output, as an output with its
size), the row before a storage's first naming as an input (the rise of live_bytes from it sizes the
storage), every row that frees storages or runs a collective, each row where a backward begins and the
row before it, the first and last rows, the peak, and the first row at or after each in-place resize.
Only those rows, with only the columns the model reads, come into Python, where the reference model runs
on them. The result is the same as on every row: the model compares rows only by their order (a storage's
life is from its allocating row to its freeing row; a category asks whether a backward began in between),
and reads a row's own facts only at the rows kept here; the row before a kept row is read only where it
is kept too. On a training step most rows allocate or free, so the cut is in columns more than in rows:
no per-row time, FLOP, byte or shape column but the few rows' lists.
"""

import pandas as pd

from reports.loading.columns import to_pandas
from reports.memory.lifetimes import RESIZED
from reports.memory.memory import CATEGORY_DTYPES, STORAGE_COLUMNS
from reports.memory.memory import by_category as reference_by_category
from reports._util import empty_frame

__all__ = ["by_category", "memory_rows"]


def memory_rows(trace, run_index):
    """The kept rows of one run (see the module docstring) as a frame like reports.load's (`run` categorical,
    list columns Arrow-backed), `attrs["runs"]` holding that run only."""
    name, meta = list(trace.runs.items())[run_index]
    columns = [c for c in STORAGE_COLUMNS if c in trace.columns]
    if "output_storage_bytes" in trace.columns:
        columns.append("output_storage_bytes")
    resized = [int(r[0]) for r in ((meta.get("storage_roles") or {}).get(RESIZED) or []) if len(r) == 3]
    at_resizes = ""
    if resized:  # the first row at or after each resize's seq: where the model starts counting the new size
        listed = ", ".join(str(s) for s in sorted(set(resized)))
        at_resizes = (f" UNION SELECT {run_index}, min(r.seq) FROM rows AS r JOIN (SELECT unnest([{listed}]) AS s) AS x "
                      f"ON r.seq >= x.s WHERE r.run_index = {run_index} GROUP BY x.s")  # fmt: skip
    query = (f"SELECT {', '.join(columns)} FROM rows WHERE run_index = {run_index} AND seq IN "
             f"(SELECT seq FROM (SELECT run_index, seq FROM memory_seqs WHERE run_index = {run_index}{at_resizes}) "
             f"WHERE seq IS NOT NULL) ORDER BY seq")  # fmt: skip
    table = trace.db.sql(query).to_arrow_table()
    frame = to_pandas(table, "arrow")
    frame.insert(0, "run", pd.Categorical([name] * len(frame), categories=[name]))
    frame.attrs["runs"] = {name: meta}
    return frame


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
