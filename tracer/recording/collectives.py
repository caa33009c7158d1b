"""Collective ops: what each c10d / `_c10d_functional` op writes, moves and costs in time.

* `collective_op(func)` describes a collective overload from a table (their schemas
  carry no alias annotations): which arguments it writes in place, its message size S
  as nccl-tests defines it, its process group and group size.
* `Completions` turns a collective's launch into its completion time: a collective's
  row lasts until its work finished (see its docstring).
"""

import time
import weakref
from dataclasses import dataclass

import torch

from tracer.schema import NO_VALUE

Tensor = torch.Tensor
_perf_ns = time.perf_counter_ns

COMPLETION_WAIT_S = 0.05  # how long a flush waits for the callback of a work already done
# how long a flush waits in all for the callbacks of works whose Future nobody holds any more (so whether they are done
# cannot be asked): a Future's waiters wake before its callbacks run, and a callback needs the GIL, so a work the program
# waited for can still lack its end when its row is written (about 1 in 4 two-rank DDP runs had one all-reduce so)
DROPPED_WAIT_S = 0.005


# --- the collective table ----------------------------------------------------------------
WAIT = "wait"
WRAP = "wrap"  # _wrap_tensor_autograd: wraps a functional collective's result, moves nothing
NOT_COLLECTIVES = (WAIT, WRAP)  # rows of kind "none", without comm_bytes


@dataclass(frozen=True)
class Collective:
    """How to read one collective op.

    kind     all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, reduce,
             gather, scatter, send, recv, barrier
    written  (argument name, written only) for each argument the op writes in place;
             written-only buffers (an all-gather's output) are not read
    size     the argument whose bytes give S, and whether to multiply them by the
             group size (nccl-tests' S is the full array: an all-gather's S is the
             per-rank input x ranks)
    group    the argument naming the process group (a ProcessGroup, or a group name)
    functional  a `_c10d_functional` op: it returns plain tensors, and a `wait_tensor`
             (or the first use of its AsyncCollectiveTensor) marks its completion
    """

    kind: str
    written: tuple
    size: str
    times_group: bool
    group: str
    functional: bool

    def positions(self, schema):
        names = [a.name for a in schema.arguments]
        wanted = {self.size, self.group, *(w for w, _ in self.written)}
        return {name: names.index(name) for name in wanted if name in names}  # a wait names no group


def _c10d(kind, written, size, times_group=False):
    return Collective(kind, written, size, times_group, "process_group", False)


def _functional(kind, written, size, times_group=False):
    return Collective(kind, written, size, times_group, "group_name", True)


_OUT = True  # written only
_RW = False  # read and written

_C10D = {
    "allreduce_": _c10d("all_reduce", (("tensors", _RW),), "tensors"),
    "allreduce_coalesced_": _c10d("all_reduce", (("tensors", _RW),), "tensors"),
    "_allgather_base_": _c10d("all_gather", (("output_tensor", _OUT),), "input_tensor", True),
    "allgather_": _c10d("all_gather", (("output_tensors", _OUT),), "input_tensors", True),
    "allgather_coalesced_": _c10d("all_gather", (("output_lists", _OUT),), "input_list", True),
    "allgather_into_tensor_coalesced_": _c10d("all_gather", (("outputs", _OUT),), "inputs", True),
    "_reduce_scatter_base_": _c10d("reduce_scatter", (("output_tensor", _OUT),), "output_tensor", True),
    "reduce_scatter_": _c10d("reduce_scatter", (("output_tensors", _OUT),), "output_tensors", True),
    "reduce_scatter_tensor_coalesced_": _c10d("reduce_scatter", (("outputs", _OUT),), "outputs", True),
    "broadcast_": _c10d("broadcast", (("tensors", _RW),), "tensors"),
    "reduce_": _c10d("reduce", (("tensors", _RW),), "tensors"),
    "gather_": _c10d("gather", (("output_tensors", _OUT),), "input_tensors", True),
    "scatter_": _c10d("scatter", (("output_tensors", _OUT),), "output_tensors", True),
    "alltoall_": _c10d("all_to_all", (("output_tensors", _OUT),), "input_tensors"),
    "alltoall_base_": _c10d("all_to_all", (("output", _OUT),), "input"),
    "send": _c10d("send", (), "tensors"),
    "recv_": _c10d("recv", (("tensors", _OUT),), "tensors"),
    "recv_any_source_": _c10d("recv", (("tensors", _OUT),), "tensors"),
    "barrier": _c10d("barrier", (), ""),
    "monitored_barrier_": _c10d("barrier", (), ""),
}
_FUNCTIONAL = {
    "all_reduce": _functional("all_reduce", (), "input"),
    "all_reduce_": _functional("all_reduce", (("input", _RW),), "input"),
    "all_reduce_coalesced": _functional("all_reduce", (), "inputs"),
    "all_reduce_coalesced_": _functional("all_reduce", (("inputs", _RW),), "inputs"),
    "all_gather_into_tensor": _functional("all_gather", (), "input", True),
    "all_gather_into_tensor_out": _functional("all_gather", (("out", _OUT),), "input", True),
    "all_gather_into_tensor_coalesced": _functional("all_gather", (), "inputs", True),
    "reduce_scatter_tensor": _functional("reduce_scatter", (), "input"),
    "reduce_scatter_tensor_out": _functional("reduce_scatter", (("out", _OUT),), "input"),
    "reduce_scatter_tensor_coalesced": _functional("reduce_scatter", (), "inputs"),
    "broadcast": _functional("broadcast", (), "input"),
    "broadcast_": _functional("broadcast", (("input", _RW),), "input"),
    "all_to_all_single": _functional("all_to_all", (), "input"),
    "isend": _functional("send", (), "tensor"),
    "irecv": _functional("recv", (("tensor", _OUT),), "tensor"),
    "wait_tensor": _functional(WAIT, (), ""),  # not a collective: the wait for one (comm_bytes null)
    "_wrap_tensor_autograd": _functional(WRAP, (), ""),
}


def _flatten(value, into):
    """Tensors in `value`, two list levels deep (allgather_'s list of lists)."""
    if isinstance(value, Tensor):
        into.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, Tensor):
                into.append(v)
            elif isinstance(v, (list, tuple)):
                into.extend(w for w in v if isinstance(w, Tensor))
    return into


def _plain(t):
    """The tensor an AsyncCollectiveTensor (what _wrap_tensor_autograd returns) wraps; others as they are."""
    inner = getattr(t, "elem", None) if type(t) is not Tensor else None
    return inner if isinstance(inner, Tensor) else t


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


class CollectiveOp:
    """One collective overload: its tensors, writes, S and group, read from a call's arguments."""

    def __init__(self, func, spec):
        self.spec = spec
        self.functional = spec.functional
        self._pos = spec.positions(func._schema)
        self.inplace = int(bool(spec.written))
        self.kind = "none" if spec.kind in NOT_COLLECTIVES else "collective"

    def _arg(self, args, kwargs, name):
        pos = self._pos.get(name)
        if pos is None:
            return None
        return args[pos] if pos < len(args) else kwargs.get(name)

    def tensors(self, args, kwargs, out):
        """(inputs, outputs): every tensor argument, and what the op returns (or, when it
        returns only a Work, the tensors it writes)."""
        ins = []
        for value in (*args, *kwargs.values()):
            _flatten(value, ins)
        outs = [_plain(t) for t in _flatten(out, [])]
        if not outs:
            for name, _ in self.spec.written:
                _flatten(self._arg(args, kwargs, name), outs)
        return ins, outs

    def written(self, args, kwargs):
        found = []
        for name, only in self.spec.written:
            found.extend((t, only) for t in _flatten(self._arg(args, kwargs, name), []))
        return found

    def describe(self, args, kwargs):
        """(S in bytes, group size, group name) of one call; NO_VALUE for a wait's S and size."""
        if self.spec.kind in NOT_COLLECTIVES:
            return NO_VALUE, NO_VALUE, ""
        group = self._arg(args, kwargs, self.spec.group)
        size, name = _group(group)
        payload = _nbytes(_flatten(self._arg(args, kwargs, self.spec.size), [])) if self.spec.size else 0
        if self.spec.times_group and size != NO_VALUE:
            payload *= size
        return payload, size, name


def _group(group):
    """(size, name) of a ProcessGroup or a group name; (NO_VALUE, name) when it cannot be resolved."""
    if isinstance(group, str):
        name = group
        try:
            from torch.distributed.distributed_c10d import _resolve_process_group

            return _resolve_process_group(group).size(), name
        except Exception:
            return NO_VALUE, name
    try:
        if isinstance(group, torch._C.ScriptObject):  # how c10d ops receive it
            group = torch.distributed.ProcessGroup.unbox(group)
        return group.size(), group.group_name or ""
    except Exception:
        return NO_VALUE, ""


def collective_op(func):
    """A CollectiveOp for a c10d / _c10d_functional overload, else None."""
    namespace = func.namespace
    if namespace not in ("c10d", "_c10d_functional"):
        return None
    table = _C10D if namespace == "c10d" else _FUNCTIONAL
    spec = table.get(func._schema.name.split("::", 1)[1])
    return CollectiveOp(func, spec) if spec is not None else None


# --- completion timing ---------------------------------------------------------------------
def _work(out):
    """The c10d Work an op returned (alone, or last in a tuple), as a Python Work; None if none."""
    if isinstance(out, tuple) and out:
        out = out[-1]
    if isinstance(out, torch._C.ScriptObject):  # how c10d ops return it
        return torch.distributed.distributed_c10d.Work.unbox(out)
    return out if hasattr(out, "get_future") else None


class Completions:
    """Durations of collectives, measured to their completion rather than their launch.

    * c10d ops (gloo, CPU): the op returns a Work; a callback on `work.get_future()`
      notes the time the work finished. Gloo's reduce-scatter work has no future and
      never reports completion: it keeps its launch time and counts in `untimed`. Nothing waits on the program's behalf: an
      async op stays async, and a blocking call (`dist.all_reduce(t)`) waits in
      `Work.wait()` as it would untraced. A blocking call's time therefore includes
      waiting for the slowest rank to join: that wait is the cost the rank paid.
    * NCCL (CUDA): `CudaCompletion` records an event on the current stream after the
      launch (the communication stream starts from there) and one on a side stream made
      to wait on the work; the duration is the time between them, read without blocking.
    * functional collectives: the row lasts until the `wait_tensor` on its output ends.

    Completions arrive on other threads; they patch `duration_ns` and `busy_ns` of rows
    still in the buffer when it is flushed. A collective that had not finished by the
    flush of its row keeps its launch time and is counted in `untimed`."""

    def __init__(self, duration_field, busy_field, width):
        self._fields = (duration_field, busy_field)
        self._width = width
        self._pending = {}  # seq -> (start perf ns, done-check or None)
        self._ended = {}  # seq -> end perf ns (filled from callback threads)
        self._by_storage = {}  # storage cdata of a functional collective's output -> seq
        self.untimed = 0

    def launched(self, seq, start, end, op, out, outs, device):
        """Start tracking a collective whose row will be `seq` (its launch ran from `start` to `end`)."""
        if op.spec.kind in NOT_COLLECTIVES:
            if op.spec.kind == WAIT:
                for t in outs:
                    self.waited(t, end)
            return
        if op.functional:
            self._pending[seq] = (start, None)
            for t in outs:
                self._by_storage[t.untyped_storage()._cdata] = seq
            return
        work = _work(out)
        if work is None:
            return
        if device is not None and device.type == "cuda":
            done = CudaCompletion(work, device)
            self._pending[seq] = (start, done)
            return
        try:
            future = work.get_future()
        except Exception:  # gloo's reduce-scatter work has no future (nor says when it completed)
            self.untimed += 1
            return
        future.then(lambda _f, seq=seq: self._end(seq))
        self._pending[seq] = (start, _weak_done(future))  # a strong reference would keep its tensors alive

    def _end(self, seq):
        self._ended[seq] = _perf_ns()  # one dict store, atomic: no lock a Ctrl-C could leave held on the traced thread

    def waited(self, tensor, end):
        """A functional collective's output was waited on; it completed at `end`."""
        seq = self._by_storage.pop(tensor.untyped_storage()._cdata, None)
        if seq is not None:
            self._ended[seq] = end

    def apply(self, rows):
        """Write the completions of the collectives in `rows` (a RowBuffer being flushed)."""
        first, last = rows.first_seq, rows.first_seq + len(rows)
        ints, width = rows.ints, self._width
        until = time.monotonic() + DROPPED_WAIT_S  # one wait for all the dropped ones of this flush
        for seq in [s for s in self._pending if first <= s < last]:
            start, done = self._pending.pop(seq)
            end = self._end_of(seq, done, until)
            if end is None:
                self.untimed += 1
                continue
            for field in self._fields:
                ints[(seq - first) * width + field] = max(0, end - start)
        for seq in [s for s in list(self._ended) if s < last]:  # list(): a copy made in one step, as callbacks add
            self._ended.pop(seq, None)

    def _end_of(self, seq, done, until):
        if isinstance(done, CudaCompletion):
            return done.end_ns()
        end = self._ended.get(seq)
        if end is not None or done is None:
            return end
        state = done()  # True: finished, its callback on its way; None: its Future dropped, perhaps finished
        if state is False:
            return None
        deadline = time.monotonic() + COMPLETION_WAIT_S if state else until
        while end is None and time.monotonic() < deadline:
            time.sleep(0.0005)  # lets the thread that runs the callback take the GIL
            end = self._ended.get(seq)
        return end


def _weak_done(future):
    """A `done()` check that does not keep the future (and the tensors it holds) alive: True or False, None once the
    future is gone (the tracer's own wrapper of a c10d work's Future is dropped when launched() returns)."""
    try:
        ref = weakref.ref(future)
    except TypeError:
        return None
    return lambda: (lambda f: None if f is None else bool(f.done()))(ref())


class CudaCompletion:
    """A CUDA collective's device time: an event on the current stream right after the
    launch (the communication stream waits for that point before it starts), and one on a
    side stream made to wait for the work (`Work.wait()` under another current stream
    only adds a stream dependency; the host does not block). Read without blocking."""

    _side = {}  # device index -> side stream, one per device

    def __init__(self, work, device):
        cuda = torch.cuda
        self._launched_ns = _perf_ns()
        self.start = cuda.Event(enable_timing=True)
        self.end = cuda.Event(enable_timing=True)
        self.start.record(cuda.current_stream(device))
        side = self._side.get(device.index)
        if side is None:
            side = self._side[device.index] = cuda.Stream(device=device)
        with cuda.stream(side):
            work.wait()
            self.end.record(side)

    def end_ns(self):
        """Launch time on the host clock plus the device time to completion; None if not done yet."""
        if not self.end.query():
            return None
        return self._launched_ns + int(self.start.elapsed_time(self.end) * 1e6)
