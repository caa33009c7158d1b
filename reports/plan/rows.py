"""What a plan reads of a trace: each run's rows as Arrow with numpy columns, its metadata, and the feed of the
storage-lifetime model, made once for every part of the plan and without pandas.

    PlanRows        one run's rows (a pyarrow.Table, reports.flops.rows.Rows), with the accessors the plan's
                    modules read (numbers with NaN for a null, validity, strings, a subset of the rows)
    Run             (name, metadata, PlanRows, memory()): memory() gives the run's rows in seq order as
                    reports.memory.run_rows.RunRows, what reports.memory.lifetimes.Storages reads
    trace_runs      the Runs of a reports.sql.engine.Trace (`optrace plan`: the one engine's scan of the files)
    frame_runs      the Runs of a DataFrame of reports.load (the library's boundary: reports.plan.plan.plan)
    plan_rows       PlanRows of a DataFrame (or PlanRows as they are): the boundary of the plan's functions
"""

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import arrow_of, numpy_of, objects_of
from reports.flops.rows import Frame, Rows

__all__ = ["PlanRows", "Run", "frame_runs", "plan_rows", "trace_runs"]


class PlanRows(Rows):
    """One run's rows (reports.flops.rows.Rows) with the reads the plan makes of them, each column read once."""

    def floats(self, name):
        """A numeric column as float64, NaN for a null (all NaN for a column of nulls)."""
        key = ("floats", name)
        if key not in self._read:
            column = self._column(name)
            if pa.types.is_null(column.type):
                self._read[key] = np.full(len(column), np.nan)
            else:
                self._read[key] = np.asarray(numpy_of(column.cast(pa.float64()), null=np.nan), dtype=np.float64)
        return self._read[key]

    def ints(self, name):
        """An integer column without nulls as int64."""
        return np.asarray(numpy_of(self._column(name).cast(pa.int64())), dtype=np.int64)

    def valid(self, name):
        """Boolean array: the rows whose `name` is not null."""
        key = ("valid", name)
        if key not in self._read:
            found = pc.is_valid(self._column(name)).cast(pa.uint8())
            self._read[key] = numpy_of(found).astype(bool)
        return self._read[key]

    def objects(self, name):
        """A string (or dictionary) column as an object array, None for a null."""
        key = ("objects", name)
        if key not in self._read:
            column = self._column(name)
            if pa.types.is_dictionary(column.type):
                column = column.cast(column.type.value_type)
            self._read[key] = objects_of(column)
        return self._read[key]

    def words(self, name):
        """A string column as an object array of str, a null as "None" (what astype(str) of a frame's column gives)."""
        return np.asarray(["None" if v is None else v for v in self.objects(name)], dtype=object)

    def cell_objects(self, name, at=None):
        """The cells of list column `name` (at row positions `at`, every row when None) as Python lists."""
        if at is None:
            return self._column(name).to_pylist()
        return self._column(name).take(arrow_of(np.asarray(at, dtype=np.int64))).to_pylist()

    def take(self, at):
        """The PlanRows of the rows at positions (or a boolean mask) `at`, in that order."""
        at = np.asarray(at)
        at = np.flatnonzero(at) if at.dtype == bool else at.astype(np.int64)
        if len(at) == len(self) and (at == np.arange(len(self))).all():
            return self
        return PlanRows(self.table.take(arrow_of(at)))


class Run(NamedTuple):
    """A run to plan: its name, metadata, rows (PlanRows, in the order the plan prices them) and `memory`, which
    gives its rows in seq order as a reports.memory.run_rows.RunRows (read when first asked for)."""

    name: str
    meta: dict
    rows: PlanRows
    memory: Callable

    def frame(self, rows=None):
        """The run's `rows` (default all of them) as a reports.flops.rows.Frame (reports.flops.mfu.mfu_table's)."""
        return Frame((self.rows if rows is None else rows).table, {self.name: self.meta})


def _once(make):
    found = []

    def memory():
        if not found:
            found.append(make())
        return found[0]

    return memory


def trace_runs(trace, first=False):
    """The Runs of a reports.sql.engine.Trace (only its first when `first`), each with its rows in seq order."""
    from reports.memory.sql_categories import memory_rows

    out = []
    for index, (name, meta) in enumerate(trace.runs.items()):
        table = trace.arrow(f"SELECT * FROM rows WHERE run_index = {index} ORDER BY seq")
        out.append(Run(name, meta, PlanRows(table), _once(lambda index=index: memory_rows(trace, index))))
        if first:
            break
    return out


def frame_runs(df):
    """The Runs of a DataFrame of reports.load (each run's rows in the frame's order), the library's way in."""
    from reports.flops.rows import from_frame
    from reports.loading.load import runs_of
    from reports.memory.frame_rows import run_rows, runs_in_order
    from reports.tables import split_runs

    runs, out = runs_of(df), []
    for name, rows in split_runs(df):
        if not len(rows):
            continue

        def memory(rows=rows):
            _, _, ordered = next(r for r in runs_in_order(rows) if len(r[2]))
            return run_rows(ordered)

        table = from_frame(rows, rows.columns)
        _not_null(table)
        out.append(Run(name, runs[name], PlanRows(table), _once(memory)))
    return out


def _not_null(table):
    """Raise ReportError for the first column of reports.loading.validate.NOT_NULL that holds a null in `table` (a
    DataFrame edited after reports.load, which never gives one there), naming the row's seq."""
    from reports.errors import ReportError
    from reports.loading.validate import NOT_NULL

    for name in table.column_names:
        column = table.column(name)
        if name in NOT_NULL and column.null_count:
            at = int(np.flatnonzero(numpy_of(pc.is_null(column)))[0])
            where = f" at seq {table.column('seq')[at].as_py()}" if "seq" in table.column_names else f" at row {at}"
            raise ReportError(
                f"plan: column {name!r} is null{where} ({column.null_count} null value(s)); expected the values "
                "reports.load gives"
            )


def plan_rows(rows):
    """`rows` as PlanRows: PlanRows as they are, a DataFrame's columns converted (the library's boundary)."""
    if isinstance(rows, PlanRows):
        return rows
    from reports.flops.rows import from_frame

    return PlanRows(from_frame(rows, rows.columns))
