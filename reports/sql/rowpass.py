"""One read of a run's part files with pyarrow, part by part in order: the row checks the statistics cannot make, and
what the report's FLOP and memory sections read row by row, from the same read (reports.sql.engine).

Parquet's statistics count a null list and an empty one together, so whether a list cell is null where the tracer
always writes a list (validate.LIST_NOT_NULL) or an id or size list holds a null item (ITEMS_NOT_NULL) is read from
the cells. DuckDB decodes every row of a list column an expression reads: the grouping scan that made these checks
decoded ten list columns (0.3-0.5 CPU-s a million rows), then the FLOP sections' query five of them again and the
memory categories four. pyarrow reads a part's list columns in about half DuckDB's time, and an Arrow list column
knows its null cells without a look at its items; so each part is read here once, for the checks and for the
sections' consumers.

    read(files, footers, present, consumers)   True when every part passes the checks

The checks, on every part in order: no null list cell or null item as above; phase, flop_kind and grad_mode only the
values the tracer writes (validate.ALLOWED); seq increasing row by row and from part to part (what
reports.sql.checks.Checks._seq_in_order shows of a trace read once into memory). A run that fails one is read by the
reference loader, whose one line names the value (reports.sql.checks). Consumers: objects with `columns` (the trace columns they read) and
`feed(table)`, called with each part's Table (those columns and the checked ones), in seq order, while every part so
far passed; the read stops at the first part that fails. The consumers of one read share a CodeBook (each made as
`make(rows, codes)`): a part's column of names is coded once.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import numpy_of
from reports.loading.integrity import footer
from reports.loading.validate import ALLOWED, ITEMS_NOT_NULL, LIST_NOT_NULL

try:
    from pyarrow._parquet import ParquetReader  # what pq.ParquetFile opens, without its Python per file
except ImportError:
    ParquetReader = None

__all__ = ["CodeBook", "Codes", "read"]

CHECKED = ("seq", *ALLOWED)


def read(files, footers, present, consumers=()):
    """Read each part of `files` (one run's, in order) once, checking it and handing it to `consumers`: True when every
    part passed the checks. `present`: the trace's columns, in order; `footers`: the parts' footers as read_run kept them."""
    lists = [c for c in LIST_NOT_NULL if c in present]
    items = [c for c in ITEMS_NOT_NULL if c in present]
    wanted = {*CHECKED, *lists, *(c for consumer in consumers for c in consumer.columns)}
    reader = _Reader([c for c in present if c in wanted], threads=not consumers)

    last = None
    for table in _ahead(lambda part: reader.read(part, footers), files):
        if not table.num_rows:
            continue
        # (on this thread: checks run on the reading thread took the GIL back from the consumers a dozen times a part,
        # each wait up to the interpreter's switch interval, and the open took longer)
        if not _passes(table, lists, items):
            return False
        seq = numpy_of(table.column("seq"))
        if last is not None and seq[0] <= last:  # seq increases from part to part too
            return False
        last = int(seq[-1])
        for consumer in consumers:
            consumer.feed(table)
    return True


def _passes(table, lists, items):
    """Whether a part's rows pass the checks made of one part: seq not null and increasing row by row, no null cell
    of `lists`, no null item of `items`, phase, flop_kind and grad_mode values the tracer writes."""
    if not table.num_rows:
        return True
    if table.column("seq").null_count:  # a null seq: the reference loader names it
        return False
    seq = numpy_of(table.column("seq"))
    if not (seq[1:] > seq[:-1]).all():
        return False
    if any(table.column(c).null_count for c in lists) or any(_null_items(table.column(c)) for c in items):
        return False
    for name, allowed in ALLOWED.items():
        if name not in table.column_names:  # grad_mode in a v3 trace: null (reports.sql.engine)
            continue
        if not _only(table.column(name), {*allowed, None}):  # a null: the statistics' check
            return False
    return True


def _null_items(column):
    """Whether a list column without null cells holds a null item: none where its items hold no null at all."""
    if not any(chunk.values.null_count for chunk in column.chunks):
        return False
    return pc.list_flatten(column).null_count > 0  # (items of no cell are not the rows')


def _only(column, allowed):
    """Whether every value of a string column is in `allowed`: read from each chunk's dictionary where it has one (a
    part's holds the values its rows have), else from its distinct values."""
    if all(pa.types.is_dictionary(c.type) and set(c.dictionary.to_pylist()) <= allowed for c in column.chunks):
        return True
    return set(pc.unique(column).to_pylist()) <= allowed


def _ahead(read_part, files):
    """read_part(part) of each part in order, the next part's made on a thread while the caller works on this one (the
    reading and decoding release the GIL). The parts are read into the C library's pool: the pool the command sets
    (reports.loading.columns lean_memory: jemalloc giving freed pages back at once) has each part's pages faulted
    in again by the next, 0.6 s of system time a million rows; malloc keeps them for the next part."""
    if len(files) < 2:
        yield from map(read_part, files)
        return
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(read_part, files[0])
        for part in files[1:]:
            found, pending = pending.result(), pool.submit(read_part, part)
            yield found
        yield pending.result()


class _Reader:
    """Reads `columns` of part files: the leaf column indices found once per Parquet schema."""

    def __init__(self, columns, threads):
        self.columns, self.threads, self._schema, self._leaves = columns, threads, None, None

    def read(self, part, footers):
        info = footer(part, footers)
        if ParquetReader is None:
            import pyarrow.parquet as pq

            return pq.ParquetFile(part, metadata=info).read(columns=self.columns, use_threads=False)
        if self._schema is None or not info.schema.equals(self._schema):
            paths = [info.schema.column(j).path for j in range(info.num_columns)]
            self._schema = info.schema
            self._leaves = [
                j
                for name in self.columns
                for j, leaf in enumerate(paths)
                if leaf == name or leaf.startswith(name + ".")
            ]
        reader = ParquetReader(memory_pool=pa.system_memory_pool())  # see _ahead
        reader.open(part, metadata=info)
        return reader.read_all(column_indices=self._leaves, use_threads=self.threads and info.num_rows >= 1024)


class Codes:
    """For consumers: run-wide codes of the strings of a column (dictionary-encoded or plain), numbered as first seen
    (`names`), each part's dictionary looked up once. The consumers of one read share one per column (CodeBook), and
    the codes of the part last coded are kept: each part's column is coded once, whichever consumer asks first."""

    def __init__(self):
        self.names, self.index, self._last = [], {}, None

    def of(self, column):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        # the part's column by its buffers (kept alive by _last, so no other column can take their addresses)
        key = tuple(map(_where, chunks)) if all(map(len, chunks)) else None
        if key is not None and self._last is not None and self._last[0] == key:
            return self._last[2]
        codes = []
        for chunk in chunks:
            chunk = chunk if pa.types.is_dictionary(chunk.type) else pc.dictionary_encode(chunk)
            index = np.asarray([self.code(v) for v in chunk.dictionary.to_pylist()], dtype=np.int64)
            codes.append(index[numpy_of(chunk.indices, null=0)] if len(index) else np.zeros(len(chunk), np.int64))
        found = codes[0] if len(codes) == 1 else np.concatenate(codes) if codes else np.zeros(0, np.int64)
        found.flags.writeable = False  # shared by the consumers of the part
        self._last = (key, column, found)
        return found

    def code(self, value):
        """The code of `value` (a name), numbered as first seen."""
        if value not in self.index:
            self.index[value] = len(self.names)
            self.names.append(value)
        return self.index[value]

    def flags(self, test):
        """test(name) of each name, by code."""
        return np.fromiter((test(v) for v in self.names), dtype=bool, count=len(self.names))


def _where(chunk):
    """Where a chunk's values lie: its indices' (or offsets') buffer, offset and length, and its dictionary's buffer."""
    found = (chunk.buffers()[1].address, chunk.offset, len(chunk))
    if pa.types.is_dictionary(chunk.type):
        found += tuple(b.address for b in chunk.dictionary.buffers() if b is not None)
    return found


class CodeBook(dict):
    """{column: its Codes}, each made when first asked for: the consumers of one run's read share one
    (reports.sql.checks.Checks._rows_pass), so a part's column is coded once for all of them."""

    def __missing__(self, name):
        self[name] = found = Codes()
        return found
