"""Op timing: perf_counter on CPU, CUDA events (through a mocked torch.cuda), sync and off."""

import sys

import pytest
import torch

import reports
from tracer import TraceError, Tracer, read_metadata
from tracer.recording import timing as timing_mod
from tracer.recording.timing import EventTimer, busy_time, make_timer
from tracer.schema import NO_VALUE
from tracer.store.writer import FIELD, ROW_WIDTH, RowBuffer


class FakeClock:
    """The fake GPU's clock (ns) and the CPU's perf_counter_ns, both scripted by the test."""

    def __init__(self):
        self.cpu = 1_000_000
        self.gpu = {}  # event -> when it fires, decided by the test's `fire`
        self.fire = lambda event, stream: self.cpu  # an idle GPU: an event fires when recorded


class FakeStream:
    def __init__(self, stream_id):
        self.stream_id = stream_id
        self.device_index = 0


class FakeCuda:
    """The parts of torch.cuda the event timer uses: Event, current_stream, synchronize."""

    def __init__(self, clock):
        self.clock = clock
        self.stream = FakeStream(1)
        self.events_made = 0
        self.syncs = 0
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                cuda.events_made += 1
                self.t = None

            def record(self, stream):
                self.t = cuda.clock.fire(self, stream)

            def elapsed_time(self, other):  # ms, like torch.cuda.Event
                assert self.t is not None and other.t is not None
                return (other.t - self.t) / 1e6

        self.Event = Event

    def current_stream(self, device=None):
        return self.stream

    def synchronize(self, device=None):
        self.syncs += 1


def test_busy_time_literal_cases():
    # compute-bound: the CPU issued the op at 100, long before the GPU reached it (s = e_prev = 5000)
    assert busy_time(5000, 8000, 100, 5000) == (3000, 3000)
    # launch-bound: s fires at once (1000), the CPU finishes issuing at 1700, the kernel ends at 1900:
    # raw 1900 - 1000 = 900, busy 1900 - max(1000, 1700) = 200
    assert busy_time(1000, 1900, 1700, 600) == (900, 200)
    # the idle gap before the op on its stream: e_prev 1500 after s 1000 -> 1900 - 1500 = 400
    assert busy_time(1000, 1900, 0, 1500) == (900, 400)
    # an op that finished before the CPU returned (it synchronised inside): busy 0, never negative
    assert busy_time(1000, 1200, 5000) == (200, 0)


def _patched(monkeypatch):
    clock = FakeClock()
    cuda = FakeCuda(clock)

    def perf():
        clock.cpu += 1000  # every perf_counter_ns call advances the CPU by 1 us
        return clock.cpu

    monkeypatch.setattr(timing_mod, "_perf_ns", perf)
    return clock, cuda


def _run_op(timer, rows):
    """What the dispatch hook and _record do for one op, on a bare RowBuffer."""
    start = timer.start()
    duration = timer.stop(start)
    row = len(rows) * ROW_WIDTH
    rows.ints.extend([0] * ROW_WIDTH)
    rows.ints[row + FIELD["start"]] = start
    rows.ints[row + FIELD["duration_ns"]] = rows.ints[row + FIELD["busy_ns"]] = duration
    timer.bind(rows)


def test_event_timer_patches_rows_with_one_synchronise(monkeypatch):
    clock, cuda = _patched(monkeypatch)
    timer = EventTimer(torch.device("cuda", 0), cuda=cuda)
    assert cuda.syncs == 1  # the anchor is set on an idle device
    # From now on the GPU is far behind the CPU, running 10 us kernels back to back: each
    # start event fires when the previous op's end event did, each end event 10 us later.
    gpu = {"free": clock.cpu + 50_000, "records": 0}

    def fire(event, stream):
        gpu["records"] += 1
        if gpu["records"] % 2 == 0:  # an end event
            gpu["free"] += 10_000
        return gpu["free"]

    clock.fire = fire
    rows = RowBuffer()
    for _ in range(3):
        _run_op(timer, rows)
    clock.fire = lambda event, stream: clock.cpu
    assert timer.resolve(rows) == 0
    assert cuda.syncs == 2  # one more for the whole part
    for i in range(3):  # raw = busy = the 10 us kernel: the CPU issued each op long before it ran
        assert rows.ints[i * ROW_WIDTH + FIELD["duration_ns"]] == 10_000
        assert rows.ints[i * ROW_WIDTH + FIELD["busy_ns"]] == 10_000
    made = cuda.events_made  # 1 anchor (re-recorded as the next anchor) + 3 ops x 2
    assert made == 7
    rows = RowBuffer()
    for _ in range(3):  # the next part reuses the pooled events
        _run_op(timer, rows)
    timer.resolve(rows)
    assert cuda.events_made == made and cuda.syncs == 3


def test_event_timer_removes_the_launch_wait(monkeypatch):
    clock, cuda = _patched(monkeypatch)
    timer = EventTimer(torch.device("cuda", 0), cuda=cuda)
    rows = RowBuffer()
    # An idle GPU: the start event fires when recorded; the end event fires 2 us after the CPU
    # has issued the op (the 2 us kernel). The CPU clock moves 1 us per perf_counter call.
    start = timer.start()  # s fires at the CPU time of the record, then perf_counter -> start
    clock.fire = lambda event, stream: clock.cpu + 1000 + 2000  # e: the call below returns at cpu + 1000
    duration = timer.stop(start)
    clock.fire = lambda event, stream: clock.cpu
    rows.ints.extend([0] * ROW_WIDTH)
    rows.ints[FIELD["start"]] = start
    rows.ints[FIELD["duration_ns"]] = duration
    timer.bind(rows)
    timer.resolve(rows)
    # s fired at start - 1000 (the record came just before perf_counter); e at (start + 1000) + 2000.
    # raw = 4000 ns; issued at start + duration = start + 1000 on the CPU clock; busy = e - issued = 2000
    assert rows.ints[FIELD["duration_ns"]] == 4000
    assert rows.ints[FIELD["busy_ns"]] == 2000


def test_event_timer_failure_keeps_wall_time_and_warns(monkeypatch):
    clock, cuda = _patched(monkeypatch)
    timer = EventTimer(torch.device("cuda", 0), cuda=cuda)
    rows = RowBuffer()
    start = timer.start()
    duration = timer.stop(start)
    rows.ints.extend([0] * ROW_WIDTH)
    rows.ints[FIELD["duration_ns"]] = duration
    timer.bind(rows)

    def broken(device=None):
        raise RuntimeError("device lost")

    cuda.synchronize = broken
    with pytest.warns(UserWarning, match="could not read CUDA event times .*device lost"):
        assert timer.resolve(rows) == 1
    assert timer.failed == 1 and rows.ints[FIELD["duration_ns"]] == duration == 1000


def _trace_with_fake_cuda(monkeypatch, tmp_path, timing, flush_rows=16384):
    clock, cuda = _patched(monkeypatch)
    monkeypatch.setattr(timing_mod, "_is_cuda", lambda device: device is not None)
    monkeypatch.setattr(timing_mod, "EventTimer", lambda device: EventTimer(device, cuda=cuda))
    monkeypatch.setattr(torch.cuda, "synchronize", cuda.synchronize)
    last = {"t": 0}

    def fire(event, stream):
        # An in-order stream: an event fires when recorded (start events, the anchor) or, for end
        # events (recorded by EventTimer.stop), 7 us after it, and never before the one before it.
        wanted = clock.cpu + 7000 if sys._getframe(2).f_code.co_name == "stop" else clock.cpu
        last["t"] = max(wanted, last["t"])
        return last["t"]

    def synchronize(device=None):  # the CPU waits for the GPU
        cuda.syncs += 1
        clock.cpu = max(clock.cpu, last["t"])

    cuda.synchronize = synchronize

    clock.fire = fire
    model = torch.nn.Linear(4, 2)
    x = torch.ones(3, 4)
    with Tracer(tmp_path / "t.parquet", model=model, timing=timing, flush_rows=flush_rows):
        model(x).sum().backward()
    return reports.load(tmp_path / "t.parquet"), cuda


def test_tracer_events_mode_end_to_end(monkeypatch, tmp_path):
    df, cuda = _trace_with_fake_cuda(monkeypatch, tmp_path, "events", flush_rows=4)
    parts = -(-len(df) // 4)
    # one synchronise for the anchor, then one per part written (its rows resolved at once)
    assert cuda.syncs == 1 + parts
    # The CPU clock moves 1 us per perf_counter call, 2 per op: op i starts at c_i = c_0 + 2000 i.
    # First op of a part (the GPU idle after the synchronise): s = c, e = (c + 1000) + 7000 -> raw 8000;
    # the CPU returned at c + 2000 -> busy = c + 8000 - (c + 2000) = 6000.
    # Later ops: the GPU is behind, s_i = e_(i-1) = c_i - 2000 + 8000, e_i = c_i + 8000 -> raw 2000,
    # busy = e_i - max(s_i, c_i + 2000) = 2000: all GPU time.
    first = df["seq"] % 4 == 0
    assert (df.loc[first, "duration_ns"] == 8000).all() and (df.loc[first, "busy_ns"] == 6000).all()
    assert (df.loc[~first, "duration_ns"] == 2000).all() and (df.loc[~first, "busy_ns"] == 2000).all()
    assert first.sum() == parts and len(df) == 13
    assert read_metadata(tmp_path / "t.parquet")["timing"] == {"mode": "events", "unresolved_rows": 0}
    assert cuda.events_made <= 2 * 4 + 2  # a pool: at most one part's events plus the anchor


def test_tracer_sync_mode_synchronises_around_every_op(monkeypatch, tmp_path):
    df, cuda = _trace_with_fake_cuda(monkeypatch, tmp_path, "sync")
    assert cuda.syncs == 2 * len(df)
    assert cuda.events_made == 0
    assert (df["busy_ns"] == df["duration_ns"]).all()
    assert read_metadata(tmp_path / "t.parquet")["timing"]["mode"] == "sync"


def test_off_mode_records_no_time(tmp_path):
    with Tracer(tmp_path / "t.parquet", timing="off"):
        torch.ones(2, 2) + 1
    df = reports.load(tmp_path / "t.parquet")
    assert len(df) == 2 and (df["duration_ns"] == 0).all() and df["busy_ns"].isna().all()
    assert df["start_ns"].notna().all() and df["start_ns"].is_monotonic_increasing
    assert read_metadata(tmp_path / "t.parquet")["timing"]["mode"] == "off"


def test_cpu_uses_wall_clock_whatever_the_mode(tmp_path):
    for mode in ("events", "sync"):
        assert make_timer(mode, torch.device("cpu")).name == "wall"
        with Tracer(tmp_path / f"{mode}.parquet", timing=mode):
            torch.ones(2, 2) + 1
        df = reports.load(tmp_path / f"{mode}.parquet")
        assert (df["duration_ns"] > 0).all() and (df["busy_ns"] == df["duration_ns"]).all()
    assert make_timer("off", torch.device("cpu")).name == "off"
    assert NO_VALUE == -1


@pytest.mark.parametrize("bad", ["event", "", None, 1, "EVENTS"])
def test_bad_timing_mode(tmp_path, bad):
    with pytest.raises(TraceError, match=r"Tracer: timing must be one of 'events', 'sync', 'off', got "):
        Tracer(tmp_path / "t.parquet", timing=bad)
