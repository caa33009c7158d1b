"""Exports as viewers read them: every .pftrace event on a described track (the checks Perfetto's trace
processor makes), every Chrome JSON B closed by a named E on its track, and parameter bytes of every dtype."""

import json

import pytest
import torch

import reports
from reports.memory.lifetimes import DTYPE_BYTES, dtype_sizes
from reports.output.export import export_trace
from tracer import Tracer, read_metadata


def _replay_tracks(packets, TracePacket, TrackEvent):
    """Check the packets as trace processor imports them; returns ({uuid: descriptor}, {uuid: counter values}, slices)."""
    assert packets[0].sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert {p.trusted_packet_sequence_id for p in packets} == {1}
    described, counters, stacks, slices = {}, {}, {}, []
    for p in packets:
        assert not p.HasField("interned_data")  # nothing relies on incremental state
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in described  # one descriptor per track
            assert not d.parent_uuid or d.parent_uuid in described  # parents first
            described[d.uuid] = d
            continue
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        track = described.get(e.track_uuid)
        assert track is not None, f"event on track {e.track_uuid} before its descriptor"
        if e.type == TrackEvent.TYPE_COUNTER:
            assert track.HasField("counter"), f"counter event on {track.name!r}, which has no CounterDescriptor"
            counters.setdefault(e.track_uuid, []).append(e.counter_value)
        elif e.type == TrackEvent.TYPE_SLICE_BEGIN:
            assert not track.HasField("counter") and e.name
            stacks.setdefault(e.track_uuid, []).append((e.name, p.timestamp))
        elif e.type == TrackEvent.TYPE_SLICE_END:
            assert not track.HasField("counter")
            name, begin = stacks[e.track_uuid].pop()  # an end with no open slice raises here
            assert p.timestamp >= begin
            slices.append((e.track_uuid, name))
        else:
            raise AssertionError(f"unexpected event type {e.type}")
    assert not any(stacks.values())  # every slice ended
    return described, counters, slices


def test_pftrace_every_event_on_a_described_track(traced, tmp_path):
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

    out = tmp_path / "net.pftrace"
    export_trace(traced, out)
    packets = list(Trace.FromString(out.read_bytes()).packet)
    described, counters, slices = _replay_tracks(packets, TracePacket, TrackEvent)
    df = reports.load(traced)
    by_name = {described[u].name: v for u, v in counters.items()}
    flops = by_name["cumulative FLOPs"]
    assert len(flops) == int((df["flops"] != 0).sum()) and flops[-1] == df["flops"].sum()  # every op with FLOPs
    assert described[next(u for u in counters if described[u].name == "cumulative FLOPs")].counter.unit_name == "FLOPs"
    live = df["live_bytes"][df["live_bytes"].ne(df["live_bytes"].shift())].tolist()
    assert by_name["live bytes"] == live
    assert {"memory by category: parameters", "memory by category: gradients"} <= set(by_name)
    ops = [p for p in packets if p.HasField("track_event") and "op" in p.track_event.categories]
    modules = [p for p in packets if p.HasField("track_event") and "module" in p.track_event.categories]
    assert len(ops) == len(df) and len(slices) == len(ops) + len(modules)  # every op and module slice ended
    threads = {u for u, d in described.items() if d.HasField("thread")}
    assert {u for u, _ in slices} <= threads  # slices only on the phase tracks


def _check_begin_end(events):
    """Every B has an E with its name on its track, nested, in time order; ops (X) lie inside their module's slice."""
    stacks, closed = {}, 0
    for e in sorted((e for e in events if e["ph"] in "BEX"), key=lambda e: e["ts"]):  # stable: file order at ties
        key = (e["pid"], e["tid"])
        if e["ph"] == "B":
            stacks.setdefault(key, []).append(e)
        elif e["ph"] == "E":
            opened = stacks[key].pop()
            assert e["name"] == opened["name"] and e["cat"] == opened["cat"] == "module"
            assert e["ts"] >= opened["ts"]
            closed += 1
        else:
            open_names = [b["name"] for b in stacks.get(key, [])]
            assert open_names[-1:] == ([e["args"]["module"]] if e["args"]["module"] else [])
    assert not any(stacks.values())
    return closed


def test_json_end_events_named_and_nested(traced, tmp_path):
    out = tmp_path / "net.json"
    export_trace(traced, out)
    events = json.loads(out.read_text())["traceEvents"]
    ends = [e for e in events if e["ph"] == "E"]
    assert ends and all("name" in e for e in ends)
    assert _check_begin_end(events) == len(ends) == sum(e["ph"] == "B" for e in events)


class Quantised(torch.nn.Module):
    """Parameters of kinds the first dtype table lacked, beside a float32 weight."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8, 32))
        self.f8 = torch.nn.Parameter(torch.zeros(64, 32, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.u32 = torch.nn.Parameter(torch.zeros(16, 32, dtype=torch.uint32), requires_grad=False)

    def forward(self, x):
        return (x @ self.w.t()).sum()


def test_float8_and_uint32_parameter_bytes(tmp_path):
    path = tmp_path / "q.parquet"
    model = Quantised()
    with Tracer(path, model=model):
        model(torch.ones(2, 32)).backward()
    meta = read_metadata(path)
    assert meta["dtype_bytes"] == {"float32": 4, "float8_e4m3fn": 1, "uint32": 4}  # torch's dtype.itemsize
    out = tmp_path / "q.json"
    export_trace(path, out)
    split = [e["args"] for e in json.loads(out.read_text())["traceEvents"] if e.get("name") == "memory by category"]
    # 8 * 32 * 4 (float32) + 64 * 32 * 1 (float8_e4m3fn) + 16 * 32 * 4 (uint32) = 1024 + 2048 + 2048 = 5120
    assert split[0]["parameters"] == 5120
    assert reports.storages(reports.load(path)).query("category == 'parameters'")["nbytes"].sum() == 5120


def test_dtype_sizes_from_the_trace_over_the_table():
    assert dtype_sizes({}) is DTYPE_BYTES  # v1/v2 traces: the table
    sizes = dtype_sizes({"dtype_bytes": {"float8_e5m2": 1, "new_kind": 3}})
    assert sizes["new_kind"] == 3 and sizes["uint64"] == 8
    for dtype in (
        torch.float8_e4m3fnuz,
        torch.float8_e5m2fnuz,
        torch.float8_e8m0fnu,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.complex32,
        torch.bits16,
        torch.int4,
        torch.uint4,
    ):
        assert DTYPE_BYTES[str(dtype).removeprefix("torch.")] == dtype.itemsize
    named = {str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)}
    assert named <= set(DTYPE_BYTES)  # every dtype of this torch
