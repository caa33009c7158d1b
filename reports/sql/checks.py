"""The checks a reports.sql.engine.Trace makes of a trace's values before any view runs, written as a mixin of it
(`Checks`): those of reports.loading.validate check_rows, from the parts' statistics where they tell, else from
one read of each run's parts (reports.sql.rowpass) or one scan of its rows read once into DuckDB; a run that fails
one is read by the reference loader, whose one-line ReportError names the value."""

import os
import warnings

import numpy as np

from reports.errors import ReportError
from reports.loading.integrity import Footers, footer, merged_away
from reports.loading.load import id_limit
from reports.loading.validate import ALLOWED, STORAGE_ID_COLUMNS, check_footers
from reports.sql import rowpass
from reports.sql.scan import files_query

__all__ = ["BAD_ROW_VALUES", "Checks", "IdFooters", "KEEP_ROWS", "UNKNOWN_VALUES"]

# Trace(every_run=True): the rows of the runs whose read feeds consumers of their own, at most (run 0's always is)
KEEP_ROWS = 1 << 22

# a row whose phase or FLOP kind the tracer never writes (validate.ALLOWED): the reference loader names it. Checked on the
# _ops grain, which is keyed by both; a grad_mode the tracer never writes is checked per row (BAD_ROW_VALUES, with the
# null lists: the grain is not keyed by it)
_GRAIN_CHECKED = ("phase", "flop_kind")
UNKNOWN_VALUES = " OR ".join(f"{name} NOT IN ({', '.join(repr(v) for v in ALLOWED[name])})" for name in _GRAIN_CHECKED)
BAD_ROW_VALUES = [
    f"{name} NOT IN ({', '.join(repr(v) for v in values)})"
    for name, values in ALLOWED.items()
    if name not in _GRAIN_CHECKED
]


class Checks:
    """The value checks of a Trace (its `paths`, `files`, `runs`, `columns`, `narrow`, `db`, `kept`, `_reads`,
    `_reference_columns`): see reports.sql.engine.Trace._open, which calls _check_values and _check_null_lists."""

    def _check_values(self, footers, refused, keep):
        """The checks of reports.loading.validate check_rows without reading the rows into a frame: nulls and ranges
        from each part's Parquet statistics (check_footers, as read_run read the footers: `refused` holds the runs where
        one failed), storage ids from the extremes of their statistics (_IdFooters), the rest from the rows. A trace
        read from its files: one read of each run's parts (reports.sql.rowpass: null list cells and items, phase
        and flop_kind values, seq increasing), which also feeds run 0's rows to the consumers `keep` makes (_rows_pass).
        A trace whose rows were read once into DuckDB (narrow): seq from one scan of its seq column (_seq_in_order),
        null lists and values from the grains (_check_null_lists). A run that fails one is read by the reference
        loader, which raises the one-line error naming the value and the row (or accepts it: a FLOP count clamped to
        int64 is a flagged bound, not damage). Returns the narrow runs that passed, in order, for _check_null_lists;
        the runs before one that failed are checked first, by a scan of their own (_null_lists): the runs are refused
        in reports.load's order."""
        unscanned = []
        for i, path in enumerate(self.paths):
            if not self._statistics_refuse(i, footers, refused) and self._rows_pass(i, footers, keep):
                unscanned += [i] if self.narrow else []
                continue
            for k in unscanned:
                if self._null_lists(k):
                    self._reference_check(self.paths[k])
            unscanned = []
            self._reference_check(path)
        return unscanned

    def _statistics_refuse(self, i, footers, refused):
        """Whether run i fails a check of _check_values made from its parts' statistics."""
        path, meta = self.paths[i], list(self.runs.values())[i]
        if path in refused:
            return True
        limit = id_limit(meta, sum(footers.rows.get(f, 0) for f in self.files[i]))
        extremes = [footers.ids.get(f) for f in self.files[i]]
        if any(e is None or e[0] < 0 or e[1] > limit for e in extremes):
            try:  # statistics missing or an id out of range: the check that names it
                check_footers(path, [(f, footer(f, footers)) for f in self.files[i]], self.columns, limit, {})
            except ReportError:
                return True
        return False

    def _rows_pass(self, i, footers, keep):
        """Whether run i passes the checks of _check_values made from its rows (a narrow trace: its seq here, its
        null lists from the grains). Run 0's read feeds the consumers each of `keep` makes of its row count (objects
        with `columns` and `feed`: reports.sql.rowpass), kept in `self.kept` when the run passed (take_kept); every
        run's read feeds its own with `every_run`, while the runs fed hold at most KEEP_ROWS rows (a consumer holds a
        few columns of its run's rows until taken: a run past them is scanned again when its section reads it)."""
        if self.narrow:
            return self._seq_in_order(i) or _seq_increases(self.files[i], footers)
        rows = sum(footers.rows.get(f, 0) for f in self.files[i])
        fed = i == 0 or self.every_run and self._fed_rows + rows <= KEEP_ROWS
        if len(self.paths) > 1 and not self.every_run:  # a grain kept of run 0 alone: scanned for every run
            keep = [make for make in keep if getattr(make, "grain", None) is None]
        book = rowpass.CodeBook()  # the consumers' codes of a column: each part's column coded once for all
        consumers = [make(rows, book) for make in keep] if fed else []
        self._fed_rows += rows if fed else 0
        try:
            if not rowpass.read(self.files[i], footers, self.columns, consumers):
                return False
        except Exception as exc:  # a part whose pages cannot be read (corrupt, truncated): the reference loader's line
            if merged_away(exc):
                raise
            return False
        self.kept.update({(type(c), i): c for c in consumers})
        return True

    def take_kept(self, kind, run_index):
        """The consumer of type `kind` the read of run `run_index` fed (Trace(keep=...)), once; None when none was."""
        return self.kept.pop((kind, run_index), None)

    def _check_null_lists(self, runs):
        """Read each of `runs` (run indices, in order) with the reference loader when a list cell of it is null where a
        trace holds a list, or an id or size list holds a null item: flagged per group of _ops as the grain read the
        list columns (reports.sql.scan `_src.null_lists`), no scan of its own; and when a phase or FLOP kind is none
        the tracer writes (validate.ALLOWED: statistics cannot show that), from the grains' groups."""
        if not runs:  # a trace read from its files: its runs' reads checked them (rowpass)
            return
        found = self.db.execute(f"SELECT DISTINCT run_index FROM _ops WHERE null_lists OR {UNKNOWN_VALUES}").fetchall()
        flagged = {int(i) for (i,) in found}
        for i in runs:
            if i in flagged:
                self._reference_check(self.paths[i])

    def _null_lists(self, i):
        """Whether run i has a null list cell or item (see _check_null_lists), from a scan of its list columns: for a
        run checked before the grains are made (one before a run the statistics refuse)."""
        return (
            self.db.execute(
                f"SELECT count(*) FROM _src WHERE run_index = {i} AND (null_lists OR {UNKNOWN_VALUES})"
            ).fetchone()[0]
            > 0
        )

    def _seq_in_order(self, i):
        """Whether run i's seq increases row by row, shown from one DuckDB scan of its seq column: each part's seq
        is its first seq plus the row number (seq - row number takes one value), and each part starts after
        the one before ends. False when that does not show it (a part with a gap inside: _seq_increases decides)."""
        read = (
            f"_src WHERE run_index = {i}"
            if self.narrow
            else self._reads[i] + ", filename = true, file_row_number = true)"
        )
        found = self.db.execute(files_query(read)).fetchall()
        where = {os.path.abspath(f): n for n, f in enumerate(self.files[i])}
        ranges = sorted((where.get(name, -1), lo, hi, n) for name, n, lo, hi in found)
        last = None
        for index, lo, hi, n in ranges:
            if index < 0 or lo != hi or (last is not None and lo <= last):
                return False
            last = lo + n - 1
        return True

    def _reference_check(self, path):
        """Read one run with the reference loader (the command's columns): its checks raise the one line that names
        the bad value, in a part (a column it leaves in the files) or at a seq (one it reads)."""
        from reports.loading.load import load

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load(path, columns=self._reference_columns, lists="arrow")


class IdFooters(Footers):
    """Footers that also keep `ids` {part: (least, greatest) storage id in its statistics, or None when a chunk has
    none}: the id check, which needs the run's id limit (known once every part is read), then reads no footer twice."""

    def __init__(self):
        super().__init__()
        self.ids, self._leaves = {}, None

    def note(self, part, found):
        super().note(part, found)
        low, high = 0, 0
        if self._leaves is None or not found.schema.equals(self._leaves[0]):  # the id columns, once per schema
            self._leaves = (
                found.schema,
                [j for j in range(found.num_columns) if found.schema.column(j).path in _ID_LEAVES],
            )
        leaves = self._leaves[1]
        for g in range(found.num_row_groups):
            group = found.row_group(g)
            for j in leaves if group.num_rows else ():  # no rows (the closing part): no id, nothing to check
                stats = group.column(j).statistics
                if stats is None or stats.null_count is None:
                    self.ids[part] = None
                    return
                if stats.has_min_max and isinstance(stats.min, int):
                    low, high = min(low, stats.min), max(high, stats.max)
        self.ids[part] = (low, high)


_ID_LEAVES = {f"{name}.list.element" for name in STORAGE_ID_COLUMNS}


def _seq_increases(files, footers):
    """Whether seq increases row by row through the parts in order: each part's seq column read alone (one
    part in memory at a time; a part of one row is not read: its seq is its footer's statistics)."""
    import pyarrow.parquet as pq

    last = None
    for part in files:
        info = footer(part, footers)
        if not info.num_rows:
            continue
        column = info.schema.names.index("seq")
        stats = info.row_group(0).column(column).statistics if info.num_row_groups == 1 else None
        if info.num_rows == 1 and stats is not None and stats.has_min_max:
            seq = np.array([stats.min], dtype=np.int64)
        else:
            seq = pq.read_table(part, columns=["seq"]).column("seq").to_numpy()
        if (last is not None and seq[0] <= last) or (len(seq) > 1 and not (np.diff(seq) > 0).all()):
            return False
        last = int(seq[-1])
    return True
