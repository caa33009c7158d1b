"""What the storage-lifetime model (reports.memory.lifetimes.Storages) reads of one run, as numpy arrays:

    RunRows   the run's rows in seq order: the scalar columns it reads at every row, and the list columns (shapes,
              strides, dtypes) at the rows it asks for;
    Lists     what it reads of the run's storage id lists.

Two feeds make them: `optrace report`'s scan of the trace's files (reports.memory.sql_categories.memory_rows, no
pandas) and the library's frame from reports.load (reports.memory.frame_rows); tests/reports/sql/test_sql_sections.py
checks that both give the same.
"""

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["Lists", "RunRows"]


class Lists(NamedTuple):
    """What the model reads from a run's storage id lists (input, output and freed storage ids, output storage bytes).

    `reports.memory.frame_rows.lists_of(rows)` makes it from a frame's list columns; reports.memory.row_scan.Scan from
    a scan of the trace's files, without holding the lists in memory. Rows are positions in seq order; a flat position
    is an index into all the rows' inputs (or outputs) one after the other."""

    in_offsets: np.ndarray  # row i's inputs are flat positions in_offsets[i]:in_offsets[i + 1] (n + 1 values)
    out_offsets: np.ndarray  # the same for outputs
    free_rows: np.ndarray  # each freed id's row, in row order
    free_ids: np.ndarray
    free_offsets: np.ndarray  # row i frees free_ids[free_offsets[i]:free_offsets[i + 1]]
    seen: np.ndarray  # every id a row names as an input or an output, ascending
    first_row: np.ndarray  # the row of each one's first appearance (inputs before outputs within a row)
    as_output: np.ndarray  # bool: first seen as an output
    first_at: np.ndarray  # its flat position there (the first of the row's inputs or outputs with that id)
    known: (
        np.ndarray
    )  # [2, k]: ids ascending, and output_storage_bytes at each one's first appearance as an output with bytes
    comm: np.ndarray  # ids a collective row read or wrote, ascending
    row_max: Callable  # row_max(): each row's highest id among its inputs and outputs (-1: none); read by few traces
    top: int  # the highest id any list names (-1: none)


class RunRows:
    """One run's rows in seq order: int64 arrays `seq`, `step`, `live_bytes`, `bytes_allocated`; `phase` as codes into
    `phases` (-1: none); `cell_lists(column, positions=None, kind=pa.int64())` gives a list column's cells at row
    positions (None: every row) as one Arrow ListArray of `kind` items (None: as stored), `cell_objects(column,
    positions=None)` one Python object per row; `lists`: the run's Lists where the feed read them (else None)."""

    def __init__(self, columns, phases, cell_lists, cell_objects, lists=None):
        self.seq, self.step, self.live_bytes, self.bytes_allocated = (
            np.asarray(columns[c], dtype=np.int64) for c in ("seq", "step", "live_bytes", "bytes_allocated")
        )
        self.phase, self.phases = np.asarray(columns["phase"]), tuple(phases)
        self.n = len(self.seq)
        self.cell_lists, self.cell_objects, self.lists = cell_lists, cell_objects, lists

    def __len__(self):
        return self.n

    def in_phase(self, name):
        """bool per row: the row's phase is `name`."""
        if name not in self.phases:
            return np.zeros(self.n, dtype=bool)
        return self.phase == self.phases.index(name)
