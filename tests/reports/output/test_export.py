"""optrace export: Chrome trace-event JSON with nested module slices, op slices and counters; bounded memory."""

import json
import os
import shutil
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import reports
from reports.errors import ReportError
from reports.output.cli import main
from reports.output.export import export_chrome, export_trace
from tracer import Tracer
from tracer.schema import ARROW_SCHEMA, METADATA_KEY, SCHEMA_VERSION, V2_DEFAULTS, part_name, part_paths, read_part


def _events(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def _check_nesting(events, df):
    """Replay each track's B/E/X events: every op slice lies inside the module slices of its module's path."""
    stacks = {}
    ops = []
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e["ph"] == "B":
            stacks.setdefault(key, []).append([e["name"], e["ts"], None])
        elif e["ph"] == "E":
            opened = stacks[key].pop()
            assert e["ts"] >= opened[1]
            for op in opened[2] or ():
                assert op["ts"] + op["dur"] <= e["ts"] + 1e-3  # the op ends inside its module slice
        elif e["ph"] == "X":
            stack = stacks.get(key, [])
            module = e["args"]["module"]
            names = [name for name, _, _ in stack]
            assert names[-1:] == ([module] if module else []) or (not module and not names)
            for entry in stack:
                assert entry[1] <= e["ts"]
                entry[2] = (entry[2] or []) + [e]
            ops.append(e)
    assert all(not s for s in stacks.values())  # every module slice was closed
    return ops


def test_export_one_slice_per_op_nested_in_modules(traced, tmp_path):
    out = tmp_path / "net.json"
    assert export_chrome(traced, out) == len(reports.load(traced))
    events = _events(out)
    df = reports.load(traced)
    ops = _check_nesting(events, df)
    assert [e["args"]["seq"] for e in ops] == list(df["seq"])  # one slice per op row, in order
    mm = next(e for e in ops if e["args"]["op"] == "aten.addmm.default")
    assert mm["args"]["Input Dims"] == [[16], [4, 8], [8, 16]] and mm["args"]["Input type"] == ["float32"] * 3
    assert mm["args"]["flops"] == 2 * 4 * 8 * 16  # 1024: [4, 8] @ [8, 16]
    assert mm["args"]["module"] == "block.0"
    begins = {e["name"] for e in events if e["ph"] == "B"}
    assert {"Net", "block", "block.0", "block.1", "head"} <= begins  # the root, then the dotted prefixes
    assert {e["args"]["name"] for e in events if e.get("name") == "thread_name"} >= {"forward", "backward", "optimizer"}
    # slices start at start_ns, relative to the first op
    first = df["start_ns"].iloc[0]
    for e, start in zip(ops, df["start_ns"]):
        assert e["ts"] >= (start - first) / 1000 - 1e-3


def test_export_counters_equal_live_bytes(traced, tmp_path):
    out = tmp_path / "net.json"
    export_chrome(traced, out)
    events = _events(out)
    df = reports.load(traced)
    live = [e["args"]["total"] for e in events if e.get("name") == "live bytes"]
    changes = df["live_bytes"][df["live_bytes"].ne(df["live_bytes"].shift())].tolist()
    assert live == changes  # written each time live_bytes changes, with its value
    split = [e["args"] for e in events if e.get("name") == "memory by category"]
    assert split and all(sum(s.values()) == t for s, t in zip(split, _totals_at(events)))
    params = 8 * 16 + 16 + 16 * 2 + 2  # 178 float32 parameters = 712 bytes
    assert split[0]["parameters"] == 4 * params
    assert max(s["gradients"] for s in split) == 4 * params  # all gradients live at once
    assert max(s["optimizer_state"] for s in split) == 4 * params  # SGD momentum buffers
    flops = [e["args"]["flops"] for e in events if e.get("name") == "cumulative FLOPs"]
    assert flops[-1] == df["flops"].sum() and flops == sorted(flops)


def _totals_at(events):
    """The live bytes total in force at each "memory by category" event."""
    total, out = None, []
    for e in events:
        if e.get("name") == "live bytes":
            total = e["args"]["total"]
        elif e.get("name") == "memory by category":
            out.append(total)
    return out


def test_export_ranks_and_v1_layout(traced, tmp_path):
    multi = tmp_path / "multi"
    for rank in (0, 1):
        shutil.copytree(traced, multi / f"rank={rank}")
    out = tmp_path / "multi.json"
    assert export_chrome(multi, out) == 2 * len(reports.load(traced))
    events = _events(out)
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
    names = [e["args"]["name"] for e in events if e.get("name") == "process_name"]
    assert [n.split(" (")[0] for n in names] == ["rank 0: net", "rank 1: net"]  # then the device's name
    # a v1 trace (no start_ns, no busy_ns): ops laid end to end by duration_ns
    v1 = tmp_path / "v1"
    v1.mkdir()
    for part in part_paths(traced):
        table = read_part(part)
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        meta["schema_version"] = 1
        table = table.drop_columns(list(V2_DEFAULTS)).replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
        pq.write_table(table, v1 / os.path.basename(part))
    export_chrome(v1, tmp_path / "v1.json")
    ops = [e for e in _events(tmp_path / "v1.json") if e["ph"] == "X"]
    durations = reports.load(v1)["duration_ns"].tolist()
    assert ops[0]["ts"] == 0 and ops[1]["ts"] == pytest.approx(durations[0] / 1000, abs=1e-3)
    assert ops[-1]["ts"] == pytest.approx(sum(durations[:-1]) / 1000, abs=1e-2)


def test_export_cli_and_errors(traced, tmp_path, capsys):
    out = tmp_path / "cli.json"
    assert main(["export", str(traced), "-o", str(out)]) == 0
    assert "ops ->" in capsys.readouterr().out and out.exists()
    with pytest.raises(ReportError, match=r"export: the output must end in \.json .*got '.*x\.txt'"):
        export_chrome(traced, tmp_path / "x.txt")
    assert main(["export", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("fails", [False, True])
@pytest.mark.parametrize("out_name", ["out.json", "out.json.gz"])
def test_export_never_writes_or_removes_a_users_file_named_like_its_temporary(
    traced, tmp_path, monkeypatch, fails, out_name
):
    """The export's temporary is `.NAME.<random>.tmp`, created exclusively: a user's `.NAME.tmp` (the name export
    used before), a file or a link to the user's file, is left as it was, whether the export succeeds or fails."""
    users = tmp_path / "users.txt"
    users.write_bytes(b"the user's own\n")
    out = tmp_path / out_name
    (tmp_path / f".{out_name}.tmp").symlink_to(users)  # a link where export wrote before
    own = tmp_path / "sub"
    own.mkdir()
    (own / f".{out_name}.tmp").write_bytes(b"mine too\n")  # a regular file of that name, beside a second output
    if fails:

        def broken(*args):
            raise ReportError("export: a part is damaged")

        monkeypatch.setattr("reports.output.export.check_rows", broken)  # fails after the temporary is open
    for target in (out, own / out_name):
        if fails:
            with pytest.raises(ReportError, match="a part is damaged"):
                export_trace(traced, target)
        else:
            assert export_trace(traced, target) > 0
        assert target.exists() is not fails
    assert users.read_bytes() == b"the user's own\n" and os.readlink(tmp_path / f".{out_name}.tmp") == str(users)
    assert (own / f".{out_name}.tmp").read_bytes() == b"mine too\n"
    expected = [out_name] if not fails else []
    assert sorted(os.listdir(own)) == sorted([f".{out_name}.tmp"] + expected)  # no temporary of the export's left
    assert sorted(os.listdir(tmp_path)) == sorted([f".{out_name}.tmp", "sub", "users.txt"] + expected)


ROWS = 500_000  # 4 parts; the JSON (about 200 MiB) is twice what the export may hold
PART_ROWS = 125_000


def _synthetic_trace(path):
    """A 500,000-row trace written straight as Parquet parts with the schema: each op an add of two
    [4] float32 tensors into a new one, live bytes rising by 16 every 4th op."""
    path.mkdir()
    meta = {
        "schema_version": SCHEMA_VERSION,
        "complete": True,
        "run_name": "synthetic",
        "rows": ROWS,
        "device": {"type": "cpu", "name": "cpu"},
        "root_module": None,
    }
    schema = ARROW_SCHEMA.with_metadata({METADATA_KEY: json.dumps(meta).encode()})
    n = PART_ROWS
    idx = np.arange(n, dtype=np.int64)

    def strs(values, codes):
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values))

    def lists(per_row, values):
        return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * per_row), values)

    shape = lists(1, pa.array([[4]] * n, pa.list_(pa.int64())))
    two_shapes = lists(2, pa.array([[4]] * (2 * n), pa.list_(pa.int64())))
    for p in range(ROWS // n):
        seq = idx + p * n
        columns = {
            "seq": pa.array(seq),
            "step": pa.array(seq // 1000),
            "op": strs(["aten.add.Tensor"], np.zeros(n, np.int32)),
            "phase": strs(["forward", "backward"], ((seq // 500) % 2).astype(np.int32)),
            "module": strs(["", "a", "a.b"], (seq % 3).astype(np.int32)),
            "input_shapes": two_shapes,
            "input_dtypes": lists(2, strs(["float32"], np.zeros(2 * n, np.int32))),
            "input_strides": two_shapes,
            "output_shapes": shape,
            "output_dtypes": lists(1, strs(["float32"], np.zeros(n, np.int32))),
            "output_strides": shape,
            "device": strs(["cpu"], np.zeros(n, np.int32)),
            "input_storage_ids": lists(2, pa.array(np.repeat(seq, 2))),
            "output_storage_ids": lists(1, pa.array(seq + ROWS)),
            "freed_storage_ids": lists(0, pa.array([], pa.int64())),
            "is_view": pa.array(np.zeros(n, bool)),
            "inplace": pa.array(np.zeros(n, bool)),
            "flops": pa.array(np.full(n, 4)),
            "flop_kind": strs(["elementwise"], np.zeros(n, np.int32)),
            "causal": pa.nulls(n, pa.bool_()),
            "bytes_allocated": pa.array(np.full(n, 16)),
            "live_bytes": pa.array(16 * (seq // 4)),
            "bytes_read": pa.array(np.full(n, 32)),
            "bytes_written": pa.array(np.full(n, 16)),
            "duration_ns": pa.array(np.full(n, 1000)),
            "recompute": pa.array(np.zeros(n, bool)),
            "output_storage_bytes": lists(1, pa.array(np.full(n, 16))),
            "start_ns": pa.array(1_700_000_000_000_000_000 + 2000 * seq),
            "busy_ns": pa.array(np.full(n, 1000)),
            "layout": strs([""], np.zeros(n, np.int32)),
            "comm_bytes": pa.nulls(n, pa.int64()),
            "group_size": pa.nulls(n, pa.int64()),
            "process_group": strs([""], np.zeros(n, np.int32)),
            "flops_bound": pa.array(np.zeros(n, bool)),
            "group_sizes": pa.nulls(n, pa.list_(pa.int64())),
            "grad_mode": strs(["grad", "no_grad"], ((seq // 500) % 2).astype(np.int32)),  # the backward's: no_grad
        }
        table = pa.Table.from_arrays([columns[f.name].cast(f.type) for f in ARROW_SCHEMA], schema=schema)
        pq.write_table(table, path / part_name(p), compression="zstd")


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_export_half_a_million_rows_in_bounded_memory(tmp_path):
    trace = tmp_path / "big.parquet"
    _synthetic_trace(trace)
    out = tmp_path / "big.json"
    before = peak = _rss()
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        assert export_chrome(trace, out) == ROWS
    finally:
        done.set()
        sampler.join()
    size = out.stat().st_size
    # the JSON is far larger than what the export may hold: 500,000 op slices of ~400 bytes
    assert size > 150 * 2**20
    assert peak - before < 100 * 2**20, f"RSS grew {(peak - before) / 2**20:.0f} MiB exporting {size / 2**20:.0f} MiB"
    slices, counters = _count_events(out)
    assert slices == ROWS
    assert counters == ROWS // 4  # live bytes changes every 4th op


def _count_events(path):
    """(op slices, live-bytes counters) of a Chrome JSON export, every line checked to be one valid JSON event, read
    16 MiB at a time: each block's events, their ends of line made plain newlines (a string holds no raw newline),
    parsed as JSON lines by pyarrow (the whole syntax of each line checked, only `ph` and `name` kept), in C++
    rather than by json.loads line by line (23 s against 4.6 s for the 200 MiB of the test above)."""
    import io

    import pyarrow.compute as pc
    import pyarrow.json as pj

    options = pj.ParseOptions(
        explicit_schema=pa.schema([("ph", pa.string()), ("name", pa.string())]),
        unexpected_field_behavior="ignore",
        newlines_in_values=False,
    )
    slices = counters = 0
    with open(path, "rb") as f:
        head = f.readline()
        assert head.startswith(b'{"displayTimeUnit":"ns"') and head.endswith(b'"traceEvents":[\n')
        rest = b""
        while block := f.read(1 << 24):
            data = rest + block
            cut = data.rfind(b"\n") + 1
            data, rest = data[:cut], data[cut:]
            if data == b"]}\n" or data.endswith(b"\n]}\n"):  # the closing line: nothing may follow it
                data, rest = data[:-3], b"]}\n" + rest
            events = pj.read_json(io.BytesIO(data.replace(b",\n", b"\n")), parse_options=options)
            assert events.num_rows == data.count(b"\n")  # one event per line
            slices += pc.sum(pc.equal(events["ph"], "X")).as_py() or 0
            counters += pc.sum(pc.equal(events["name"], "live bytes")).as_py() or 0
        assert rest == b"]}\n", rest[-200:]
    return slices, counters


def test_export_pftrace(traced, tmp_path):
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    out = tmp_path / "net.pftrace"
    df = reports.load(traced)
    assert main(["export", str(traced), "-o", str(out)]) == 0
    packets = Trace.FromString(out.read_bytes()).packet  # the streamed packets read back as one Trace
    events = [p for p in packets if p.HasField("track_event")]
    ops = [p for p in events if p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN and "op" in p.track_event.categories]
    assert [p.track_event.name for p in ops][:2] == ["ones", "t"] and len(ops) == len(df)  # one slice per op row
    seqs = [next(a.int_value for a in p.track_event.debug_annotations if a.name == "seq") for p in ops]
    assert seqs == list(df["seq"])
    begins = sum(p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN for p in events)
    assert begins == sum(p.track_event.type == TrackEvent.TYPE_SLICE_END for p in events)  # every slice closed
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in packets if p.HasField("track_descriptor")}
    live = [
        p.track_event.counter_value
        for p in events
        if p.track_event.type == TrackEvent.TYPE_COUNTER and names[p.track_event.track_uuid] == "live bytes"
    ]
    assert live == df["live_bytes"][df["live_bytes"].ne(df["live_bytes"].shift())].tolist()


def test_export_pftrace_without_perfetto(traced, tmp_path, monkeypatch):
    import reports.output.pftrace

    monkeypatch.setattr(reports.output.pftrace, "StreamingTraceProtoBuilder", None)
    with pytest.raises(ReportError, match=r"export: \.pftrace needs the perfetto package, which is not installed"):
        export_trace(traced, tmp_path / "x.pftrace")
    assert not (tmp_path / "x.pftrace").exists()


def test_pftrace_cumulative_flops_past_int64(tmp_path):
    # test_overflow's 405B-shaped matmuls on meta tensors: 400 x 29,273,397,577,908,224 FLOPs; the running
    # total passes int64 at the 316th (316 x 29,273,397,577,908,224 = 9,250,393,634,618,998,784 > 2**63 - 1),
    # which Perfetto's int64 counter_value cannot hold: that value and the later ones go as double_counter_value
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    from reports.output.export import export_trace
    from tests.reports.test_overflow import PER_MATMUL, TOKENS, D, Matmuls

    model = Matmuls()
    with Tracer(tmp_path / "t", model=model, tokens=TOKENS):
        model(torch.empty(TOKENS, D, device="meta"))
    out = tmp_path / "t.pftrace"
    export_trace(tmp_path / "t", out)
    events = [p.track_event for p in Trace.FromString(out.read_bytes()).packet if p.HasField("track_event")]
    values = [
        e.counter_value if e.HasField("counter_value") else e.double_counter_value
        for e in events
        if e.HasField("counter_value") or e.HasField("double_counter_value")
    ]
    flops = [v for v in values if v >= PER_MATMUL]  # the cumulative FLOPs counter (live bytes stay far below)
    assert len(flops) == 400 and flops[314] == 315 * PER_MATMUL  # exact while it fits int64
    assert flops[-1] == float(400 * PER_MATMUL)  # 11,709,359,031,163,289,600, as a double


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_export_refuses_to_write_inside_the_trace(loops, tmp_path, capsys, name):
    # a file left in the trace directory makes the trace unreadable ("not an optrace part ... move it out")
    trace = tmp_path / "copy"
    shutil.copytree(loops[0], trace)
    assert main(["export", str(trace), "-o", str(trace / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"optrace export: error: the output {str(trace / name)!r} is inside the trace {str(trace)!r}, "
        "which holds only the tracer's files: write it elsewhere"
    )
    assert sorted(p.name for p in trace.iterdir()) == sorted(p.name for p in loops[0].iterdir())  # nothing added


def test_export_names_a_bound_and_the_metadata_caveats(tmp_path):
    """A figure that is a bound and what the report's caveats say of the metadata are in the export too: the op's
    `flops_bound` arg and otherData's "caveats" per rank."""
    x = torch.empty(16, 8, dtype=torch.bfloat16, device="meta")
    experts = torch.empty(2, 8, 8, dtype=torch.bfloat16, device="meta")
    offs = torch.empty(2, dtype=torch.int32, device="meta")
    norm = torch.nn.RMSNorm(8, dtype=torch.bfloat16, device="meta")
    with Tracer(tmp_path / "t", model=norm):
        torch._grouped_mm(x, experts, offs=offs)  # meta offsets: every token met once, 2 * 16 * 8 * 8 = 2048, a bound
        norm(x.requires_grad_()).sum().backward()  # on meta: recorded as CUDA's fused kernel
    export_chrome(tmp_path / "t", tmp_path / "t.json")
    written = json.loads((tmp_path / "t.json").read_text())
    ops = [e for e in written["traceEvents"] if e["ph"] == "X"]
    grouped = [e["args"] for e in ops if e["args"]["op"] == "aten._grouped_mm.default"]
    assert [(a["flops"], a.get("flops_bound")) for a in grouped] == [(2048, True)]
    assert all("flops_bound" not in e["args"] for e in ops if e["args"]["op"] != "aten._grouped_mm.default")
    assert [c["code"] for c in written["otherData"]["caveats"]["0"]] == ["fused_standins"]


def test_export_pftrace_names_the_metadata_caveats(tmp_path):
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    from tests.reports.loading.test_damage import rewrite, set_metadata

    with Tracer(tmp_path / "t"):
        torch.ones(2) + 1
    for part in part_paths(tmp_path / "t"):
        rewrite(part, set_metadata(collectives_untimed=2))  # 2 collectives timed to their launch only
    export_trace(tmp_path / "t", tmp_path / "t.json")
    caveats = json.loads((tmp_path / "t.json").read_text())["otherData"]["caveats"]["0"]
    assert [c["code"] for c in caveats] == ["collectives_untimed"] and caveats[0]["message"].startswith("2 collectives")
    export_trace(tmp_path / "t", tmp_path / "t.pftrace")
    assert b"2 collectives timed to their launch only" in (tmp_path / "t.pftrace").read_bytes()
