"""Perfetto's native protobuf trace format for `optrace export TRACE -o OUT.pftrace`.

For traces too large for JSON: the same processes, tracks, slices and counters as
reports.output.export writes in JSON, as TracePackets written one at a time with the
`perfetto` package's StreamingTraceProtoBuilder (an optional extra:
`pip install optrace[perfetto]`). Timestamps are ns after the earliest op; an op is a
SLICE_BEGIN / SLICE_END pair on its phase's track, its args are debug annotations. Each
caveat of a rank's metadata (the JSON's otherData "caveats") is an instant event at 0 on
the rank's process track, named "optrace caveat: CODE", its message an annotation.

What Perfetto's trace processor needs, and tests.reports.output.test_export checks packet by packet:
every track an event names has its TrackDescriptor written before the event (a process
track per rank, a thread track per phase, a counter track per counter value, the last
with its CounterDescriptor: without one, trace processor drops the track's counter events
as `track_event_counter_invalid_track_uuid`); every SLICE_BEGIN has its SLICE_END on the
same track, nested; the one packet sequence starts with SEQ_INCREMENTAL_STATE_CLEARED and
no packet uses interned data.
"""

import json

from reports.errors import ReportError

try:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import CounterDescriptor, TracePacket, TrackEvent
    from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
except ImportError:  # the optional extra is not installed
    StreamingTraceProtoBuilder = None

__all__ = ["ProtoEvents"]

SEQUENCE_ID = 1  # every packet comes from one writer
_UUID_STRIDE = 1000  # track uuids: rank * stride + a small number per track


class ProtoEvents:
    """The event sink of reports.export for .pftrace files (same methods as reports.output.export_events.JsonEvents)."""

    suffix = ".pftrace"

    def __init__(self, file, text):
        if StreamingTraceProtoBuilder is None:
            raise ReportError(
                "export: .pftrace needs the perfetto package, which is not installed: "
                "pip install optrace[perfetto] (or write .json)"
            )
        self._builder = StreamingTraceProtoBuilder(file)
        self._counters = {}  # (pid, counter name, value name) -> track uuid
        self._first = True
        self._caveats = {}  # rank (as text) -> [{code, message}]: otherData's, written on each rank's process track

    def _packet(self, ts=None):
        packet = self._builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if self._first:  # the sequence starts with no incremental state
            packet.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self._first = False
        if ts is not None:
            packet.timestamp = max(0, int(ts))
        return packet

    def start(self, other):
        self._caveats = other.get("caveats") or {}

    def process(self, pid, label, tracks):
        packet = self._packet()
        packet.track_descriptor.uuid = _process_uuid(pid)
        packet.track_descriptor.process.pid = pid + 1  # pid 0 means "none" to Perfetto
        packet.track_descriptor.process.process_name = label
        self._builder.write_packet(packet)
        for tid, name in tracks:
            packet = self._packet()
            packet.track_descriptor.uuid = _thread_uuid(pid, tid)
            packet.track_descriptor.parent_uuid = _process_uuid(pid)
            packet.track_descriptor.thread.pid = pid + 1
            packet.track_descriptor.thread.tid = (pid + 1) * _UUID_STRIDE + tid
            packet.track_descriptor.thread.thread_name = name
            self._builder.write_packet(packet)
        for caveat in self._caveats.get(str(pid), ()):  # an instant event at 0 on the rank's track, its message an arg
            packet = self._packet(0)
            packet.track_event.type = TrackEvent.TYPE_INSTANT
            packet.track_event.track_uuid = _process_uuid(pid)
            packet.track_event.name = f"optrace caveat: {caveat['code']}"
            note = packet.track_event.debug_annotations.add()
            note.name, note.string_value = "message", caveat["message"]
            self._builder.write_packet(packet)

    def _slice(self, kind, pid, tid, ts, name=None, category=None):
        packet = self._packet(ts)
        event = packet.track_event
        event.type = kind
        event.track_uuid = _thread_uuid(pid, tid)
        if name is not None:
            event.name = name
            event.categories.append(category)
        return packet

    def begin(self, pid, tid, ts, name):
        self._builder.write_packet(self._slice(TrackEvent.TYPE_SLICE_BEGIN, pid, tid, ts, name, "module"))

    def end(self, pid, tid, ts, name=None):  # Perfetto matches an end to its track's open slice: no name needed
        self._builder.write_packet(self._slice(TrackEvent.TYPE_SLICE_END, pid, tid, ts))

    def op(self, pid, tid, ts, dur, name, args):
        packet = self._slice(TrackEvent.TYPE_SLICE_BEGIN, pid, tid, ts, name, "op")
        for key, value in json.loads("{" + args + "}").items():
            note = packet.track_event.debug_annotations.add()
            note.name = key
            if isinstance(value, int):
                note.int_value = value
            elif isinstance(value, str):
                note.string_value = value
            else:  # shapes, dtypes, storage ids: their JSON text
                note.string_value = json.dumps(value, separators=(",", ":"))
        self._builder.write_packet(packet)
        self.end(pid, tid, ts + dur)

    def counter(self, pid, ts, name, values):
        for key, value in values.items():
            uuid = self._counters.get((pid, name, key))
            if uuid is None:
                uuid = self._counters[(pid, name, key)] = _process_uuid(pid) + 100 + len(self._counters)
                packet = self._packet()
                packet.track_descriptor.uuid = uuid
                packet.track_descriptor.parent_uuid = _process_uuid(pid)
                packet.track_descriptor.name = name if len(values) == 1 else f"{name}: {key}"
                counter = packet.track_descriptor.counter  # a counter track: every counter gets its descriptor
                if name == "cumulative FLOPs":
                    counter.unit_name = "FLOPs"
                else:
                    counter.unit = CounterDescriptor.UNIT_SIZE_BYTES
                self._builder.write_packet(packet)
            packet = self._packet(ts)
            packet.track_event.type = TrackEvent.TYPE_COUNTER
            packet.track_event.track_uuid = uuid
            if -(2**63) <= value < 2**63:
                packet.track_event.counter_value = value
            else:  # cumulative FLOPs past int64 (a 405B-sized step): the int64 field cannot hold it
                packet.track_event.double_counter_value = float(value)
            self._builder.write_packet(packet)

    def finish(self):
        pass


def _process_uuid(pid):
    return (pid + 1) * _UUID_STRIDE * 1000


def _thread_uuid(pid, tid):
    return _process_uuid(pid) + tid
