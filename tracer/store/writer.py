"""Rows to Parquet: one part file per flush, and the merges of small parts.

The rows of a part are a tracer.store.row_buffer.RowBuffer (column buffers of flat integer arrays, made into an
Arrow table at flush time); the small parts kept for merging are tracer.store.small_parts.SmallParts. Their names,
and the row layout's (ROW_FIELDS, FIELD, ROW_WIDTH, ...), are importable from here.

A part is written under a hidden temporary name, unique to the process, and renamed
when complete, so a reader, or a process killed mid-write, never sees a half-written
part: pyarrow's dataset discovery skips names that start with '.'. A failed write
removes its temporary file. Every file is created, renamed and removed through the
directory's descriptor (tracer.store.held.Held), never through the path again.
"""

import os

import pyarrow as pa
import pyarrow.parquet as pq

from tracer.schema import (  # ARROW_SCHEMA_KEY: re-exported
    ARROW_SCHEMA_KEY,  # noqa: F401
    METADATA_KEY,
    arrow_footer,
    merged_name,
    part_name,
    superseded,
)
from tracer.store.directory import (  # noqa: F401 (prepare_directory, release_directory, write_facts: re-exported)
    Held,
    forget,
    prepare_directory,
    release_directory,
    temporary_name,
    write_facts,
    wrote,
)
from tracer.store.row_buffer import (  # noqa: F401 (re-exported: the row layout and its buffers, as before the split)
    FIELD,
    PER_OUTPUT_ELEMENT,
    ROW_FIELDS,
    ROW_VALUES,
    ROW_WIDTH,
    TENSOR_WIDTH,
    Names,
    RowBuffer,
    extend,
    new_names,
)
from tracer.store.small_parts import SmallParts, _roles


class PartWriter:
    """Writes RowBuffers as numbered parts of one trace directory."""

    def __init__(self, directory, trace_id=""):
        self.held = directory if isinstance(directory, Held) else Held(directory)  # tracer.store.held.Held
        self.directory = self.held.path
        self.trace_id = trace_id  # in the temporary names, so a later run removes only this trace's
        self.names = new_names()
        self.itemsize = {}  # dtype id -> bytes per element
        self.parts = 0
        self.rows = 0
        self.clock_offset_ns = 0  # time.time_ns() - time.perf_counter_ns(), set once per trace
        self.small = SmallParts()  # the rows of the parts written so far while all are small, for `merge_parts`

    def next_part(self):
        """The path of the next part to be written."""
        return os.path.join(self.directory, part_name(self.parts))

    def write(self, rows, metadata):
        """Write one part; on failure nothing of it stays on disk and the part number is kept."""
        metadata = dict(metadata, parts=self.parts + 1)
        self._write_whole(rows.table(self.names, self.itemsize, metadata, self.clock_offset_ns), part_name(self.parts))
        self.parts += 1
        self.rows += len(rows)
        self.small.add(self.parts - 1, rows, metadata)

    def _write_whole(self, table, name):
        """Write `table` as part `name`: to a temporary renamed into place, so the part is whole or absent."""
        self.held.check()  # the path names another directory now: nothing is written (DirectoryReplaced)
        tmp = self.held.entry(os.path.basename(temporary_name(self.directory, name, self.trace_id)))
        try:
            write_table(table, tmp)
            self.held.replace(tmp.name, name)
        except BaseException:
            if tmp.created:  # only the file this call created
                try:
                    self.held.remove(tmp.name)
                except OSError:
                    pass
            raise
        try:  # the part is written: noted, so a later trace at this path need not read its footer (directory.wrote)
            wrote(os.path.join(self.directory, name), os.stat(name, dir_fd=self.held.at(), follow_symlinks=False))
        except OSError:
            pass

    def merge_parts(self):
        """At a clean close, the trace's files become one part when it has many parts and all are small
        (see SmallParts). Returns whether it merged; a failed merge leaves the files as they were."""
        small, self.small = self.small, SmallParts()
        if not small.ready(self.parts):
            return False
        group = small.files
        metadata = dict(group[-1].metadata, storage_roles=_roles(group), parts=1, merged_parts=self.parts)
        self._merge(group, metadata)
        return True

    def roll(self):
        """During the run, SmallParts.FANOUT neighbouring files of one level become one (see SmallParts):
        called after each part written. A failure (a Ctrl-C too) raises: before the merged part's rename it leaves
        the files as they were, after it the merged part stands for them (merging them again would overlap it)."""
        while (group := self.small.due()) is not None:
            last = group[-1]
            span = group[0].first, last.last
            metadata = dict(last.metadata, storage_roles=_roles(group), merged_parts=span[1] - span[0] + 1)
            try:
                self._merge(group, metadata)
            except BaseException:
                if self.held.exists(merged_name(*span)):
                    self.small.merged(span, metadata)
                raise
            self.small.merged(span, metadata)

    def _merge(self, group, metadata):
        """Write the rows of `group` (SmallParts files) as one merged part, renamed into place before the
        files it holds are removed: a kill in between leaves both, and readers leave out the held ones
        (tracer.schema.superseded). Returns its (first, last) part."""
        first, last = group[0].first, group[-1].last
        rows = RowBuffer.concatenate([rows for file in group for rows in file.buffers])
        self._write_whole(
            rows.table(self.names, self.itemsize, metadata, self.clock_offset_ns), merged_name(first, last)
        )
        names = self.held.listdir()
        for name in superseded(names, within=(first, last)):  # also those an earlier merge cut short left
            try:
                self.held.remove(name)
            except FileNotFoundError:
                pass
            forget(os.path.join(self.directory, name))
        return first, last

    def close(self, facts):
        """Write the closing facts into the marker and release the directory's lock. A directory no longer at the path
        gets its facts while its marker is this trace's (moved away: the rows lost are counted there), else none."""
        try:
            if self.held.lost is None or self.held.trace_id() == self.trace_id:
                write_facts(self.held, facts)
        finally:
            release_directory(self.directory, self.held)

    def reopen(self):
        """After close, for a late metadata update: hold the directory at the path again. False (nothing held) when
        its marker names another trace (another run replaced it) or none; the caller closes `held` when done."""
        try:
            self.held = Held(self.directory)
        except OSError:
            return False
        if self.held.trace_id() != self.trace_id:
            self.held.close()
            return False
        return True


# Parts of at least this many rows are compressed with zstd (level 1), smaller ones with snappy: zstd's contexts cost
# about 1.5 ms a part whatever its rows (36 column chunks), snappy's 0.1 ms, and snappy's 1.3-1.5x more bytes weigh
# little in a small part (benchmarks/README.md, stop 30). Every Parquet reader reads both.
ZSTD_ROWS = 4096


def write_table(table, file):
    """One Parquet part (a seam for tests that fill the disk), zstd or snappy by its rows (ZSTD_ROWS).

    The run metadata (the table's schema metadata) is stored once, as the plain Parquet
    footer key `optrace`, where every Parquet reader finds it (pyarrow's
    `pq.read_metadata(part).metadata`, DuckDB's `parquet_kv_metadata`, polars'
    `read_parquet_metadata`, parquet-tools); the Arrow schema beside it (`ARROW:schema`,
    for the dictionary columns) carries none. pyarrow's default would store it twice, the
    second copy base64-encoded inside that schema where only Arrow readers look."""
    plain = table.schema.remove_metadata()
    blob = (table.schema.metadata or {}).get(METADATA_KEY)
    footer = dict(_arrow_footer(plain))
    if blob is not None:
        footer[METADATA_KEY] = blob
    codec = (
        {"compression": "zstd", "compression_level": 1} if table.num_rows >= ZSTD_ROWS else {"compression": "snappy"}
    )
    held = hasattr(file, "create")  # a held directory's entry (tracer.store.held.Entry), else a path or a stream
    sink = pa.BufferOutputStream() if held else file
    with pq.ParquetWriter(sink, plain, store_schema=False, **codec) as out:
        out.add_key_value_metadata(footer)
        out.write_table(table.replace_schema_metadata(None))
    if held:  # made in memory, written in one call: pyarrow writing to a Python file calls back into Python per write
        data = sink.getvalue()
        with file.create() as f:
            f.write(data)


# (schema, arrow_footer(schema)) of the last part written: every part has one schema (tracer.schema.ARROW_SCHEMA)
_footer = None


def _arrow_footer(plain):
    """arrow_footer(plain), made again only for another schema: `equals` compares the fields (0.1 us: they are the same
    objects), where a dict keyed by the schema would hash it at every part (30 us)."""
    global _footer
    footer = _footer  # read once: another thread may replace it meanwhile
    if footer is None or not plain.equals(footer[0]):
        footer = _footer = (plain, arrow_footer(plain))
    return footer[1]
