"""Schema v4: the packed row is tied to ROW_FIELDS, the v2, v3 and v4 columns hold what they say, older traces still load,
and docs/schema.md names every column and run-metadata key."""

import json
import time

import pyarrow.parquet as pq
import pytest
import torch

import reports
from tests import helpers
from tracer import Tracer
from tracer.schema import (
    COLUMN_NAMES,
    GRAD_MODES,
    INT64_MAX,
    METADATA_KEY,
    NO_VALUE,
    PHASES,
    SCHEMA_VERSION,
    V2_DEFAULTS,
    V3_DEFAULTS,
    V4_DEFAULTS,
    GradMode,
    Phase,
    part_paths,
    read_part,
)
from tracer.store.writer import FIELD, ROW_FIELDS, ROW_WIDTH, RowBuffer


def test_phase_constants_are_the_phase_dictionary():
    assert PHASES == ("forward", "backward", "optimizer", "other")
    assert [PHASES[p] for p in Phase] == list(PHASES)


def test_recorded_row_matches_row_fields(tmp_path, monkeypatch):
    """Capture the packed integers of one mm and read each back by its ROW_FIELDS name."""
    captured = []
    flush = Tracer._flush

    def spy(self):
        captured.append(self._rows.ints.tolist())
        flush(self)

    monkeypatch.setattr(Tracer, "_flush", spy)
    a, b = torch.ones(4, 8), torch.ones(8, 2)
    with Tracer(tmp_path / "t"):
        a @ b
    (ints,) = captured
    assert len(ints) == ROW_WIDTH == len(ROW_FIELDS)
    row = dict(zip(ROW_FIELDS, ints))
    assert row["flops"] == 2 * 4 * 8 * 2  # 2 * 4 * 8 * 2 = 128
    assert row["inputs"] == 2 and row["outputs"] == 1 and row["freed"] == 0
    # outside any module and building no autograd graph: not forward work (README: Steps, phases and modules)
    assert row["phase"] == Phase.OTHER and row["recompute"] == 0
    assert row["bytes_allocated"] == 4 * 2 * 4  # a 4 x 2 float32 output: 32 bytes
    assert row["duration_ns"] >= 0 and row["start"] > 0
    assert FIELD["start"] == ROW_FIELDS.index("start")
    assert row["bound"] == 0 and row["groups"] == NO_VALUE  # a count, no group sizes
    assert row["grad_mode"] == GradMode.GRAD and ROW_FIELDS[-1] == "grad_mode"


def test_v2_columns(tmp_path):
    a = torch.ones(4, 8)
    before = time.time_ns()
    with Tracer(tmp_path / "t"):
        y = a @ torch.ones(8, 2)  # ones, then mm
        y.t()  # a view of y
    after = time.time_ns()
    df = reports.load(tmp_path / "t")
    assert list(df["op"]) == ["aten.ones.default", "aten.mm.default", "aten.t.default"]
    # every output's whole storage: 8 x 2 x 4 = 64, 4 x 2 x 4 = 32, and the view shares mm's 32
    assert [list(x) for x in df["output_storage_bytes"]] == [[64], [32], [32]]
    assert df["start_ns"].is_monotonic_increasing
    assert before <= df["start_ns"].min() and df["start_ns"].max() <= after
    assert (df["busy_ns"] == df["duration_ns"]).all()  # on the CPU, no idle gap is removed
    assert not df["recompute"].any()
    assert set(df["layout"]) == {""} and set(df["process_group"]) == {""}
    assert df["comm_bytes"].isna().all() and df["group_size"].isna().all()


def _older(tmp_path, version, dropped):
    """The trace at tmp_path/t rewritten as schema `version`, without the columns `dropped`."""
    old = tmp_path / f"v{version}"
    old.mkdir()
    for part in part_paths(tmp_path / "t"):
        table = read_part(part)
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        meta["schema_version"] = version
        table = table.drop_columns(list(dropped)).replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
        pq.write_table(table, old / part.rsplit("/", 1)[1])
    return old


def test_v1_trace_loads_with_v2_defaults(tmp_path):
    """A v1 trace (made here by dropping the v2 and v3 columns and version) loads with every column."""
    with Tracer(tmp_path / "t"):
        torch.ones(4, 8) @ torch.ones(8, 2)
    v1 = _older(tmp_path, 1, [*V2_DEFAULTS, *V3_DEFAULTS, *V4_DEFAULTS])
    df = reports.load(v1)
    assert not df["flops_bound"].any() and df["group_sizes"].isna().all() and df["grad_mode"].isna().all()
    assert tuple(c for c in df.columns if c != "run") == COLUMN_NAMES
    assert (df["busy_ns"] == df["duration_ns"]).all()
    assert not df["recompute"].any() and set(df["layout"]) == {""}
    assert df["start_ns"].isna().all() and df["comm_bytes"].isna().all()
    assert df["flops"].tolist() == [0, 0, 128]  # two ones, then 2 * 4 * 8 * 2 = 128
    only = reports.load(v1, columns=["op", "busy_ns"])
    assert list(only.columns) == ["run", "op", "busy_ns"]


def test_rowbuffer_rollback_drops_half_a_row():
    rows = RowBuffer()
    rows.ints.extend([0] * ROW_WIDTH)
    rows.ints[FIELD["inputs"]] = 1
    rows.in_tensors.extend((2, 0, 0, 64))  # a [4, 4] input with strides (4, 1)
    rows.in_sizes.extend((4, 4))
    rows.in_strides.extend((4, 1))
    rows.in_tensors.extend((1, 0, 1, 8))  # a second row's tensors, appended before its ints
    rows.in_sizes.extend((2,))
    rows.in_strides.extend((1,))
    rows.out_tensors.extend((0, 0, 2, 4))
    rows.rollback()
    assert (list(rows.in_tensors), list(rows.in_sizes), list(rows.in_strides)) == ([2, 0, 0, 64], [4, 4], [4, 1])
    assert list(rows.out_tensors) == [] and list(rows.out_sizes) == [] and list(rows.out_strides) == []


@pytest.mark.parametrize("lists", ["objects", "arrow"])
def test_v2_trace_loads_with_v3_defaults(tmp_path, lists):
    """A v2 trace (made here by dropping the v3 columns) reads flops_bound False, group_sizes null."""
    with Tracer(tmp_path / "t"):
        torch.ones(4, 8) @ torch.ones(8, 2)
    df = reports.load(_older(tmp_path, 2, {**V3_DEFAULTS, **V4_DEFAULTS}), lists=lists)
    assert tuple(c for c in df.columns if c != "run") == COLUMN_NAMES
    assert df["flops_bound"].tolist() == [False, False, False]
    assert df["group_sizes"].isna().all()
    assert df["flops"].tolist() == [0, 0, 128]  # two ones, then 2 * 4 * 8 * 2 = 128
    only = reports.load(tmp_path / "v2", columns=["op", "group_sizes"])
    assert list(only.columns) == ["run", "op", "group_sizes"]


def test_rowbuffer_rollback_drops_half_a_row_of_group_sizes():
    rows = RowBuffer()
    rows.ints.extend([0] * ROW_WIDTH)
    rows.ints[FIELD["groups"]] = 2
    rows.groups.extend((5, 7))
    rows.groups.extend((1, 1, 1))  # a second row's group sizes, appended before its ints
    rows.rollback()
    assert list(rows.groups) == [5, 7]


def test_a_formula_past_int64_is_clamped_and_flagged(tmp_path):
    """A Python-int count above 2**63 - 1 cannot go into the int64 column: it is stored as
    INT64_MAX with flops_bound true, and the op runs as untraced."""
    from tracer.flops.formulas import _registry

    op = torch.ops.aten.dot
    saved = _registry[op]
    _registry[op] = (lambda *a, **k: 2**70, "matmul")  # rules are made per trace: this one sees it
    try:
        with Tracer(tmp_path / "t"):
            out = torch.dot(torch.ones(3), torch.ones(3))
    finally:
        _registry[op] = saved
    assert out.item() == 3.0
    df = reports.load(tmp_path / "t")
    r = df[df["op"] == "aten.dot.default"].iloc[0]
    assert r["flops"] == INT64_MAX == 9223372036854775807 and bool(r["flops_bound"])
    assert df.attrs["runs"]["t"]["record_errors"] == 0


def test_group_sizes_of_grouped_rows_and_null_elsewhere(tmp_path):
    a, b = torch.ones(16, 8), torch.ones(3, 8, 8)
    offs = torch.tensor([3, 3, 16], dtype=torch.int32)
    with Tracer(tmp_path / "t"):
        torch._grouped_mm(a, b, offs=offs)
        a @ torch.ones(8, 8)
    df = reports.load(tmp_path / "t").set_index("op")
    assert list(df.loc["aten._grouped_mm.default", "group_sizes"]) == [3, 0, 13]
    assert df.loc["aten.mm.default", "group_sizes"] is None
    assert not df["flops_bound"].any()


_DOC = helpers.ROOT / "docs" / "schema.md"


def _doc_table(heading):
    """{name: its row's cells} of the first table under `## heading` in docs/schema.md (a row naming several, one each)."""
    section = _DOC.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    table = section[section.index("\n|") :].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {
        n.strip("` "): [c.strip() for c in line.split("|")[2:-1]]
        for line in rows
        for n in line.split("|")[1].split(",")
    }


def test_the_schema_page_names_every_column_and_no_other():
    columns = _doc_table("Columns")
    assert set(columns) == set(COLUMN_NAMES)
    assert f"# Trace schema v{SCHEMA_VERSION}" in _DOC.read_text()
    assert "(v4)" in columns["grad_mode"][-1]  # the version that added it, in its fill cell
    readme = (_DOC.parents[1] / "README.md").read_text()
    assert "](docs/schema.md)" in readme and "| `seq` |" not in readme  # a link, not a second table


def test_the_schema_page_lists_every_run_metadata_key(tmp_path):
    """Every key the run metadata of a traced training step holds has a row under Run metadata."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(tmp_path / "t", model=model, tokens=2) as tr:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    tr.set_step_time({"median_s": 0.5, "times_s": [0.5], "warmup": 0})
    from tracer import read_metadata

    keys = set(read_metadata(tmp_path / "t"))
    listed = set(_doc_table("Run metadata"))
    assert "step_time" in keys and keys - listed == set()


def test_grad_mode_is_the_mode_each_op_ran_in(tmp_path):
    """The grad_mode column: grad for a training forward, no_grad for its backward and an evaluation, inference_mode
    for one under torch.inference_mode (written by the compiled hook here, by the Python path in tests/tracer/native/test_collector.py)."""
    assert GRAD_MODES == ("grad", "no_grad", "inference_mode") and [GRAD_MODES[g] for g in GradMode] == list(GRAD_MODES)
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with Tracer(tmp_path / "t", model=model):
        model(x).sum().backward()
        with torch.no_grad():
            model(x)
        with torch.inference_mode():
            model(x)
    df = reports.load(tmp_path / "t")
    got = list(zip(df["phase"].astype(str), df["op"].astype(str), df["grad_mode"].astype(str)))
    assert got[:4] == [
        ("forward", "aten.t.default", "grad"),
        ("forward", "aten.addmm.default", "grad"),
        ("forward", "aten.sum.default", "grad"),
        ("forward", "aten.ones_like.default", "grad"),
    ]
    assert {mode for phase, _, mode in got if phase == "backward"} == {"no_grad"}
    # the evaluation: t and addmm under no_grad; linear whole under inference_mode (never decomposed there)
    assert got[-3:] == [
        ("forward", "aten.t.default", "no_grad"),
        ("forward", "aten.addmm.default", "no_grad"),
        ("forward", "aten.linear.default", "inference_mode"),
    ]


def test_a_grad_mode_the_tracer_never_writes_is_refused(tmp_path):
    import pyarrow as pa

    with Tracer(tmp_path / "t"):
        torch.ones(2) + 1
    bad = tmp_path / "bad"
    bad.mkdir()
    (part,) = part_paths(tmp_path / "t")
    table = read_part(part)
    at = table.schema.get_field_index("grad_mode")
    table = table.set_column(at, "grad_mode", pa.array(["train"] * table.num_rows).dictionary_encode())
    pq.write_table(table, bad / "part-000000.parquet")
    from reports.sql.engine import Trace

    for read in (reports.load, Trace):  # the SQL engine says it in reports.load's words
        with pytest.raises(
            reports.ReportError,
            match=r"column 'grad_mode' holds 'train' at seq 0; expected one of "
            r"grad, no_grad, inference_mode",
        ):
            read(bad)


def test_a_marker_this_process_wrote_is_read_without_parsing_its_footer(monkeypatch):
    """tracer.schema.marker_json finds the text of a marker built by marker_file between the bytes around it (the
    tracer reads its marker at entry and at close); other bytes are parsed as Parquet, as before."""
    import pyarrow as pa

    from tracer.schema import MARKER_KEY, marker_file, marker_json
    from tracer.store.directory import MARKER_BYTES, _padded

    text = _padded({"format": "optrace", "trace_id": "ab" * 16, "rows": 7})
    raw = marker_file(text)
    assert pq.read_metadata(pa.BufferReader(raw)).metadata[MARKER_KEY] == text.encode()
    assert len(text) == MARKER_BYTES  # padded: 4,096 bytes of JSON and spaces
    parsed = []
    monkeypatch.setattr(pq, "read_metadata", lambda source: parsed.append(source) or pq.FileMetaData())
    assert marker_json(raw) == text.encode() and parsed == []
    damaged = raw[:-12] + b"\0" + raw[-11:]  # a byte of the footer changed: not the bytes marker_file builds
    assert marker_json(damaged) is None and len(parsed) == 1  # parsed (FileMetaData() holds no marker key)


@pytest.mark.parametrize("engine", ["pandas", "sql"])
def test_a_v1_trace_gets_its_report(tmp_path, capsys, engine):
    """`optrace report` of a v1 trace (no output_storage_bytes: its storages sized by bytes_allocated) prints the
    memory of the same trace written as v4 (a null list of output_storage_bytes raised ArrowInvalid in the memory
    scan, reports.memory.row_scan.Scan.feed)."""
    from reports.output.cli import main

    with Tracer(tmp_path / "t"):
        a = torch.ones(4, 8)
        a @ torch.ones(8, 2)
    v1 = _older(tmp_path, 1, [*V2_DEFAULTS, *V3_DEFAULTS, *V4_DEFAULTS])
    figures = []
    for path in (v1, tmp_path / "t"):
        assert main(["report", str(path), "--engine", engine, "--json"]) == 0
        figures.append(json.loads(capsys.readouterr().out)["memory"])
    # 4 * 8 * 4 + 8 * 2 * 4 + 4 * 2 * 4 = 128 + 64 + 32 = 224 bytes, all made in the trace and alive at its end
    assert figures[0] == figures[1]
    assert figures[0]["peak"]["peak_live_bytes"] == 224 and figures[0]["categories"]["temporaries"] == 224
