"""Read one or several optrace traces into one pandas DataFrame."""

import os
import re
import warnings

import numpy as np
import pyarrow as pa

from reports.errors import ReportError
from reports.loading.integrity import (
    Footers,
    check_parts,
    damage,
    describe_damage,
    list_parts,
    marker_facts,
    no_parts,
    one_line,
    reread,
    stopped_by,
)
from reports.loading.validate import check_metadata_ids, check_rows, max_storage_id
from tracer.schema import COLUMN_NAMES, GRAD_MODES, SCHEMA_VERSION, is_unicode, merge_metadata, missing_columns

_RANK_DIR = re.compile(r"^rank=(\d+)$")
MAX_RANK = 2**31  # ranks are int32 in torch.distributed and in the SQL engine's tables


def read_run(path, footers=None, unread=()):
    """Check that `path` is an optrace trace and return its metadata, or raise ReportError.

    `footers`: a dict (integrity.Footers) that keeps the parts' Parquet footers read here, for the reads
    that follow. `unread`: the columns the caller leaves in the files, checked from the parts' statistics."""
    path = os.fspath(path)
    if not is_unicode(path):  # os.fsdecode of a name that is not UTF-8
        raise ReportError(
            f"{escaped(path)}: the path is not valid UTF-8, and the Parquet readers (pyarrow, DuckDB) open "
            "files by UTF-8 paths; rename it"
        )
    if not os.path.exists(path):
        raise ReportError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise ReportError(f"{path}: not an optrace trace (a trace is a directory of part-*.parquet files)")
    if not list_parts(path):
        raise ReportError(no_parts(path))
    parts = reread(lambda: check_parts(path, footers, unread))  # every part read and its metadata parsed
    try:
        meta = merge_metadata(part_meta for _, part_meta, _ in parts)
    except AttributeError:  # storage_roles that is not an object
        raise ReportError(f"{path}: optrace metadata is not a JSON object") from None
    if not meta:
        raise ReportError(f"{path}: Parquet without optrace metadata (was it written by optrace?)")
    version = meta.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ReportError(f"{path}: optrace metadata has no valid schema_version (got {version!r})")
    if version > SCHEMA_VERSION:
        raise ReportError(
            f"{path}: trace schema version {version!r} is newer than this optrace reads ({SCHEMA_VERSION}); upgrade optrace"
        )
    if isinstance(meta.get("run_name"), str):  # one that is not valid Unicode (an older tracer's): escaped, printable
        meta["run_name"] = escaped(meta["run_name"])
    marker = marker_facts(path)  # read once
    meta["damage"] = damage(path, parts, meta, marker)
    check_metadata_ids(path, meta, id_limit(meta, sum(rows for _, _, rows in parts)))
    meta["complete"] = bool(meta.get("complete")) and marker[0].get("complete", True) is not False
    return meta


def load(paths, columns=None, lists="objects"):
    """One trace, or several, as one DataFrame with a `run` column.

    `paths`: a path or a list of paths. `columns`: read only these columns (all by default).
    `lists`: "objects" (default) gives each list cell (shapes, dtypes, storage ids) as a
    numpy array; "arrow" keeps the list columns as Arrow arrays (pandas ArrowDtype, cells
    read as Python lists), far smaller and faster on big traces (reports.loading.columns).
    A trace too big for memory: `optrace report` and reports.sql.engine.Trace read it with
    DuckDB, holding only the results.
    The run metadata is in `df.attrs["runs"]` ({run name: metadata dict}, in the given
    order); an incomplete trace (cut short) loads with a warning.

    A distributed trace (a directory of `rank=R` directories) loads one run per rank,
    named `<run name>/rank=R`; a `rank` column (after `run`) then says which rank each
    row came from (0 for traces made outside a process group)."""
    import pandas as pd  # the reference loader's frame: the SQL engine reads the checks of this module, no frame

    from reports.loading.columns import LIST_MODES, SharedRuns, concat_frames, to_pandas

    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ReportError("load: expected at least one trace path, got none")
    if columns is not None:
        unknown = sorted(set(columns) - set(COLUMN_NAMES))
        if unknown:
            raise ReportError(f"load: unknown column(s) {unknown}; trace columns are {list(COLUMN_NAMES)}")
    if lists not in LIST_MODES:
        raise ReportError(f"load: lists must be one of {list(LIST_MODES)}, got {lists!r}")
    frames, runs, frame_ranks = [], SharedRuns(), []
    footers = Footers()  # each part's footer, read once by this load
    wanted_all = list(columns) if columns is not None else list(COLUMN_NAMES)
    unread = [c for c in COLUMN_NAMES if c not in wanted_all]  # left in the files: checked from the parts' statistics
    seen = {}  # the rank directories read: one per rank
    for path, rank in runs_with_ranks(paths):
        try:  # a live trace's parts merged away while read: its checks and its rows read again
            meta, read, lacks, upgrade, table = reread(lambda: _read_rows(path, footers, unread, wanted_all, lists))
        except (pa.ArrowException, OSError) as exc:
            raise ReportError(f"{path}: not a readable Parquet trace ({one_line(exc)})") from None
        check_rank(path, rank, meta, seen)
        name = run_name(path, rank, meta, runs)
        frame_ranks.append(rank if rank is not None else meta.get("rank"))
        missing = sorted(set(read) - set(table.column_names))
        if missing:
            raise ReportError(f"{path}: trace lacks column(s) {missing}")
        rows = table.table if hasattr(table, "table") else table
        limit = id_limit(meta, rows.num_rows)
        check_rows(path, rows, limit)  # nulls, negative or absurd values, repeated seq
        frame = to_pandas(table, lists)
        if upgrade:
            frame = _fill_v2(frame, wanted_all, lacks)
        broken = describe_damage(meta["damage"])
        if not meta.get("complete") or broken:  # one warning per trace, every fact in it
            state = f"incomplete ({stopped_by(meta)})" if not meta.get("complete") else "damaged"
            warnings.warn(
                f"{path}: trace is {state}{': ' + broken if broken else ''}; reporting the {len(frame)} rows it has"
            )
        frames.append(frame)
        runs[name] = meta
    lengths = [len(f) for f in frames]
    df = concat_frames(frames, lists)
    df.insert(0, "run", pd.Categorical.from_codes(np.repeat(np.arange(len(runs)), lengths), categories=list(runs)))
    if any(r is not None for r in frame_ranks):
        df.insert(1, "rank", np.repeat(np.array([int(r or 0) for r in frame_ranks], dtype=np.int64), lengths))
    df.attrs["runs"] = runs
    return df


def _read_rows(path, footers, unread, wanted, lists):
    """(metadata, columns read, columns the trace's version lacks, whether any is wanted, table) of one run."""
    from reports.loading.columns import read_table

    meta = read_run(path, footers, unread)
    lacks = missing_columns(meta["schema_version"])  # older traces lack later columns: read what exists, fill the rest
    upgrade = any(c in lacks for c in wanted)
    read = [c for c in wanted if c not in lacks] if upgrade else wanted
    if upgrade and "busy_ns" in lacks and "busy_ns" in wanted and "duration_ns" not in read:
        read.append("duration_ns")
    return meta, read, lacks, upgrade, read_table(path, read, lists, footers)


def id_limit(meta, rows):
    """The highest storage id a trace of `rows` rows on disk, with the damage in `meta`, can hold."""
    facts = meta.get("damage") or {}
    return max_storage_id(rows + sum(int(facts.get(k) or 0) for k in ("lost_rows", "missing_rows", "record_errors")))


def rank_paths(path):
    """[(rank directory, rank)] of a distributed trace in rank order, or [] for any other path. ReportError for
    two directories of one rank (`rank=01` beside `rank=1`) and for a rank that does not fit (MAX_RANK)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return []
    found = {}
    for name in sorted(os.listdir(path)):
        match = _RANK_DIR.match(name)
        if not match or not os.path.isdir(os.path.join(path, name)):
            continue
        digits = match.group(1)
        rank = int(digits) if len(digits) <= 20 else MAX_RANK  # a file name is short: no int of 4,300 digits
        if rank >= MAX_RANK:
            raise ReportError(
                f"{path}: {name} names rank {digits}; expected a rank below {MAX_RANK:,} (not written by optrace?)"
            )
        if rank in found:
            raise ReportError(
                f"{path}: {os.path.basename(found[rank])} and {name} are both rank {rank}; expected one "
                "directory per rank (a copy?); move one out"
            )
        found[rank] = os.path.join(path, name)
    return [(found[rank], rank) for rank in sorted(found)]


def check_rank(path, rank, meta, seen):
    """ReportError when rank directory `path` of rank `rank` does not hold that rank's trace: its metadata names
    another rank, or another directory of its trace read before holds the same trace (a link `rank=3` to `rank=1`
    too; a trace given twice, `optrace compare a a` or a copy of `a`, is not one). `seen`: {trace_id or ("rank", R):
    directory} of the rank directories read before, filled here."""
    if rank is None:
        return
    root, name = os.path.split(path)
    said, trace_id = meta.get("rank"), meta.get("trace_id")
    if said is not None and said != rank:
        other = seen.get(("rank", said)) or (seen.get(trace_id) if trace_id is not None else None)
        like = f" (as {os.path.basename(other)}'s does)" if other else ""
        raise ReportError(
            f"{root}: {name}'s metadata says it is rank {said}{like}; expected the directory's rank to be "
            "its metadata's rank (a copy of another rank's directory?); move it out"
        )
    if trace_id is not None and trace_id in seen and _one_trace(seen[trace_id], path):
        raise ReportError(
            f"{root}: {os.path.basename(seen[trace_id])} and {name} hold the same trace (trace_id "
            f"{trace_id}); expected one directory per rank (a copy?); move one out"
        )
    seen[("rank", rank)] = path
    if trace_id is not None:
        seen[trace_id] = path


def _one_trace(before, path):
    """Whether rank directories `before` and `path` are two directories of one trace: in one directory, and not one
    read again (`optrace compare a a`: the same name and real path). Two traces holding one trace id are a trace given
    twice (`optrace compare a copy_of_a`), as for a trace of one process."""
    if os.path.realpath(os.path.dirname(before)) != os.path.realpath(os.path.dirname(path)):
        return False
    return os.path.basename(before) != os.path.basename(path) or os.path.realpath(before) != os.path.realpath(path)


def ranks_present(path):
    """How many ranks' directories a trace path holds: its `rank=R` directories, 1 for a rank's own directory."""
    found = rank_paths(path)
    if found:
        return len(found)
    return 1 if _RANK_DIR.match(os.path.basename(os.path.normpath(os.fspath(path)))) else 0


def run_name(path, rank, meta, taken):
    """A run's name: its run_name (else the directory's name), `/rank=R` for a rank of a distributed trace,
    `#2`, `#3`, ... when a run in `taken` has it already (two runs with one name: keep both)."""
    name = escaped(meta.get("run_name") or os.path.basename(os.fspath(path)))
    if rank is not None:
        name = f"{name}/rank={rank}"
    base, n = name, 2
    while name in taken:
        name, n = f"{base}#{n}", n + 1
    return name


def escaped(text):
    """`text` with its lone surrogates written as Python escapes ('\\udce9'): a name every output can encode."""
    return text if is_unicode(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def runs_with_ranks(paths):
    """(path, rank) per trace to read: a distributed trace's rank directories, each with its rank; a rank's directory
    given alone (`job/rank=1`) with its rank too, so its run is named as in the whole trace (`job/rank=1`)."""
    for path in paths:
        path = os.fsdecode(path) if isinstance(path, bytes) else path  # b'/path': what os.fsdecode makes of it
        if list_parts(path):
            alone = _RANK_DIR.match(os.path.basename(os.path.normpath(path)))
            digits = alone.group(1) if alone else ""
            yield path, int(digits) if digits and len(digits) <= 20 and int(digits) < MAX_RANK else None
            continue
        yield from rank_paths(path) or [(path, None)]


def _fill_v2(frame, wanted, lacks):
    """A trace's frame of an older version with the columns added since, holding the values its semantics imply
    (null where they are unknown: grad_mode before v4)."""
    import pandas as pd

    for name in wanted:
        if name in frame.columns:
            continue
        default = lacks[name]
        if name == "busy_ns":  # v1 recorded synchronised wall time: no idle gap to remove
            frame[name] = frame["duration_ns"]
        elif name in ("output_storage_bytes", "group_sizes"):
            frame[name] = pd.Series([None] * len(frame), dtype=object)
        elif name == "grad_mode":  # categorical, as a v4 trace's loads: the two concatenate as one
            frame[name] = pd.Categorical([None] * len(frame), categories=GRAD_MODES)
        elif default is None:
            frame[name] = pd.Series(pd.NA, index=frame.index, dtype="Int64")
        else:
            frame[name] = default
    return frame[wanted]


def runs_of(df):
    """The {run name: metadata} of a loaded trace, or raise ReportError if it was not made by `load`."""
    runs = df.attrs.get("runs")
    if not runs:
        raise ReportError("expected a DataFrame returned by reports.load (its attrs['runs'] holds the run metadata)")
    return runs


def kept_runs(df, runs):
    """{name: metadata} of `runs` (a loaded trace's attrs['runs']) but for those a filter of `df` emptied (their
    metadata counts rows, `df` holds none of them: a frame filtered to some ranks keeps every run's metadata, and
    the others would be reported as runs of 0 FLOPs); a run that traced nothing stays (the reports name it)."""
    present = set(df["run"].unique().tolist()) if "run" in df.columns and len(df) else set()
    kept = {n: m for n, m in runs.items() if n in present or not (m or {}).get("rows")}
    return kept or runs


def require(df, columns, what):
    """Raise ReportError naming the columns `what` needs and `df` lacks."""
    from reports.loading.columns import has_column

    missing = [c for c in columns if not has_column(df, c)]
    if missing:
        raise ReportError(f"{what}: the trace lacks column(s) {missing}; load it with them")
