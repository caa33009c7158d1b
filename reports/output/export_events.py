"""A rank's rows as trace events, and the sink that writes them as Chrome trace-event JSON.

reports.output.export.export_trace reads the parts in batches; RankEvents turns each batch into the events of one
rank (its phase tracks, the module slices nested by dotted path, the ops with their args, the counters), and
hands them to a sink: JsonEvents here, reports.output.pftrace.ProtoEvents for .pftrace. The layout and the
counters are described in reports.output.export.
"""

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import array_of, numpy_of, scalar, values_of
from reports.memory.lifetimes import dtype_sizes
from tracer.schema import PHASES

CATEGORIES = ("parameters", "gradients", "optimizer_state", "other")
TID = {phase: i + 1 for i, phase in enumerate(PHASES)}  # one track per phase


class Strings:
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
    joined = pc.binary_join(pa.ListArray.from_arrays(_offsets(lists), strings), _S[","])
    return pc.binary_join_element_wise(_S["["], joined, _S["]"], _S[""]).fill_null(_S["[]"])


def _text(value):
    """An Arrow string scalar of `value` (reports.arrays.scalar: no pandas)."""
    return scalar(value, pa.string())


_S = {s: _text(s) for s in ("[", "]", "", "[]", ",")}


def _dictionary(names):
    return names if isinstance(names, pa.DictionaryArray) else names.dictionary_encode()


def _json_names(names, text):
    """JSON text of a (dictionary-encoded) string array, each distinct string quoted once."""
    names = _dictionary(names)
    return array_of([text(v) for v in names.dictionary.to_pylist()], pa.string()).take(names.indices)


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
    if "flops_bound" in batch.schema.names:  # a bound, not a count: said where it is so (v3)
        bound = pc.fill_null(col("flops_bound"), scalar(False, pa.bool_()))
        pieces.append(pc.if_else(bound, _text(',"flops_bound":true'), _S[""]))
    # the literal pieces as Arrow scalars (a Python str is converted by pyarrow.scalar, which loads pandas)
    return pc.binary_join_element_wise(*(_text(p) if isinstance(p, str) else p for p in pieces), _S[""]).to_pylist()


def _ns(value):
    """ns as Chrome's microseconds, 3 decimals."""
    return f"{value // 1000}.{value % 1000:03d}" if value >= 0 else f"{value / 1000:.3f}"


def _ints(array):
    return values_of(array).tolist()


class RankEvents:
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
        self.role_ids = array_of(sorted(k for k in self.roles if k is not None), pa.int64())
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
        tids = [TID.get(p, len(PHASES)) for p in phases.dictionary.to_pylist()]  # unknown phases: "other"
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
            hits = numpy_of(pc.is_in(values, value_set=self.role_ids))
            if not hits.any():
                continue
            rows = np.searchsorted(numpy_of(_offsets(lists)), np.flatnonzero(hits), side="right") - 1
            ids = numpy_of(values)[hits].tolist()
            if column == "freed_storage_ids":
                for row, sid in zip(rows.tolist(), ids):
                    found.setdefault(row, ([], []))[0].append(sid)
            else:
                sizes = numpy_of(batch.column("output_storage_bytes").flatten())[hits].tolist()
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
