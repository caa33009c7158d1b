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

Damage: every batch passes the checks of reports/loading/validate.py before its events are
made (a null, a negative or absurd value, a repeated seq is one ReportError). A trace
cut short or damaged is still written, with a warning (`optrace export` prints it as a
note on stderr and exits 0), "complete" and "damage" per rank in the JSON's
`otherData`, and the process label of the rank saying INCOMPLETE or DAMAGED.
"""

import contextlib
import gzip
import json
import os
import re
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reports.errors import ReportError
from reports.loading.integrity import Footers, describe_damage, list_parts, merged_away, one_line, reread, stopped_by
from reports.loading.load import id_limit, read_run
from reports.loading.validate import check_rows
from reports.memory.lifetimes import dtype_sizes
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
_V2 = ("start_ns", "busy_ns", "output_storage_bytes")
CATEGORIES = ("parameters", "gradients", "optimizer_state", "other")
_TID = {phase: i + 1 for i, phase in enumerate(PHASES)}  # one track per phase


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
    """The start_ns of a rank's first op, or None (no start_ns column, or no rows)."""
    for part in part_paths(directory):
        if "start_ns" not in pq.read_schema(part).names:
            return None
        column = pq.read_table(part, columns=["start_ns"]).column(0)
        if len(column):
            return column[0].as_py()
    return None


class _Strings:
    """JSON text of the strings the events repeat (op, module and phase names), made once each."""

    def __init__(self):
        self._text = {}

    def __call__(self, value):
        text = self._text.get(value)
        if text is None:
            text = self._text[value] = json.dumps(value)
        return text


def _ancestors(module, root):
    """The nested slices for a module path: the root, then each dotted prefix ('' -> none)."""
    if not module:
        return []
    parts = module.split(".")
    chain = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return chain if root is None or module == root else [root, *chain]


def _roles(meta):
    """({storage id: category} from the run metadata, {parameter storage id: bytes} live from the start)."""
    roles, params, itemsize = {}, {}, dtype_sizes(meta)
    for p in (meta.get("parameters") or {}).values():
        sid = p.get("storage_id")
        roles[sid] = "parameters"
        numel = 1
        for d in p.get("shape") or ():
            numel *= d
        params[sid] = numel * itemsize.get(p.get("dtype"), 0)
    for key, category in (("gradient", "gradients"), ("optimizer_state", "optimizer_state")):
        for sid in (meta.get("storage_roles") or {}).get(key, ()):
            roles[sid] = category
    return roles, params


def _offsets(lists):
    """A ListArray's offsets from 0 (a batch may be a slice of a longer array)."""
    offsets = lists.offsets
    return pc.subtract(offsets, offsets[0]) if len(offsets) and offsets[0].as_py() else offsets


def _join(strings, lists):
    """JSON arrays: per row of `lists`, its elements (given as JSON text in `strings`) in brackets."""
    joined = pc.binary_join(pa.ListArray.from_arrays(_offsets(lists), strings), ",")
    return pc.binary_join_element_wise("[", joined, "]", "").fill_null("[]")


def _dictionary(names):
    return names if isinstance(names, pa.DictionaryArray) else names.dictionary_encode()


def _json_names(names, text):
    """JSON text of a (dictionary-encoded) string array, each distinct string quoted once."""
    names = _dictionary(names)
    return pa.array([text(v) for v in names.dictionary.to_pylist()], pa.string()).take(names.indices)


def _ints_json(lists):
    return _join(pc.cast(lists.flatten(), pa.string()), lists)


def _args(batch, text):
    """Every op's args object body, built column by column in Arrow (no Python object per value)."""
    col = batch.column

    def number(name):
        return pc.cast(col(name), pa.string())

    def dtypes(name):
        return _join(_json_names(col(name).flatten(), text), col(name))

    def dims(name):
        return _join(_ints_json(col(name).flatten()), col(name))

    pieces = [
        '"op":', _json_names(col("op"), text), ',"seq":', number("seq"), ',"step":', number("step"),
        ',"module":', _json_names(col("module"), text),
        ',"Input Dims":', dims("input_shapes"), ',"Input type":', dtypes("input_dtypes"),
        ',"Output Dims":', dims("output_shapes"), ',"Output type":', dtypes("output_dtypes"),
        ',"flops":', number("flops"), ',"flop_kind":', _json_names(col("flop_kind"), text),
        ',"bytes_read":', number("bytes_read"), ',"bytes_written":', number("bytes_written"),
        ',"bytes_allocated":', number("bytes_allocated"),
        ',"input_storage_ids":', _ints_json(col("input_storage_ids")),
        ',"output_storage_ids":', _ints_json(col("output_storage_ids")),
    ]  # fmt: skip
    return pc.binary_join_element_wise(*pieces, "").to_pylist()


def _ns(value):
    """ns as Chrome's microseconds, 3 decimals."""
    return f"{value // 1000}.{value % 1000:03d}" if value >= 0 else f"{value / 1000:.3f}"


def _ints(array):
    return array.to_numpy(zero_copy_only=False).tolist()


class _Rank:
    """Turns one rank's rows into events: its tracks, open module slices, clocks and counters."""

    def __init__(self, rank, meta, base, out, text):
        self.pid = rank
        self.out = out
        self.text = text
        self.base = base
        self.root = meta.get("root_module")
        self.cursor = 0  # end of the last op, for traces without start_ns (ns after the trace start)
        self.track_end = {}  # tid -> end of its last op (ns)
        self.stack = []  # open module slices on the current track
        self.track = None  # (tid, step) the open slices belong to
        self.live = None
        self.flops = 0
        self.roles, self.role_live = _roles(meta)
        self.role_ids = pa.array(sorted(k for k in self.roles if k is not None), pa.int64())
        self.by_category = None

    def _close_to(self, keep, tid, at):
        while len(self.stack) > keep:
            self.out.end(self.pid, tid, at, self.stack.pop())

    def batch(self, batch):
        """Write the events of one record batch of rows, in row order."""
        pid, text, out = self.pid, self.text, self.out
        col, names = batch.column, batch.schema.names
        args = _args(batch, text)
        ops = _dictionary(col("op"))
        short = [
            o.removeprefix("aten.").rsplit(".", 1)[0] if o.startswith("aten.") else o
            for o in ops.dictionary.to_pylist()
        ]
        op_ids = _ints(ops.indices)
        modules = _dictionary(col("module"))
        chains = [_ancestors(m, self.root) for m in modules.dictionary.to_pylist()]
        module_ids = _ints(modules.indices)
        phases = _dictionary(col("phase"))
        tids = [_TID.get(p, len(PHASES)) for p in phases.dictionary.to_pylist()]  # unknown phases: "other"
        phase_ids = _ints(phases.indices)
        step = _ints(col("step"))
        time = pc.coalesce(col("busy_ns"), col("duration_ns")) if "busy_ns" in names else col("duration_ns")
        duration = _ints(time)
        start = _ints(col("start_ns")) if "start_ns" in names and self.base is not None else None
        live, flops = _ints(col("live_bytes")), _ints(col("flops"))
        # the split by category needs storage sizes (v2) and storages with a role (a trace made with model=)
        roles = self._role_rows(batch) if "output_storage_bytes" in names and len(self.role_ids) else None
        track_end, stack, base = self.track_end, self.stack, self.base
        for i in range(len(op_ids)):
            tid = tids[phase_ids[i]]
            end_before = track_end.get(tid, 0)
            ts = max(start[i] - base, end_before) if start is not None and start[i] is not None else self.cursor
            if self.track != (tid, step[i]):  # the track or step changed: close the old track's modules
                if self.track is not None:
                    self._close_to(0, self.track[0], track_end.get(self.track[0], 0))
                self.track = (tid, step[i])
            chain = chains[module_ids[i]]
            if stack != chain:
                keep = 0
                while keep < len(stack) and keep < len(chain) and stack[keep] == chain[keep]:
                    keep += 1
                self._close_to(keep, tid, end_before)
                for name in chain[keep:]:
                    out.begin(pid, tid, ts, name)
                    stack.append(name)
            end = ts + duration[i]
            track_end[tid] = self.cursor = end
            out.op(pid, tid, ts, duration[i], short[op_ids[i]], args[i])
            if live[i] != self.live:
                self.live = live[i]
                out.counter(pid, end, "live bytes", {"total": live[i]})
                if roles is not None:
                    self._categories(roles.pop(i, None), live[i], end)
            elif roles and i in roles:
                self._categories(roles.pop(i), live[i], end)
            if flops[i]:
                self.flops += flops[i]
                out.counter(pid, end, "cumulative FLOPs", {"flops": self.flops})

    def _role_rows(self, batch):
        """{row: (freed role storage ids, [(output role storage id, bytes)])} for rows touching a role's storage."""
        found = {}
        for column in ("freed_storage_ids", "output_storage_ids"):
            lists = batch.column(column)
            values = lists.flatten()
            hits = pc.is_in(values, value_set=self.role_ids).to_numpy(zero_copy_only=False)
            if not hits.any():
                continue
            rows = np.searchsorted(_offsets(lists).to_numpy(), np.flatnonzero(hits), side="right") - 1
            ids = values.to_numpy()[hits].tolist()
            if column == "freed_storage_ids":
                for row, sid in zip(rows.tolist(), ids):
                    found.setdefault(row, ([], []))[0].append(sid)
            else:
                sizes = batch.column("output_storage_bytes").flatten().to_numpy()[hits].tolist()
                for row, sid, size in zip(rows.tolist(), ids, sizes):
                    found.setdefault(row, ([], []))[1].append((sid, size))
        return found

    def _categories(self, change, live, at):
        """Write the "memory by category" counter when the split moved (live bytes or a role storage changed)."""
        role_live = self.role_live
        if change is not None:
            for sid in change[0]:
                role_live.pop(sid, None)
            for sid, size in change[1]:
                role_live[sid] = size
        split = dict.fromkeys(CATEGORIES[:-1], 0)
        for sid, size in role_live.items():
            split[self.roles[sid]] += size
        split["other"] = max(0, live - sum(split.values()))
        if split != self.by_category:
            self.by_category = split
            self.out.counter(self.pid, at, "memory by category", split)

    def finish(self):
        if self.track is not None:
            self._close_to(0, self.track[0], self.track_end.get(self.track[0], 0))


class JsonEvents:
    """Writes Chrome trace-event JSON, one event per line (ts in microseconds, 3 decimals)."""

    suffix = ".json"

    def __init__(self, file, text):
        self.write = file.write
        self.text = text

    def start(self, other):
        self.write(f'{{"displayTimeUnit":"ns","otherData":{json.dumps(other)},"traceEvents":[\n')

    def process(self, pid, label, tracks):
        write, text = self.write, self.text
        write(f'{{"ph":"M","pid":{pid},"name":"process_name","args":{{"name":{text(label)}}}}},\n')
        write(f'{{"ph":"M","pid":{pid},"name":"process_sort_index","args":{{"sort_index":{pid}}}}},\n')
        for i, (tid, name) in enumerate(tracks):
            write(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_name","args":{{"name":{text(name)}}}}},\n')
            write(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_sort_index","args":{{"sort_index":{i}}}}},\n')

    def begin(self, pid, tid, ts, name):
        self.write(f'{{"ph":"B","pid":{pid},"tid":{tid},"ts":{_ns(ts)},"cat":"module","name":{self.text(name)}}},\n')

    def end(self, pid, tid, ts, name):
        self.write(f'{{"ph":"E","pid":{pid},"tid":{tid},"ts":{_ns(ts)},"cat":"module","name":{self.text(name)}}},\n')

    def op(self, pid, tid, ts, dur, name, args):
        self.write(
            f'{{"ph":"X","pid":{pid},"tid":{tid},"ts":{_ns(ts)},"dur":{_ns(dur)},"cat":"op",'
            f'"name":{self.text(name)},"args":{{{args}}}}},\n'
        )

    def counter(self, pid, ts, name, values):
        body = ",".join(f'"{k}":{v}' for k, v in values.items())
        self.write(f'{{"ph":"C","pid":{pid},"ts":{_ns(ts)},"name":{self.text(name)},"args":{{{body}}}}},\n')

    def finish(self):
        self.write('{"ph":"M","pid":0,"name":"process_labels","args":{"labels":"optrace"}}\n]}\n')


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
    if out != "-":  # a file left inside a trace makes it unreadable (reports/loading/integrity.py: not a part)
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
    text = _Strings()
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
                }
            )
            for rank, directory, meta in ranks:
                sink.process(rank, _label(rank, meta), [(_TID[p], p) for p in PHASES])
                state = _Rank(rank, meta, base, sink, text)
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
