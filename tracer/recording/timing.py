"""How the tracer times each op: a wall clock, a synchronised wall clock, or CUDA events.

    Tracer(path, timing="events")   the default. On CUDA: a pair of CUDA events around
                                    each op on the current stream, resolved in bulk at
                                    flush time with one synchronise. Elsewhere (CPU,
                                    meta, fake tensors): perf_counter_ns around the op.
    Tracer(path, timing="sync")     torch.cuda.synchronize() before and after each op,
                                    then perf_counter_ns (optrace's timing before v2).
                                    The GPU drains after every kernel, so the traced step
                                    becomes launch-bound: use it only to compare.
    Tracer(path, timing="off")      no op time: duration_ns is 0 and busy_ns null.
                                    start_ns is still recorded (it orders the ops).

What the two time columns mean with events. On stream S, op i gets a start event s_i
and an end event e_i, recorded on S right before and right after the CPU issues it;
L_i is the moment the CPU finished issuing it (perf_counter_ns when the op's call
returned), put on the GPU's clock through an anchor event recorded after each
synchronise; e_prev is the end event of the op before it on S:

    duration_ns  e_i - s_i, the raw event time. When the GPU is ahead of the CPU
                 (launch-bound), s_i fires as soon as it is recorded and the GPU then
                 waits while the CPU issues the op's kernels: the raw time includes
                 that wait.
    busy_ns      e_i - max(s_i, e_prev, L_i), clamped to 0..duration_ns: the raw time
                 with the GPU's idle gap before the op's work removed. A stream runs
                 in order, so s_i >= e_prev; the idle gap inside the op ends at the
                 latest when the CPU has issued it (L_i). When the GPU is behind
                 (compute-bound) s_i fires after L_i and busy_ns = duration_ns. NB:
                 an op whose call does CPU work after launching its kernel, or runs
                 several kernels, has part of its GPU work before L_i: busy_ns is then
                 an underestimate (a lower bound on the op's GPU time). The anchor
                 maps clocks to within the event's launch latency (microseconds).

Not covered: work an op queues on a stream other than the current one (NCCL's comm
streams, user side streams) is outside its events; an op on CPU tensors inside a CUDA
run is timed by events on the current stream too (its GPU time, usually about 0).
Neither column includes the tracer's own bookkeeping, which runs between ops, as
`timing="sync"` times effectively do (the GPU drains while the CPU records).

Events come from a pool: one synchronise per flushed part (flush_rows ops) makes
every event of the part readable; then its events go back to the pool, so at most
2 x flush_rows events exist.
"""

import time
from array import array

import torch

from tracer.errors import TraceError
from tracer.safety import describe_exception, warn
from tracer.schema import NO_VALUE
from tracer.store.writer import FIELD, ROW_WIDTH

TIMING_MODES = ("events", "sync", "off")
_NS_PER_MS = 1_000_000
_DURATION = FIELD["duration_ns"]
_BUSY = FIELD["busy_ns"]
_START = FIELD["start"]
_perf_ns = time.perf_counter_ns


def check_timing(timing):
    """The timing mode, or TraceError naming the bad value and the choices."""
    if timing not in TIMING_MODES or not isinstance(timing, str):
        raise TraceError(f"Tracer: timing must be one of {', '.join(map(repr, TIMING_MODES))}, got {timing!r}")
    return timing


def _is_cuda(device):
    return device is not None and device.type == "cuda" and torch.cuda.is_available()


def make_timer(timing, device):
    """The timer for a run on `device` (a torch.device or None before the first op)."""
    if timing == "off":
        return OffTimer()
    if _is_cuda(device):
        return EventTimer(device) if timing == "events" else WallTimer(torch.cuda.synchronize, "sync")
    return WallTimer()


class WallTimer:
    """perf_counter_ns around the op, with `sync()` on both sides when given (timing="sync")."""

    binds = False  # bind() does nothing: the hot path need not call it

    def __init__(self, sync=None, name="wall"):
        self._sync = sync
        self.name = name
        self.inline = sync is None  # start/stop are perf_counter_ns alone: the dispatch hook reads the clock itself

    def start(self):
        if self._sync is not None:
            self._sync()
        return _perf_ns()

    def stop(self, start):
        if self._sync is not None:
            self._sync()
        return _perf_ns() - start

    def bind(self, rows):
        """Called once the op's row is in `rows`; wall times are final already."""

    def resolve(self, rows):
        """Called before `rows` is written; returns the number of rows left unresolved."""
        return 0


class OffTimer(WallTimer):
    """No op time: duration_ns 0 and busy_ns null; start still taken (it orders the ops)."""

    binds = True

    def __init__(self):
        super().__init__(None, "off")
        self.inline = False

    def stop(self, start):
        return 0

    def bind(self, rows):
        rows.ints[len(rows.ints) - ROW_WIDTH + _BUSY] = NO_VALUE


class EventTimer:
    """CUDA events around each op on the current stream, resolved at flush with one synchronise.

    The hot path makes no Python object that outlives the op: events come from a pool,
    and the pending ops are kept in flat lists (row positions in an integer array), so
    the garbage collector has no growing set of containers to scan."""

    name = "events"
    inline = False
    binds = True

    def __init__(self, device, cuda=None):
        self._cuda = cuda if cuda is not None else torch.cuda
        self._device = device
        self._pool = []  # recorded-and-read events, ready to record again
        self._starts, self._ends, self._streams = [], [], []  # per pending op, in row order
        self._positions = array("q")  # per pending op: its row's position in the buffer
        self._start = self._end = self._stream = None  # the op being run, until its row is written
        self.failed = 0  # rows whose events could not be read (they keep their CPU wall time)
        self._anchor = None
        self._anchor_ns = 0
        self._cuda.synchronize(device)
        self._set_anchor()

    def _event(self):
        pool = self._pool
        return pool.pop() if pool else self._cuda.Event(enable_timing=True)

    def _set_anchor(self):
        """Record an event on an idle device and note the CPU time: the two clocks' offset."""
        if self._anchor is not None:
            self._pool.append(self._anchor)
        self._anchor = self._event()
        self._anchor_ns = _perf_ns()  # before the record: it fires no earlier, so busy_ns is not cut short
        self._anchor.record(self._cuda.current_stream(self._device))

    def start(self):
        if self._end is not None:  # the previous op's row was never written (its record failed)
            self._pool += (self._start, self._end)
            self._end = None
        stream = self._stream = self._cuda.current_stream(self._device)
        event = self._start = self._event()
        event.record(stream)
        return _perf_ns()

    def stop(self, start):
        end = self._end = self._event()
        end.record(self._stream)
        return _perf_ns() - start  # the CPU's time to issue the op; replaced at resolve

    def bind(self, rows):
        if self._end is not None:
            self._starts.append(self._start)
            self._ends.append(self._end)
            self._streams.append(self._stream)
            self._positions.append(len(rows) - 1)
            self._end = None

    def resolve(self, rows):
        """Synchronise once, then write every pending row's event times into `rows`; returns rows left unresolved."""
        starts, ends, streams, positions = self._starts, self._ends, self._streams, self._positions
        self._starts, self._ends, self._streams, self._positions = [], [], [], array("q")
        if not starts:
            return 0
        ints = rows.ints
        try:
            self._cuda.synchronize(self._device)
            times = self._read(starts, ends, streams, positions, ints)
            self._set_anchor()
        except Exception as exc:  # bookkeeping must not break the run: keep the wall times
            self.failed += len(starts)
            warn(
                f"optrace: could not read CUDA event times ({describe_exception(exc)}); "
                f"{len(starts)} ops keep their CPU wall time"
            )
            return len(starts)
        finally:
            self._pool += starts
            self._pool += ends
        for pos, (duration, busy) in zip(positions, times):
            ints[pos * ROW_WIDTH + _DURATION] = duration
            ints[pos * ROW_WIDTH + _BUSY] = busy
        return 0

    def _read(self, starts, ends, streams, positions, ints):
        """(duration_ns, busy_ns) arrays of the pending ops, in order, on the anchor's clock (busy_time, inlined)."""
        anchor, anchor_ns = self._anchor, self._anchor_ns
        previous_end = {}  # stream key -> e_prev on that stream (ns after the anchor)
        durations, busies = array("q"), array("q")
        for start, end, stream, pos in zip(starts, ends, streams, positions):
            row = pos * ROW_WIDTH
            issued = ints[row + _START] + ints[row + _DURATION] - anchor_ns  # L_i: CPU start + CPU time
            began = round(anchor.elapsed_time(start) * _NS_PER_MS)
            duration = round(start.elapsed_time(end) * _NS_PER_MS)
            ended = began + duration
            key = (stream.device_index, stream.stream_id)
            work_from = max(began, issued, previous_end.get(key, began))
            previous_end[key] = ended
            durations.append(duration)
            busies.append(min(duration, max(0, ended - work_from)))
        return zip(durations, busies)


def busy_time(began, ended, issued, previous_end=None):
    """(duration_ns, busy_ns) of an op whose events fired at `began` and `ended`, issued by the CPU at `issued`.

    busy = ended - max(began, previous_end, issued), within 0..duration (all ns on one clock)."""
    duration = ended - began
    work_from = max(began, issued) if previous_end is None else max(began, issued, previous_end)
    return duration, min(duration, max(0, ended - work_from))
