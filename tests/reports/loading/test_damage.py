"""Damaged and hostile traces in `optrace report`, `compare`, `export` and `reports.load`.

Each case writes the literal damage into a small trace (45 ops of `a + 1` in 9 parts of
5 rows, plus the empty closing part) and checks the literal one-line error, or the
damage line, it must give: never a traceback, never a figure made from the damage.
"""

import json
import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import reports
import tracer
from reports.errors import ReportError
from reports.output.cli import main
from tests.helpers import unwrapped
from tracer import Tracer
from tracer.schema import LEGACY_MARKER_NAME, MARKER_NAME, METADATA_KEY, marker_facts, part_paths, read_part


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("damage") / "t"
    with Tracer(path, flush_rows=5):
        a = torch.zeros(1)
        for _ in range(44):
            a = a + 1
    return path


@pytest.fixture
def trace(template, tmp_path):
    return shutil.copytree(template, tmp_path / "t")


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(capsys, command, path, message, *argv):
    """`optrace command path` exits 2 with one line: the path and `message` (a regex)."""
    rc, out, err = run(capsys, command, path, *argv)
    assert rc == 2 and out == "" and "Traceback" not in err, (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(rf"optrace {command}: error: {re.escape(str(path))}: {message}", lines[0]), lines[0]


def rewrite(part, change):
    """Rewrite one part with `change(table)` (the optrace metadata kept in its schema)."""
    table = change(read_part(part))
    os.remove(part)
    pq.write_table(table, part)


def set_cell(name, row, value):
    """A `change` for rewrite: column `name` holds `value` at `row`."""

    def change(table):
        column = table.column(name)
        values = column.to_pylist()
        values[row] = value
        typ = pa.int64() if isinstance(value, int) and value > 2**62 else column.type
        return table.set_column(table.schema.get_field_index(name), name, pa.array(values, type=typ))

    return change


def set_metadata(**fields):
    def change(table):
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        meta.update(fields)
        return table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})

    return change


def raw_metadata(raw):
    return lambda table: table.replace_schema_metadata({METADATA_KEY: raw})


# ------------------------------------------------------------------ 6. a part twice, or another trace's rows
def test_a_sync_tool_copy_of_a_part_is_refused(trace, capsys):
    shutil.copy(trace / "part-000001.parquet", trace / "part-000001 (1).parquet")
    one_error(
        capsys,
        "report",
        trace,
        r"part-000001 \(1\)\.parquet says it is part 2 like part-000001\.parquet "
        r"\(a copy of a part\?\); move it out",
    )


def test_a_symlinked_copy_of_a_part_is_refused(trace, capsys):
    os.symlink(trace / "part-000001.parquet", trace / "part-000010.parquet")
    one_error(
        capsys,
        "report",
        trace,
        r"part-000010\.parquet says it is part 2 like part-000001\.parquet "
        r"\(a copy of a part\?\); move it out",
    )


def test_a_copy_with_another_part_number_is_refused_by_its_seq(trace, capsys):
    copy = trace / "part-000100.parquet"
    shutil.copy(trace / "part-000001.parquet", copy)
    rewrite(copy, set_metadata(parts=101))  # numbered as a new part: its rows are still seq 5-9
    one_error(
        capsys,
        "report",
        trace,
        r"part-000100\.parquet repeats seq 5 to 9 of part-000001\.parquet "
        r"\(a copy of a part\?\); move it out",
    )


def test_rows_repeated_inside_a_part_are_refused(trace, capsys):
    part = trace / "part-000002.parquet"
    rewrite(part, lambda table: pa.concat_tables([table, table]))  # seq 10-14 twice
    one_error(
        capsys,
        "report",
        trace,
        r"seq 10 follows seq 14; expected seq to increase row by row "
        r"\(a part or rows repeated\?\)",
    )


def test_another_traces_rank_directory_inside_a_flat_trace_is_refused(trace, template, capsys):
    (trace / "rank=0").mkdir()
    shutil.copy(template / "part-000000.parquet", trace / "rank=0" / "part-000000.parquet")  # pyarrow would read it too
    message = r"rank=0 is a rank directory inside a trace with parts of its own \(another trace's rows\?\); move it out"
    one_error(capsys, "report", trace, message)
    one_error(capsys, "export", trace, message, "-o", trace.parent / "out.json")
    with pytest.raises(ReportError, match=message):
        reports.load(trace)


# ------------------------------------------------------------------ 7. paths are literal
def test_paths_with_glob_characters_are_literal(template, tmp_path, capsys):
    shutil.copytree(template, tmp_path / "exp1")
    with Tracer(tmp_path / "exp[1]", run_name="bracketed"):
        torch.ones(2) * 3
    assert tracer.read_metadata(tmp_path / "exp[1]")["run_name"] == "bracketed"  # not exp1's ("exp1")
    assert tracer.read_metadata(tmp_path / "exp1")["run_name"] == "t"
    rc, out, err = run(capsys, "report", tmp_path / "exp[1]", "--json")
    assert rc == 0 and err == "" and json.loads(out)["run"] == "bracketed"
    assert list(reports.load(tmp_path / "exp[1]").attrs["runs"]) == ["bracketed"]
    assert part_paths(tmp_path / "exp*") == []  # no such directory, and never a pattern


# ------------------------------------------------------------------ 8. one line instead of a traceback
@pytest.mark.parametrize("column", ["live_bytes", "flops", "seq", "op", "module", "start_ns", "output_storage_ids"])
def test_a_null_cell_is_one_line(trace, capsys, column):
    rewrite(trace / "part-000000.parquet", set_cell(column, 3, None))
    where = "at row 3" if column == "seq" else "at seq 3"
    typ = {"op": "string", "module": "string", "output_storage_ids": "list<item: int64>"}.get(column, "int64")
    message = rf"column '{column}' is null {{}} \(1 null value\(s\)\); expected {re.escape(typ)} values"
    # found by the SQL engine, named by the reference loader: `report` leaves start_ns in the files (named by part)
    named = r"in part-000000\.parquet" if column == "start_ns" else where
    one_error(capsys, "report", trace, message.format(named))
    one_error(capsys, "export", trace, message.format(where), "-o", trace.parent / "out.json")
    assert not (trace.parent / "out.json").exists()


def test_a_null_storage_id_item_is_one_line(trace, capsys):
    rewrite(trace / "part-000000.parquet", set_cell("input_storage_ids", 3, [None]))
    one_error(
        capsys,
        "export",
        trace,
        r"column 'input_storage_ids' holds a null item at seq 3; expected int64 items",
        "-o",
        trace.parent / "out.json",
    )


@pytest.mark.parametrize("command", ["report", "compare", "export"])
def test_a_wrong_arrow_type_is_one_line(trace, template, capsys, command):
    rewrite(
        trace / "part-000004.parquet",
        lambda t: t.set_column(t.schema.get_field_index("flops"), "flops", t.column("flops").cast(pa.string())),
    )
    message = (
        r"column 'flops' of part-000004\.parquet has type string, expected int64 \(not written by optrace, or damaged\)"
    )
    if command == "compare":
        rc, out, err = run(capsys, "compare", template, trace)
        assert (
            rc == 2
            and out == ""
            and re.fullmatch(rf"optrace compare: error: {re.escape(str(trace))}: {message}\n", err)
        ), err
    else:
        one_error(capsys, command, trace, message, *(["-o", trace.parent / "out.json"] if command == "export" else []))


def test_a_missing_column_is_one_line(trace, capsys):
    for part in part_paths(trace):
        rewrite(part, lambda t: t.drop_columns(["flops"]))
    one_error(capsys, "export", trace, r"trace lacks column\(s\) \['flops'\]", "-o", trace.parent / "out.json")
    one_error(capsys, "report", trace, r"trace lacks column\(s\) \['flops'\]")


def test_a_part_without_a_column_the_others_have_is_one_line(trace, capsys):
    rewrite(trace / "part-000004.parquet", lambda t: t.drop_columns(["live_bytes"]))
    one_error(
        capsys,
        "report",
        trace,
        r"part-000004\.parquet and part-000000\.parquet differ in column\(s\) "
        r"\['live_bytes'\]; expected one schema in every part",
    )


def test_deeply_nested_metadata_is_refused_before_parsing(trace, capsys):
    rewrite(trace / "part-000009.parquet", raw_metadata(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
    one_error(
        capsys,
        "report",
        trace,
        r"optrace metadata nests 100001 levels deep \(part-000009\.parquet\), "
        r"more than the 64 optrace reads",
    )


def legacy_marker(trace, data):
    """The trace's marker as a JSON file holding `data`, as optrace wrote markers before the Parquet one."""
    (trace / MARKER_NAME).unlink()
    (trace / LEGACY_MARKER_NAME).write_bytes(data)


def test_a_deeply_nested_marker_is_refused_before_parsing(trace, capsys):
    legacy_marker(trace, b"[" * 50_000 + b"]" * 50_000)
    one_error(
        capsys,
        "report",
        trace,
        r"the marker nests 50000 levels deep \(_optrace\.json\), more than the 64 optrace reads",
    )


def test_a_huge_marker_is_refused_unread(trace, capsys):
    legacy_marker(trace, b" " * (2 << 20))
    one_error(
        capsys,
        "report",
        trace,
        r"the marker is 1,048,577 bytes \(_optrace\.json\), more than the 1,048,576 optrace reads",
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"storage_roles": {"gradient": 5}},
            r"optrace metadata \(part-000009\.parquet\) storage_roles 'gradient' is 5, "
            r"expected a list of storage ids",
        ),
        ({"device": "cpu"}, r"optrace metadata \(part-000009\.parquet\) 'device' is \"cpu\", expected an object"),
        ({"rows": "many"}, r"optrace metadata \(part-000009\.parquet\) 'rows' is \"many\", expected an int"),
        ({"lost_rows": -3}, r"optrace metadata \(part-000009\.parquet\) 'lost_rows' is -3, expected a count >= 0"),
        (
            {"parameters": {"w": {"storage_id": 2**40, "numel": 2, "shape": [2], "dtype": "float32"}}},
            r"optrace metadata parameter 'w' has storage id 1,099,511,627,776; expected 0 to 1,049,296 "
            r"\(a damaged or hand-edited trace\?\)",
        ),  # 2**20 + 16 * 45 rows = 1,049,296
        (
            {"storage_roles": {"at_entry": [[3, 64, 1]]}},
            r"optrace metadata \(part-000009\.parquet\) storage_roles 'at_entry' is \[\[3, 64, 1\]\], expected a list of "
            r"\[id, bytes\] records of ints >= 0",
        ),
        (
            {"storage_roles": {"resized": [[0, 2**40, 8]]}},
            r"optrace metadata storage_roles 'resized' has storage id 1,099,511,627,776; expected 0 to 1,049,296 "
            r"\(a damaged or hand-edited trace\?\)",
        ),
        # the report's notes read these (a traceback before: int("x"), f"{'x':,}")
        (
            {"untraced_optimizer_steps": "x"},
            r"optrace metadata \(part-000009\.parquet\) 'untraced_optimizer_steps' is \"x\", expected an int",
        ),
        (
            {"cycles_without_step": -1},
            r"optrace metadata \(part-000009\.parquet\) 'cycles_without_step' is -1, "
            r"expected a count >= 0",
        ),
        ({"attention": [1]}, r"optrace metadata \(part-000009\.parquet\) 'attention' is \[1\], expected an object"),
        (
            {"optimizer_state_found_late": 1.5},
            r"optrace metadata \(part-000009\.parquet\) 'optimizer_state_found_late' is 1\.5, expected an int",
        ),
        (
            {"optimizer_params": "many"},
            r"optrace metadata \(part-000009\.parquet\) 'optimizer_params' is \"many\", expected an int",
        ),
        # the entries of parameters and FSDP2's unsharded parameters (a KeyError or TypeError before)
        (
            {"unsharded_parameters": {"w": 1}},
            r"optrace metadata \(part-000009\.parquet\) unsharded parameter 'w' is 1, expected an object",
        ),
        (
            {"parameters": {"w": {"storage_id": 0}}},
            r"optrace metadata \(part-000009\.parquet\) parameter 'w' has no 'numel', 'dtype'",
        ),
        (
            {"unsharded_parameters": {"w": {"storage_id": 2**40, "numel": 4, "dtype": "float32"}}},
            r"optrace metadata unsharded parameter 'w' has storage id 1,099,511,627,776; expected 0 to 1,049,296 "
            r"\(a damaged or hand-edited trace\?\)",
        ),
    ],
    ids=[
        "roles_not_a_list",
        "device_a_string",
        "rows_a_string",
        "negative_count",
        "parameter_id_2_40",
        "at_entry_record_of_three",
        "resized_id_2_40",
        "untraced_steps_a_string",
        "negative_cycles",
        "attention_a_list",
        "late_state_a_float",
        "updated_params_a_string",
        "unsharded_entry_an_int",
        "parameter_without_numel",
        "unsharded_id_2_40",
    ],
)
def test_wrongly_typed_metadata_is_one_line(trace, capsys, fields, message):
    rewrite(trace / "part-000009.parquet", set_metadata(**fields))
    one_error(capsys, "report", trace, message)


def test_a_wrongly_typed_marker_is_one_line(trace, capsys):
    facts = marker_facts(trace)
    legacy_marker(trace, json.dumps(dict(facts, lost_rows="many")).encode())
    one_error(capsys, "report", trace, r"the marker \(_optrace\.json\) 'lost_rows' is \"many\", expected an int")


def test_an_unreadable_directory_is_one_line(trace, capsys, monkeypatch):
    listdir = os.listdir

    def refuse(path="."):
        if os.fspath(path) == str(trace):
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)

    monkeypatch.setattr(os, "listdir", refuse)
    one_error(capsys, "report", trace, r"cannot list the trace directory \(Permission denied\)")
    one_error(
        capsys, "export", trace, r"cannot list the trace directory \(Permission denied\)", "-o", trace.parent / "o.json"
    )


def test_an_unreadable_directory_by_its_mode_is_one_line(trace, capsys):
    os.chmod(trace, 0)
    try:
        if os.access(trace, os.R_OK):
            pytest.skip("this process reads a directory of mode 000 (root)")
        one_error(capsys, "report", trace, r"cannot list the trace directory \(Permission denied\)")
    finally:
        os.chmod(trace, 0o755)


def test_a_storage_id_of_2_40_is_refused_before_any_allocation(trace, capsys):
    rewrite(trace / "part-000000.parquet", set_cell("output_storage_ids", 3, [2**40]))
    message = (
        r"column 'output_storage_ids' holds 1,099,511,627,776 at seq 3; expected storage id 0 to 1,049,296 "
        r"\(a damaged or hand-edited trace\?\)"
    )  # 2**20 + 16 * 45 rows
    one_error(capsys, "report", trace, message)
    one_error(capsys, "export", trace, message, "-o", trace.parent / "out.json")


# ------------------------------------------------------------------ 9. damage is never a figure
@pytest.mark.parametrize(
    "column, value, message",
    [
        ("flops", -5, r"column 'flops' holds -5 at seq 3; expected FLOPs 0 to 1,000,000,000,000,000,000"),
        (
            "flops",
            2**63 - 1,
            r"column 'flops' holds 9,223,372,036,854,775,807 at seq 3; expected FLOPs 0 to "
            r"1,000,000,000,000,000,000",
        ),
        (
            "bytes_allocated",
            -4,
            r"column 'bytes_allocated' holds -4 at seq 3; expected bytes 0 to 1,152,921,504,606,846,976",
        ),
        ("duration_ns", -1, r"column 'duration_ns' holds -1 at seq 3; expected ns >= 0"),
        ("seq", -1, r"column 'seq' holds -1 at seq -1; expected op index >= 0"),
    ],
    ids=["negative_flops", "int64_max_flops", "negative_bytes", "negative_duration", "negative_seq"],
)
def test_impossible_values_are_refused(trace, capsys, column, value, message):
    rewrite(trace / "part-000000.parquet", set_cell(column, 3, value))
    one_error(capsys, "report", trace, message + r" \(a damaged or hand-edited trace\?\)")
    with pytest.raises(ReportError, match=re.escape(str(trace)) + ": " + message):
        reports.load(trace, lists="arrow")


def test_flops_whose_sum_passes_int64_are_totalled_not_refused(trace, capsys):
    for part in ("part-000000.parquet", "part-000001.parquet"):
        rewrite(
            trace / part,
            lambda t: t.set_column(
                t.schema.get_field_index("flops"), "flops", pa.array([10**18] * t.num_rows, pa.int64())
            ),
        )
    # the 10 rows of those two parts hold 10**18 FLOPs each (the most one op may count): 1e19 > 2**63 - 1 = 9.22e18,
    # summed in float64 instead of wrapping
    from reports.steps import phase_steps

    df = reports.load(trace)
    flops = [int(v) for v in df["flops"]]
    assert sum(f == 10**18 for f in flops) == 10 and sum(flops) > 2**63
    phases = df["phase"].astype(str).tolist()
    exact = sum(sum(f for f, q in zip(flops, phases) if q == p) / n for p, n in phase_steps(df).items())
    assert reports.per_step(df) == exact
    assert sum(int(v) for v in reports.by_op(df)["flops"]) == pytest.approx(
        sum(flops), rel=1e-15
    )  # float64 sums: never wrapped
    rc, out, err = run(capsys, "report", trace)
    assert rc == 0, err


# ------------------------------------------------------------------ 10. names cannot drive the terminal
def test_control_characters_in_names_are_escaped(tmp_path, capsys):
    model = torch.nn.Sequential()
    model.add_module("evil\x1b[2J\nforged line", torch.nn.Linear(2, 2))
    path = tmp_path / "t"
    with Tracer(path, model=model, run_name="run\x1b]0;title\x07"):
        model(torch.ones(1, 2))
    rewrite(part_paths(path)[0], set_cell("op", 0, "aten.mm.default\r\x9b31m"))
    rc, out, err = run(capsys, "report", path)
    assert rc == 0 and err == ""
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", out), out  # nothing but newlines
    assert not any(line.startswith("forged line") for line in out.splitlines())
    assert out.splitlines()[0].startswith(r"optrace report: run\x1b]0;title\x07  (")
    assert r"evil\x1b[2J\nforged line" in out
    assert r"aten.mm.default\r\x9b31m" in out
    rc, out, _ = run(capsys, "report", path, "--json")
    assert json.loads(out)["run"] == "run\x1b]0;title\x07"  # JSON keeps the name; the encoder escapes it


# ------------------------------------------------------------------ 11. export says what is missing
def test_export_of_a_damaged_trace_says_so(trace, capsys):
    (trace / "part-000003.parquet").unlink()  # rows 15-19
    out_file = trace.parent / "out.json"
    rc, out, err = run(capsys, "export", trace, "-o", out_file)
    assert rc == 0 and out.startswith("optrace export: 40 ops -> ")
    assert err == (
        f"optrace export: note: {trace}: trace is damaged: 5 rows missing from disk (a part deleted?); "
        "1 part file(s) missing; 1 gap(s) in seq; exporting the rows it has\n"
    )
    written = json.loads(out_file.read_text())
    assert written["otherData"]["complete"] == {"0": True}
    assert written["otherData"]["damage"] == {
        "0": {
            "record_errors": 0,
            "lost_rows": 0,
            "missing_rows": 5,
            "missing_parts": 1,
            "seq_gaps": 1,
            "damaged_marker": 0,
        }
    }
    labels = [e["args"]["name"] for e in written["traceEvents"] if e.get("name") == "process_name"]
    assert labels == ["rank 0: t (" + tracer.read_metadata(trace)["device"]["name"] + ") DAMAGED"]


def test_export_of_a_trace_cut_short_says_so(tmp_path, capsys):
    path = tmp_path / "t"
    with pytest.raises(RuntimeError, match="boom"):
        with Tracer(path, flush_rows=5):
            a = torch.zeros(1)
            for _ in range(6):
                a = a + 1
            raise RuntimeError("boom")
    rc, out, err = run(capsys, "export", path, "-o", tmp_path / "out.json")
    assert rc == 0
    assert err == f"optrace export: note: {path}: trace is incomplete (cut short); exporting the rows it has\n"
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["otherData"]["complete"] == {"0": False}
    assert written["otherData"]["damage"]["0"]["missing_rows"] == 0


def test_export_of_a_whole_trace_has_no_note(trace, capsys):
    rc, out, err = run(capsys, "export", trace, "-o", trace.parent / "out.json")
    written = json.loads((trace.parent / "out.json").read_text())
    assert rc == 0 and err == "" and written["otherData"]["complete"] == {"0": True}
    assert set(written["otherData"]["damage"]["0"].values()) == {0}


@pytest.mark.parametrize("narrow", [False, True])
def test_a_null_list_cell_is_one_line_whichever_way_the_sql_engine_reads_the_parts(trace, capsys, monkeypatch, narrow):
    """A list cell's Parquet statistics count a null list as they count an empty one, so the SQL engine scans those
    cells: from the files, or from the rows of a many-part trace read once (reports/sql/scan.py `_src`)."""
    from reports.sql import engine

    monkeypatch.setattr(engine, "SMALL_PARTS", (1, 1 << 40, 1 << 40) if narrow else (1 << 40, 0, 0))
    rewrite(trace / "part-000002.parquet", set_cell("input_shapes", 0, None))
    seq = read_part(trace / "part-000002.parquet").column("seq")[0].as_py()
    one_error(
        capsys,
        "report",
        trace,
        rf"column 'input_shapes' is null at seq {seq} \(1 null value\(s\)\); "
        r"expected list<item: list<item: int64>> values",
    )


# ------------------------------------------------------------------ 12. the traced code's exception text
def _raising_trace(path, message, **kwargs):
    with pytest.raises(RuntimeError):
        with Tracer(path, **kwargs):
            torch.zeros(1) + 1
            raise RuntimeError(message)
    return path


FORGED = "Boom\x1b[31mRED\nFORGED LINE"


def test_the_traced_codes_exception_is_escaped(tmp_path, capsys):
    """The metadata's `error` reached the terminal raw: an escape recoloured it, a newline forged a line."""
    path = _raising_trace(tmp_path / "t", FORGED)
    rc, out, err = run(capsys, "report", path)
    assert rc == 0
    assert out.splitlines()[0].endswith(", INCOMPLETE)"), out.splitlines()[0]  # its words: the first caveat
    assert (
        r"- incomplete: INCOMPLETE: the traced code raised RuntimeError: Boom\x1b[31mRED\nFORGED LINE; "
        "figures cover the rows it has"
    ) in unwrapped(out)
    assert "\x1b" not in out and not any(line.startswith("FORGED") for line in out.splitlines())


def test_a_ranks_exception_is_escaped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        if rank:
            _raising_trace(tmp_path / "t", FORGED)
        else:
            with Tracer(tmp_path / "t"):
                torch.zeros(1) + 1
    rc, out, err = run(capsys, "report", tmp_path / "t")
    assert rc == 0, err
    assert (
        r"  rank 1: INCOMPLETE: the traced code raised RuntimeError: Boom\x1b[31mRED\nFORGED LINE; its figures cover "
        "the rows it has"
    ).startswith(next(line for line in out.splitlines() if line.startswith("  rank 1: ")))  # wrapped to the width
    assert r"rank 1: INCOMPLETE: the traced code raised RuntimeError: Boom\x1b[31mRED\nFORGED LINE" in unwrapped(out)
    assert "\x1b" not in out and not any(line.startswith("FORGED") for line in out.splitlines())


def test_an_error_that_is_not_a_string_is_one_line(trace, capsys):
    rewrite(trace / "part-000009.parquet", set_metadata(complete=False, error={"x": 1}))
    one_error(
        capsys, "report", trace, r"optrace metadata \(part-000009\.parquet\) 'error' is \{\"x\": 1\}, expected a string"
    )


# ------------------------------------------------------------------ 13. one directory per rank
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """A trace of 2 ranks (RANK and WORLD_SIZE set: the tracer writes rank=R directories)."""
    path = tmp_path_factory.mktemp("ranks") / "t"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLD_SIZE", "2")
        for rank in (0, 1):
            patch.setenv("RANK", str(rank))
            with Tracer(path):
                torch.zeros(1) + 1
    return path


def _set_rank(directory, rank):
    for part in part_paths(directory):
        rewrite(part, set_metadata(rank=rank, world_size=rank + 1))


def _linked_rank(trace):
    """rank=3 a link to rank=1, whose metadata names no rank (only its trace_id tells the two apart)."""
    for part in part_paths(trace / "rank=1"):
        rewrite(part, set_metadata(rank=None))
    os.symlink("rank=1", trace / "rank=3")


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda t: shutil.copytree(t / "rank=1", t / "rank=01"),
            r"rank=01 and rank=1 are both rank 1; expected one directory per rank \(a copy\?\); move one out",
        ),
        (
            lambda t: shutil.copytree(t / "rank=0", t / "rank=2"),
            r"rank=2's metadata says it is rank 0 \(as rank=0's does\); expected the directory's rank to be its metadata's "
            r"rank \(a copy of another rank's directory\?\); move it out",
        ),
        (
            lambda t: (shutil.copytree(t / "rank=1", t / "rank=3"), _set_rank(t / "rank=3", 3)),
            r"rank=1 and rank=3 hold the same trace \(trace_id \w+\); expected one directory per rank \(a copy\?\); "
            r"move one out",
        ),
        (
            _linked_rank,  # read as a third rank ('Ranks (3 of 2)') while a directory read again was allowed
            r"rank=1 and rank=3 hold the same trace \(trace_id \w+\); expected one directory per rank \(a copy\?\); "
            r"move one out",
        ),
        (
            lambda t: (t / "rank=1").rename(t / "rank=99999999999999999999999"),
            r"rank=99999999999999999999999 names rank 99999999999999999999999; expected a rank below 2,147,483,648 "
            r"\(not written by optrace\?\)",
        ),
    ],
    ids=["rank_01_beside_rank_1", "metadata_of_another_rank", "same_trace_id", "linked_rank", "rank_past_int32"],
)
@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_a_rank_directory_that_is_not_its_rank_is_one_line(two_ranks, tmp_path, capsys, damage, message, engine):
    """They were counted twice (a copied rank), or gave an OverflowError's traceback (a rank past int64)."""
    trace = shutil.copytree(two_ranks, tmp_path / "t")
    damage(trace)
    one_error(capsys, "report", trace, message, "--engine", engine)
    if engine == "pandas":
        with pytest.raises(ReportError, match=re.escape(str(trace)) + ": " + message):
            reports.load(trace, lists="arrow")


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_a_copy_of_a_distributed_trace_compares_with_it(two_ranks, tmp_path, capsys, engine):
    """A copy of the whole trace given beside it is the trace given twice (as `compare t t`, or the copy of a trace of
    one process): it was refused as 'copy: rank=0 and rank=0 hold the same trace ... move one out'."""
    copy = shutil.copytree(two_ranks, tmp_path / "copy")
    rc, out, err = run(capsys, "compare", two_ranks, copy, "--engine", engine)
    assert (rc, err) == (0, "")
    same = "  no change: the same ops, FLOPs, bytes, peak and dtypes per step"
    assert out.splitlines()[1:5] == ["What changed in t/rank=0#2:", same, "What changed in t/rank=1#2:", same]
    assert list(reports.load([two_ranks, copy]).attrs["runs"]) == ["t/rank=0", "t/rank=1", "t/rank=0#2", "t/rank=1#2"]


def test_two_ranks_each_in_its_directory_report(two_ranks, capsys):
    rc, out, err = run(capsys, "report", two_ranks)
    assert rc == 0 and err == "" and "Ranks (2): per step, traced times" in out


# ------------------------------------------------------------------ 14. metadata numbers in their ranges
M = r"optrace metadata \(part-000009\.parquet\) "
BYTES_MAX = "1,152,921,504,606,846,976"  # 2**60


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tokens": -16}, M + r"'tokens' is -16, expected tokens per step 1 to 9,007,199,254,740,992"),  # 2**53
        ({"tokens": 0}, M + r"'tokens' is 0, expected tokens per step 1 to 9,007,199,254,740,992"),
        (
            {"tokens": 10**40},
            M + r"'tokens' is 1000000000000000000000000000000000000\.\.\., expected tokens per step 1 "
            r"to 9,007,199,254,740,992",
        ),
        ({"tokens": 0.5}, M + r"'tokens' is 0\.5, expected an int"),  # the tracer has only ever written an int > 0
        ({"tokens": float("nan")}, M + r"'tokens' is NaN, expected an int"),
        ({"tokens": 1e308}, M + r"'tokens' is 1e\+308, expected an int"),
        ({"step_time": {"median_s": -0.01}}, M + r"step_time 'median_s' is -0\.01, expected seconds > 0"),
        ({"step_time": {"median_s": 0}}, M + r"step_time 'median_s' is 0, expected seconds > 0"),
        ({"step_time": {"median_s": float("nan")}}, M + r"step_time 'median_s' is NaN, expected seconds > 0"),
        ({"step_time": {"median_s": float("inf")}}, M + r"step_time 'median_s' is Infinity, expected seconds > 0"),
        (
            {"ceiling": {"flops_per_s": -1e9, "dtype": "float32"}},
            M + r"ceiling 'flops_per_s' is -1000000000\.0, expected FLOP/s > 0",
        ),
        ({"bandwidth": {"bytes_per_s": 0}}, M + r"bandwidth 'bytes_per_s' is 0, expected bytes/s > 0"),
        ({"device": {"type": "cpu", "name": "x", "cores": -4}}, M + r"device 'cores' is -4, expected a count >= 1"),
        ({"device": {"type": "cpu", "name": "x", "mhz": -1.0}}, M + r"device 'mhz' is -1\.0, expected MHz >= 0"),
        (
            {"device": {"type": "cuda", "name": "x", "total_memory_bytes": 2**61}},
            M + rf"device 'total_memory_bytes' is 2305843009213693952, expected bytes 0 to {BYTES_MAX}",
        ),
        (
            {"params": {"total": 10**30}},
            M + rf"params 'total' is 1000000000000000000000000000000, expected a count 0 to "
            rf"{BYTES_MAX}",
        ),
        (
            {"parameters": {"w": {"storage_id": 0, "numel": 10**30, "shape": [2], "dtype": "float32"}}},
            M + rf"parameter 'w' 'numel' is 1000000000000000000000000000000, expected a count 0 to {BYTES_MAX}",
        ),
        ({"world_size": 0}, M + r"'world_size' is 0, expected ranks >= 1"),
        ({"rank": -1}, M + r"'rank' is -1, expected a rank >= 0"),
        ({"rank": 2, "world_size": 2}, M + r"'rank' is 2, expected a rank 0 to 1 \(world_size 2\)"),
        ({"schema_version": 0}, M + r"'schema_version' is 0, expected a schema version >= 1"),
    ],
    ids=[
        "tokens_negative",
        "tokens_zero",
        "tokens_10_40",
        "tokens_half",
        "tokens_nan",
        "tokens_1e308",
        "step_time_negative",
        "step_time_zero",
        "step_time_nan",
        "step_time_inf",
        "ceiling_negative",
        "bandwidth_zero",
        "cores_negative",
        "mhz_negative",
        "memory_2_61",
        "params_10_30",
        "numel_10_30",
        "world_size_zero",
        "rank_negative",
        "rank_of_world",
        "schema_version_0",
    ],
)
def test_metadata_numbers_out_of_range_are_one_line(trace, capsys, fields, message):
    """Type-checked but not range-checked, they gave negative figures, an MFU of -0.1%, an invented CPU peak,
    'no untraced step time' for a NaN, or an OverflowError's traceback."""
    rewrite(trace / "part-000009.parquet", set_metadata(**fields))
    one_error(capsys, "report", trace, message)
    one_error(capsys, "report", trace, message, "--engine", "pandas")


# ------------------------------------------------------------------ 15. phases and FLOP kinds the tracer writes
@pytest.mark.parametrize(
    "column, value, message",
    [
        (
            "phase",
            "warmup",
            r"column 'phase' holds 'warmup' at seq 13; expected one of forward, backward, optimizer, "
            r"other",
        ),
        (
            "flop_kind",
            "bogus",
            r"column 'flop_kind' holds 'bogus' at seq 13; expected one of matmul, attention, conv, "
            r"elementwise, reduction, norm, softmax, foreach, collective, none, unknown",
        ),
    ],
)
@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_an_unknown_phase_or_flop_kind_is_one_line(trace, capsys, column, value, message, engine):
    """They were read as they were, and the phases then no longer added up to the total."""
    rewrite(trace / "part-000002.parquet", set_cell(column, 3, value))  # rows 10-14
    message += r" \(a damaged or hand-edited trace\?\)"
    one_error(capsys, "report", trace, message, "--engine", engine)
    one_error(capsys, "compare", trace, message, trace, "--engine", engine)
    if engine == "sql":
        one_error(capsys, "export", trace, message, "-o", trace.parent / "out.json")
        with pytest.raises(ReportError, match=re.escape(str(trace)) + ": " + message):
            reports.load(trace, lists="arrow")


# ------------------------------------------------------------------ 16. a late part is counted
@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_a_deleted_late_part_is_damage(tmp_path, capsys, engine):
    """The zero-row part set_step_time writes after the `with` block: its deletion went unnoticed (the marker
    counted the parts at close). Now the marker counts it too."""
    path = tmp_path / "t"
    with Tracer(path) as tr:
        torch.zeros(1) + 1
    closed = marker_facts(path)["parts"]
    tr.set_step_time(0.01)
    parts = part_paths(path)
    assert marker_facts(path)["parts"] == closed + 1 and len(parts) == 2  # the closing part and the late one
    os.remove(parts[-1])
    rc, out, err = run(capsys, "report", path, "--engine", engine)
    assert rc == 0, err
    assert out.splitlines()[0].endswith(", DAMAGED)"), out.splitlines()[0]
    assert "- damaged: DAMAGED: 1 part file(s) missing " in unwrapped(out)
