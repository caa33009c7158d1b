"""A trace as Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing open.

    optrace export runs/gpt.parquet -o gpt.json   (or gpt.json.gz: gzip-compressed; or - : to stdout)

Layout: one process per rank (a trace with `rank=R` sub-directories has one per
rank; a plain trace is rank 0), one track per phase (forward, backward, optimizer,
other: the trace records no thread id, and on CUDA the backward runs on autograd's
own thread, so a phase is the closest thing to a thread it has). On each track the
modules are nested slices (`blocks.0` inside `blocks` inside the root module, by
their dotted paths) and the ops are slices inside them, with args named as
torch.profiler names them where it has a name ("Input Dims", "Input type") and
optrace's column names otherwise. Input type holds torch dtype names (float32),
not torch.profiler's C++ names (float).

Time: with `start_ns` (schema v2) a slice starts at the op's start, relative to the
earliest op of any rank; an op that would overlap the one before it on its track
(CUDA event times are GPU time, start_ns is the CPU's issue time) is pushed to start
where the one before ended. Without `start_ns` (v1 traces) ops are laid end to end.
Slice length is busy_ns where the trace has it, else duration_ns.

Counters per process: "live bytes" (the `live_bytes` column), "memory by category"
(parameters, gradients, optimizer_state from the run metadata's storage ids, and
other: everything else live, so the four add up to live bytes) and "cumulative
FLOPs". Each is written when its value changes.

Memory stays bounded: the parts are read in batches with pyarrow and each event is
written as it is made, one per line.

Damage: every batch passes the checks of reports.loading.validate before its events are
made (a null, a negative or absurd value, a repeated seq is one ReportError). A trace
cut short or damaged is still written, with a warning (`optrace export` prints it as a
note on stderr and exits 0), "complete" and "damage" per rank in the JSON's
`otherData`, and the process label of the rank saying INCOMPLETE or DAMAGED. The
report's caveats of each rank's metadata are in `otherData` "caveats", and an op whose
FLOPs are a bound has `"flops_bound": true` in its args.
"""

import contextlib
import gzip
import os
import re
import sys
import warnings

import pyarrow.parquet as pq

from reports.errors import ReportError
from reports.loading.integrity import Footers, describe_damage, list_parts, merged_away, one_line, reread, stopped_by
from reports.loading.load import id_limit, read_run
from reports.loading.validate import check_rows
from reports.output.caveats import meta_caveats
from reports.output.export_events import CATEGORIES, TID, JsonEvents, RankEvents, Strings  # noqa: F401 (CATEGORIES: re-exported)
from tracer.schema import COLUMN_NAMES, PHASES, part_paths

__all__ = ["export_chrome", "export_trace", "trace_ranks"]

BATCH_ROWS = 8192
_RANK_DIR = re.compile(r"^rank=(\d+)$")
_COLUMNS = (
    "seq",
    "step",
    "phase",
    "module",
    "op",
    "input_shapes",
    "input_dtypes",
    "output_shapes",
    "output_dtypes",
    "input_storage_ids",
    "output_storage_ids",
    "freed_storage_ids",
    "flops",
    "flop_kind",
    "bytes_read",
    "bytes_written",
    "bytes_allocated",
    "live_bytes",
    "duration_ns",
)
_V2 = ("start_ns", "busy_ns", "output_storage_bytes", "flops_bound")  # later schemas' (flops_bound: v3)


def trace_ranks(path):
    """[(rank, trace directory, metadata)]: the `rank=R` sub-directories in rank order, else the trace as rank 0."""
    path = os.fspath(path)
    ranks = []
    if os.path.isdir(path) and not list_parts(path):
        for name in os.listdir(path):
            match = _RANK_DIR.match(name)
            if match and os.path.isdir(os.path.join(path, name)):
                ranks.append((int(match.group(1)), os.path.join(path, name)))
    if not ranks:
        ranks = [(0, path)]
    return [(rank, directory, _read_run(directory)) for rank, directory in sorted(ranks)]


def _read_run(directory):
    """read_run, the columns export leaves out checked from the parts' statistics; `_rows`: rows on disk."""
    footers = Footers()
    meta = read_run(directory, footers, [c for c in COLUMN_NAMES if c not in _COLUMNS + _V2])
    return dict(meta, _rows=sum(footers.rows.values()))


def _columns(directory):
    names = set(pq.read_schema(part_paths(directory)[0]).names)
    missing = [c for c in _COLUMNS if c not in names]
    if missing:
        raise ReportError(f"{directory}: trace lacks column(s) {missing}")
    return [c for c in _COLUMNS + _V2 if c in names]


def _warn_damage(directory, meta):
    """One warning for a rank cut short or damaged, every fact in it (as reports.load warns)."""
    broken = describe_damage(meta["damage"])
    if meta.get("complete") and not broken:
        return
    state = f"incomplete ({stopped_by(meta)})" if not meta.get("complete") else "damaged"
    warnings.warn(f"{directory}: trace is {state}{': ' + broken if broken else ''}; exporting the rows it has")


def _first_start(directory):
    """The start_ns of a rank's first op, or None (no start_ns column, or no rows). Read with pq.ParquetFile, not
    pq.read_table (whose pyarrow.dataset loads pandas)."""
    for part in part_paths(directory):
        with pq.ParquetFile(part) as parquet:
            if "start_ns" not in parquet.schema_arrow.names:
                return None
            for batch in parquet.iter_batches(batch_size=1, columns=["start_ns"]):
                if batch.num_rows:
                    return batch.column(0)[0].as_py()
    return None


def _label(rank, meta):
    device = (meta.get("device") or {}).get("name") or "?"
    return f"rank {rank}: {meta.get('run_name') or 'trace'} ({device}){_damage_mark(meta)}"


def _damage_mark(meta):
    if not meta.get("complete"):
        return f" INCOMPLETE ({stopped_by(meta)})"
    return " DAMAGED" if describe_damage(meta["damage"]) else ""


def export_trace(trace, out, batch_rows=BATCH_ROWS):
    """Write `trace` (a trace directory, with or without rank=R sub-directories) to `out`:
    Chrome trace-event JSON when `out` ends in .json, Perfetto's protobuf format when it ends
    in .pftrace (needs the `perfetto` package). Returns the number of op slices written.
    A live trace whose parts are merged away while read is exported again from its new parts
    (into a file; to stdout, the first events are out already: one line says so)."""

    def attempt():
        with warnings.catch_warnings(record=True) as caught:  # an attempt abandoned warns nothing
            warnings.simplefilter("always")
            return _export(trace, out, batch_rows), caught

    try:
        ops, caught = attempt() if os.fspath(out) == "-" else reread(attempt)
    except Exception as exc:
        if isinstance(exc, ReportError) or not merged_away(exc):
            raise
        raise ReportError(
            f"export: {one_line(exc)} (the tracer of a live trace merged that part away while it was "
            "read: export the trace again)"
        ) from None
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return ops


def _export(trace, out, batch_rows):
    out = os.fspath(out)
    if out.endswith(".pftrace"):
        from reports.output.pftrace import ProtoEvents as events
    elif out == "-" or out.endswith((".json", ".json.gz")):
        events = JsonEvents
    else:
        raise ReportError(
            f"export: the output must end in .json or .json.gz (Chrome JSON) or .pftrace (Perfetto), "
            f"or be - (Chrome JSON to stdout), got {out!r}"
        )
    ranks = trace_ranks(trace)
    if out != "-":  # a file left inside a trace makes it unreadable (reports.loading.integrity: not a part)
        where, home = os.path.realpath(os.path.dirname(os.path.abspath(out))), os.path.realpath(os.fspath(trace))
        if where == home or where.startswith(home + os.sep):
            raise ReportError(
                f"export: the output {out!r} is inside the trace {os.fspath(trace)!r}, which holds only "
                "the tracer's files: write it elsewhere"
            )
    columns = {directory: _columns(directory) for _, directory, _ in ranks}  # a column missing: refused before writing
    for _, directory, meta in ranks:
        _warn_damage(directory, meta)
    starts = [s for s in (_first_start(d) for _, d, _ in ranks) if s is not None]
    base = min(starts) if starts else None
    text = Strings()
    ops = 0
    tmp = None  # the temporary file this export created (and removes, unless it became `out`)
    try:
        if out != "-":
            tmp, fd = _temporary(out)
        with _open_output(out, fd if tmp is not None else None, binary=events is not JsonEvents) as f:
            sink = events(f, text)
            sink.start(
                {
                    "exporter": "optrace export",
                    "ranks": [r for r, _, _ in ranks],
                    "time": "start_ns" if base is not None else "ops laid end to end",
                    "complete": {str(r): bool(m.get("complete")) for r, _, m in ranks},
                    "damage": {str(r): dict(m["damage"]) for r, _, m in ranks},
                    # what the report's caveats say of each rank's metadata (reports.output.caveats.meta_caveats)
                    "caveats": {str(r): [{"code": c, "message": s} for c, s in meta_caveats(m)] for r, _, m in ranks},
                }
            )
            for rank, directory, meta in ranks:
                sink.process(rank, _label(rank, meta), [(TID[p], p) for p in PHASES])
                state = RankEvents(rank, meta, base, sink, text)
                limit, last = id_limit(meta, meta["_rows"]), None
                for part in part_paths(directory):
                    for batch in pq.ParquetFile(part).iter_batches(batch_size=batch_rows, columns=columns[directory]):
                        last = check_rows(directory, batch, limit, last)
                        state.batch(batch)
                        ops += batch.num_rows
                state.finish()
            sink.finish()
        if tmp is not None:
            os.replace(tmp, out)
            tmp = None
    except BrokenPipeError:  # -o - into `head`: the reader has what it wanted (the CLI exits quietly)
        raise
    except OSError as exc:
        if merged_away(exc):
            raise
        raise ReportError(f"export: cannot write {out!r} ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass
    return ops


def _temporary(out):
    """(path, descriptor) of a new temporary file beside `out`, renamed onto it when the export is whole:
    `.NAME.<random>.tmp`, created exclusively and never through a link (O_EXCL, O_NOFOLLOW), so a file or link
    of the user's there is never written, truncated or removed."""
    directory, name = os.path.split(os.path.abspath(out))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(4).hex()}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {out!r}")


@contextlib.contextmanager
def _open_output(out, fd, binary):
    """The file the events stream into: stdout for "-" (left open), else the temporary file `fd`, gzip-compressed
    for .json.gz."""
    if out == "-":
        yield sys.stdout
        sys.stdout.flush()
    elif out.endswith(".gz"):
        with open(fd, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8", compresslevel=6) as f:
            yield f
    else:
        with open(fd, "wb" if binary else "w", buffering=1 << 20) as f:
            yield f


def export_chrome(trace, out, batch_rows=BATCH_ROWS):
    """`export_trace` to a .json file: Chrome trace-event JSON."""
    if not os.fspath(out).endswith(".json"):
        raise ReportError(f"export: the output must end in .json (Chrome trace-event JSON), got {os.fspath(out)!r}")
    return export_trace(trace, out, batch_rows)
