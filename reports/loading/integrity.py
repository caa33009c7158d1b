"""Is a trace whole, and is it one trace? Damage facts and foreign files.

Every part of one trace carries the same `trace_id` in its metadata. A trace directory
holding anything else that a Parquet reader would read (a file that is not a part, a
part without optrace metadata, a part of another trace, a directory named like a
part) is refused with one line naming it. Damage is reported, never hidden:

  record_errors   ops that ran but could not be recorded (from the metadata)
  lost_rows       rows whose part could not be written (from the metadata)
  missing_rows    rows the newest metadata says were written but are not on disk
                  (a part deleted or moved)
  missing_parts   part numbers the newest metadata counts but no file has
  seq_gaps        runs of seq numbers absent between the first and the last row

A part that repeats another's rows (a sync tool's `part-000001 (1).parquet`, a
symlinked copy) or its part number, and a `rank=R` directory inside a trace that
has parts of its own (another trace's rows), are refused with one line too; the
values inside the parts are checked by reports.loading.validate, and the list items
a part holds, from its footer before it is read, by reports.loading.widths.
"""

import os
import re
import stat

try:
    from pyarrow._parquet import ParquetReader  # what pq.ParquetFile opens; private, hence the fallback
except ImportError:
    ParquetReader = None

from reports.errors import ReportError
from reports.loading.validate import check_footers, check_metadata, check_schema, parse_json
from reports.loading.widths import check_widths
from tracer.schema import (
    LEGACY_MARKER_NAME,
    MARKER_NAME,
    footer_metadata,
    is_merged_name,
    is_part_name,
    marker_json,
    merged_span,
    part_name,
    part_paths,
    read_marker_file,
    superseded,
)

MAX_METADATA_BYTES = 64 << 20  # a part's metadata JSON (a 70B model's parameter table: ~100 KB)
MAX_MARKER_BYTES = 1 << 20  # the marker is written 4 KiB long

DAMAGE_KEYS = ("record_errors", "lost_rows", "missing_rows", "missing_parts", "seq_gaps", "damaged_marker")


def one_line(exc):
    """The first line of an exception's message (pyarrow's can run to several)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _regular(full):
    """Whether `full` is a regular file (a link followed): a FIFO named like a part or the marker is never opened."""
    try:
        return stat.S_ISREG(os.stat(full).st_mode)
    except OSError:
        return False


def list_parts(path):
    """tracer.schema.part_paths, with a directory that cannot be listed as one ReportError."""
    try:
        return part_paths(path)
    except OSError as exc:
        raise ReportError(
            f"{os.fspath(path)}: cannot list the trace directory ({exc.strerror or one_line(exc)})"
        ) from None


def read_footer(part):
    """A part's Parquet footer, read from the file: pq.read_metadata without the Python of a ParquetFile
    (its column paths, built for every file: most of the time of a trace of many small parts)."""
    if ParquetReader is None:
        import pyarrow.parquet as pq  # pyarrow.parquet's Python only where its private reader is missing

        return pq.read_metadata(part)
    reader = ParquetReader()
    reader.open(part)
    return reader.metadata


class Footers(dict):
    """{part file: Parquet footer} that one `reports.load` keeps for its later reads, and `rows` {part file:
    row count} of every part it read. A footer takes about 90 KB of memory (33 column chunks with their
    statistics): past LIMIT parts the footers are read again when needed instead of kept."""

    LIMIT = 1024

    def __init__(self):
        super().__init__()
        self.rows = {}

    def note(self, part, found):
        """Called with every footer read, kept or not: what a later read needs of it (here its row count)."""
        self.rows[part] = found.num_rows


def footer(part, footers=None):
    """The Parquet footer (FileMetaData) of a part file; `footers` ({part: footer}, one per `reports.load` call)
    keeps those read, so a report opens each part's footer once. Never kept across loads: a trace re-written
    in place can have the same size, inode and (on coarse file systems) modification time."""
    if footers is not None and part in footers:
        return footers[part]
    found = read_footer(part)
    if isinstance(footers, Footers):
        footers.note(part, found)
        if len(footers) >= Footers.LIMIT:
            return found
    if footers is not None:
        footers[part] = found
    return found


def check_parts(path, footers=None, unread=()):
    """[(part file, metadata dict, row count)] of every part, or ReportError naming the first bad file.
    `unread`: columns the caller leaves in the files, checked from the parts' statistics (reports.loading.validate)."""
    path = os.fspath(path)
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise ReportError(f"{path}: cannot list the trace directory ({exc.strerror or one_line(exc)})") from None
    parts_here = part_paths(path, names)  # one listing: a live trace's merge between two would be a foreign file
    known = set(parts_here)
    left = superseded(names)  # parts whose rows a merged part holds (a merge at close cut short): not read
    for name in names:
        full = os.path.join(path, name)
        if name in (MARKER_NAME, LEGACY_MARKER_NAME) and os.path.lexists(full) and not _regular(full):
            raise ReportError(f"{path}: {name} is not a regular file, not an optrace marker; move it out of the trace")
        if name.startswith((".", "_")) or name in left:
            continue  # hidden and marker files: no Parquet reader reads them
        if name.startswith("rank=") and os.path.isdir(full):
            if parts_here:
                raise ReportError(
                    f"{path}: {name} is a rank directory inside a trace with parts of its own "
                    "(another trace's rows?); move it out"
                )
            continue  # one rank of a distributed trace: checked when that rank is read
        if not os.path.isfile(full) and os.path.lexists(
            full
        ):  # one gone since the listing (merged): its footer read says so
            kind = (
                "a directory" if os.path.isdir(full) else "not a regular file"
            )  # a FIFO: never opened (it would block)
            raise ReportError(f"{path}: {name} is {kind}, not an optrace part; move it out of the trace")
        if full not in known:
            raise ReportError(
                f"{path}: {name} is not an optrace part (a trace holds only part-*.parquet files); move it out"
            )
    parts, first_id, foreign, checked, seen, ranges, lists = [], None, None, None, {}, {}, {}
    for part in parts_here:
        name = os.path.basename(part)
        try:
            found = footer(part, footers)  # one open per part: its key-value metadata, row count and statistics
            schema = found.schema.to_arrow_schema()
            raw = footer_metadata(found)  # the plain footer key (v3 on), or inside the Arrow schema (v1, v2)
        except Exception as exc:
            if isinstance(exc, FileNotFoundError) and not os.path.lexists(part):
                raise MergedAway(f"{path}: {name} was merged into another part while it was read; read the trace again")
            raise ReportError(f"{path}: not a readable Parquet trace ({name}: {one_line(exc)})") from None
        if raw is None:
            foreign = foreign or name
            continue
        check_widths(path, part, found, lists)  # before any read of its rows: a list bomb is refused from the footer
        meta = parse_json(path, raw, "optrace metadata", name, MAX_METADATA_BYTES)
        check_metadata(path, meta, "optrace metadata", name, roles_only=True)  # the newest part's: all of it, below
        if checked is None or not schema.equals(checked):  # the parts of one trace share one schema: checked once
            check_schema(path, name, schema)
            if checked is not None and set(schema.names) != set(checked.names):
                raise ReportError(
                    f"{path}: {name} and {os.path.basename(parts[0][0])} differ in column(s) "
                    f"{sorted(set(schema.names) ^ set(checked.names))}; expected one schema in every part"
                )
            checked = schema
        trace_id = meta.get("trace_id")
        if parts and trace_id != first_id:
            raise ReportError(
                f"{path}: {name} belongs to trace {trace_id!r}, not {first_id!r} like "
                f"{os.path.basename(parts[0][0])} (copied from another trace?); move it out"
            )
        first_id = trace_id if not parts else first_id
        check_footers(path, [(part, found)], unread, None, seen)
        if found.num_rows:
            ranges[part] = _seq_range(part, found)
        parts.append((part, meta, found.num_rows))  # the footer itself is dropped (kept in `footers` when small)
    if foreign and parts:
        raise ReportError(f"{path}: {foreign} is not an optrace part (no optrace metadata); move it out of the trace")
    if parts:
        check_metadata(path, parts[-1][1], "optrace metadata", os.path.basename(parts[-1][0]))
    parts = Parts(parts)
    parts.seq_ranges = ranges
    _check_repeats(path, parts)
    return parts


class MergedAway(ReportError):
    """A part listed, then removed before its footer was read: the tracer of a live trace merged it (tracer.store.writer
    SmallParts). Reading the trace again finds the merged part (`reread`)."""


REREADS = 3  # reads of a live trace whose parts were merged away while it was read, before the error stands
_PART_PATH = re.compile(r"""([^'"\s]*part-[^'"\s/\\]*\.parquet)""")


def merged_away(exc):
    """Whether `exc` (MergedAway, or pyarrow's or DuckDB's naming a part file that is gone now) comes from a part
    a live trace's tracer merged after the trace was listed (or one deleted: read again, its rows count as missing)."""
    if isinstance(exc, MergedAway):
        return True
    return any(not os.path.exists(name) for name in _PART_PATH.findall(str(exc)) if os.path.isabs(name))


def reread(read):
    """read(), called again (REREADS times in all) while it fails on a part merged away since it was listed."""
    for attempt in range(REREADS):
        try:
            return read()
        except Exception as exc:
            if attempt + 1 == REREADS or not merged_away(exc):
                raise


class Parts(list):
    """check_parts' [(part file, metadata, row count)], with `seq_ranges` {part: (first seq, last seq, rows)}."""

    seq_ranges = {}


def _check_repeats(path, parts):
    """ReportError when two parts hold the same seq numbers or say they are the same part (a copy of a part)."""
    numbers = {}
    for part, meta, _ in parts:
        number, name = meta.get("parts"), os.path.basename(part)
        if number is not None and number in numbers:
            copy, first = name, numbers[number]
            if isinstance(number, int) and (copy == part_name(number - 1) or is_merged_name(copy)):
                copy, first = first, copy  # the tracer's own name: the other is the copy
            raise ReportError(f"{path}: {copy} says it is part {number} like {first} (a copy of a part?); move it out")
        numbers[number] = name
    ranges = sorted(
        (*parts.seq_ranges[part], os.path.basename(part)) for part, _, _ in parts if part in parts.seq_ranges
    )
    for (low, high, _, name), (low2, high2, _, name2) in zip(ranges, ranges[1:]):
        if low2 <= high:
            if is_part_name(name2) and not is_part_name(name):  # a copy of the first part a merged part holds
                name, name2 = name2, name
            raise ReportError(
                f"{path}: {name2} repeats seq {low2} to {min(high, high2)} of {name} (a copy of a part?); move it out"
            )


def read_marker(path):
    """The facts the tracer left in the trace's marker at close ({} when none)."""
    return marker_facts(path)[0]


def marker_damaged(path):
    """Whether the trace's Parquet marker is there but unreadable (cut or overwritten): its closing facts are lost, and
    every other Parquet reader of the directory (DuckDB, Spark) fails on it. The tracer writes it at entry and
    rewrites it at close: a run killed in that rewrite leaves it cut, and is incomplete too."""
    return marker_facts(path)[1]


def marker_facts(path):
    """(read_marker, marker_damaged) of the trace at `path`, from one read of its marker."""
    name, raw = read_marker_file(path, MAX_MARKER_BYTES)  # the Parquet marker, else a legacy JSON one
    if raw is None:
        return {}, name == MARKER_NAME
    if len(raw) > MAX_MARKER_BYTES:
        text, damaged = raw, name == MARKER_NAME
    elif name == MARKER_NAME:
        text = marker_json(raw)  # of a Parquet marker, the JSON in its footer
        damaged = raw[:4] != b"PAR1" or raw[-4:] != b"PAR1" or text is None
    else:  # a JSON marker of an older tracer
        text, damaged = marker_json(raw), False
    if text is None:
        return {}, damaged  # a Parquet marker cut mid-rewrite: no facts
    facts = parse_json(path, text, "the marker", name, MAX_MARKER_BYTES, invalid={})  # cut mid-rewrite: no facts
    if not isinstance(facts, dict):
        return {}, damaged
    check_metadata(path, facts, "the marker", name)
    return facts, damaged


def no_parts(path):
    """The one line for a directory with no part: an optrace trace none of whose parts reached
    the disk (its marker says it is one), or not an optrace trace."""
    marker = read_marker(path)
    if marker.get("format") != "optrace":
        return f"{path}: not an optrace trace (no part-*.parquet files in it)"
    if not isinstance(marker.get("rows"), int):  # the marker of the start: no close ever happened
        return f"{path}: damaged optrace trace with 0 parts written (killed before the first part?)"
    return (
        f"{path}: damaged optrace trace with 0 parts written: {marker.get('lost_rows')} rows lost to write errors "
        f"(first: {marker.get('write_error')})"
    )


def damage(path, parts, meta, marker=None):
    """The damage facts of a trace: {key: count} over DAMAGE_KEYS (all 0 for a whole trace).

    The marker's closing facts count too: when the disk filled, the last parts (and
    their metadata) are gone, but the marker, rewritten in place, still says what was lost.
    `marker`: marker_facts(path), when the caller read it."""
    marker, damaged = marker if marker is not None else marker_facts(path)
    if marker.get("trace_id") != meta.get("trace_id"):
        marker = {}
    present = 0
    for part, _, rows in parts:
        present += rows
    seqs = list(parts.seq_ranges.values())
    gaps, expected = 0, None
    for low, high, n in sorted(seqs):
        if expected is not None and low > expected:
            gaps += 1
        expected = high + 1
    written = meta.get("rows")
    counted = [
        n for n in (meta.get("parts"), marker.get("parts")) if isinstance(n, int)
    ]  # the marker counts late parts
    counted_parts = max(counted) if counted else None
    lost = max(int(meta.get("lost_rows") or 0), int(marker.get("lost_rows") or 0))
    missing = max(int(written) - present, 0) if isinstance(written, int) else 0
    if isinstance(marker.get("rows"), int):
        missing = max(missing, marker["rows"] - lost - present)
    return {
        "record_errors": max(int(meta.get("record_errors") or 0), int(marker.get("record_errors") or 0)),
        "lost_rows": lost,
        "missing_rows": missing,
        "missing_parts": max(int(counted_parts) - _held(parts), 0) if isinstance(counted_parts, int) else 0,
        "seq_gaps": gaps,
        "damaged_marker": int(damaged),
    }


def _held(parts):
    """How many of the tracer's parts the files hold: a merged part holds the span in its name."""
    held = 0
    for part, _, _ in parts:
        span = merged_span(os.path.basename(part))
        held += 1 if span is None else span[1] - span[0] + 1
    return held


def _seq_range(part, info):
    """(first seq, last seq, rows) of a part: from the row groups' statistics, or read when a writer left none."""
    column = info.schema.names.index("seq") if "seq" in info.schema.names else None
    low = high = None
    for i in range(info.num_row_groups if column is not None else 0):
        stats = info.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max:
            low = None
            break
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    if low is None:
        import pyarrow.parquet as pq  # a part without seq statistics only

        seq = pq.read_table(part, columns=["seq"]).column("seq").to_numpy()
        low, high = seq.min(), seq.max()
    return int(low), int(high), info.num_rows


def signal_of(meta):
    """The signal that stopped the traced run (the run metadata's `signal`, set by tracer.recording.signals: "SIGTERM"), or
    None; a value of another form (a foreign file) is None."""
    sig = meta.get("signal")
    return sig if isinstance(sig, str) and re.fullmatch(r"SIG[A-Z0-9]{1,12}|signal \d{1,3}", sig) else None


def stopped_by(meta):
    """Why an incomplete trace stopped, in words: "stopped by SIGTERM" when a signal stopped the run, else "cut
    short"."""
    sig = signal_of(meta)
    return f"stopped by {sig}" if sig else "cut short"


def describe_damage(facts):
    """The damage facts in words, '' when there are none."""
    words = {
        "record_errors": "op(s) ran but were not recorded",
        "lost_rows": "rows lost to write errors",
        "missing_rows": "rows missing from disk (a part deleted?)",
        "missing_parts": "part file(s) missing",
        "seq_gaps": "gap(s) in seq",
        "damaged_marker": f"unreadable marker ({MARKER_NAME}: its closing facts are lost, and other Parquet readers of "
        "the directory fail on it)",
    }
    return "; ".join(f"{facts[key]} {words[key]}" for key in DAMAGE_KEYS if facts.get(key))
