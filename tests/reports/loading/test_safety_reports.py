"""The bad-input matrix, part 3: damaged and foreign traces in `reports.load` and `optrace`.

Damage (record errors, lost rows, a deleted part) is reported in the text report, in
--json and by one warning from `load`; a file that does not belong (a foreign Parquet
file, a part of another trace, a CSV file, a directory named like a part) is refused
with one line and exit status 2; nothing is ever half printed.
"""

import json
import re
import shutil
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import reports
from reports.output.cli import main
from reports.output.text import human_bytes
from tests.helpers import unwrapped
from tracer import Tracer
from tracer.schema import MARKER_NAME, METADATA_KEY, SCHEMA_VERSION, marker_facts, part_paths, read_part


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def nine_parts(path, **kwargs):
    """A trace of 45 ops in 9 parts of 5 rows."""
    with Tracer(path, flush_rows=5, **kwargs):
        a = torch.zeros(1)
        for _ in range(44):
            a = a + 1
    return path


def one_error(capsys, path, message, *argv):
    rc, out, err = run(capsys, "report", path, *argv)
    assert rc == 2 and out == "" and "Traceback" not in err, (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(rf"optrace report: error: {re.escape(str(path))}: {message}", lines[0]), lines[0]


# ------------------------------------------------------------------ 6. damage is reported, never hidden
def test_a_deleted_middle_part_is_reported(tmp_path, capsys):
    path = nine_parts(tmp_path / "t")
    (path / "part-000003.parquet").unlink()  # rows 15-19
    rc, out, err = run(capsys, "report", path)
    assert rc == 0
    first = out.splitlines()[0]
    assert first.endswith(", DAMAGED)"), first  # its words: a caveat
    assert (
        "- damaged: DAMAGED: 5 rows missing from disk (a part deleted?); 1 part file(s) missing; 1 gap(s) in seq "
    ) in unwrapped(out)
    assert first.startswith("optrace report: t  (40 ops, 1 step(s), "), first
    assert err.strip() == (
        f"optrace report: note: {path}: trace is damaged: 5 rows missing from disk (a part deleted?); 1 part file(s) missing; "
        "1 gap(s) in seq; reporting the 40 rows it has"
    )
    rc, out, _ = run(capsys, "report", path, "--json")
    assert json.loads(out)["damage"] == {
        "record_errors": 0,
        "lost_rows": 0,
        "missing_rows": 5,
        "missing_parts": 1,
        "seq_gaps": 1,
        "damaged_marker": 0,
    }


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_a_cut_marker_is_reported(tmp_path, capsys, engine):
    """The marker cut to 100 bytes: the report said the trace was complete and whole (DuckDB reading the directory
    fails on it: no magic bytes at its end)."""
    path = nine_parts(tmp_path / "t")
    marker = path / MARKER_NAME
    marker.write_bytes(marker.read_bytes()[:100])
    rc, out, err = run(capsys, "report", path, "--engine", engine)
    assert rc == 0
    assert out.splitlines()[0].endswith(", DAMAGED)"), out.splitlines()[0]
    assert (
        "- damaged: DAMAGED: 1 unreadable marker (_optrace.parquet: its closing facts are lost, "
        "and other Parquet readers of the directory fail on it) "
    ) in unwrapped(out)
    rc, out, _ = run(capsys, "report", path, "--json", "--engine", engine)
    assert json.loads(out)["damage"]["damaged_marker"] == 1


@pytest.mark.parametrize("statistics", [True, False])
def test_a_seq_gap_is_found_with_or_without_parquet_statistics(tmp_path, capsys, statistics):
    """seq ranges come from the row groups' statistics; a part rewritten without them is read instead."""
    import pyarrow.parquet as pq

    path = nine_parts(tmp_path / "t")
    (path / "part-000003.parquet").unlink()  # rows 15-19
    for part in sorted(path.glob("part-*.parquet")):
        table = read_part(part)
        part.unlink()  # a new file: the report's footer cache sees a new inode
        pq.write_table(table, part, write_statistics=statistics)
    rc, out, _ = run(capsys, "report", path, "--json")
    assert rc == 0
    assert json.loads(out)["damage"] == {
        "record_errors": 0,
        "lost_rows": 0,
        "missing_rows": 5,
        "missing_parts": 1,
        "seq_gaps": 1,
        "damaged_marker": 0,
    }


def test_load_warns_once_per_damaged_trace(tmp_path):
    path = nine_parts(tmp_path / "t")
    (path / "part-000009.parquet").unlink()  # the empty closing part: the newest metadata
    (path / "part-000008.parquet").unlink()  # and the last 5 rows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = reports.load(path)
    assert len(df) == 40
    assert [str(w.message) for w in caught] == [
        f"{path}: trace is incomplete (cut short): 5 rows missing from disk (a part deleted?); 2 part file(s) missing; "
        "reporting the 40 rows it has"
    ]  # part 7's metadata says 40 rows and 8 parts (still writing); the marker's closing facts say 45 rows, 10 parts


def test_record_errors_are_in_the_report(tmp_path, capsys):
    lib = torch.library.Library("optrace_safety_test", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    import tracer

    @tracer.register_flop_formula(torch.ops.optrace_safety_test.twice, kind="elementwise")
    def broken(x_shape, out_shape=None, **kwargs):
        raise ValueError("formula bug")

    path = tmp_path / "t"
    with pytest.warns(
        UserWarning, match=r"could not record optrace_safety_test.twice.default \(ValueError: formula bug\)"
    ):
        with Tracer(path):
            out = torch.ops.optrace_safety_test.twice(torch.ones(2)) + 1
    assert out.tolist() == [3.0, 3.0]
    rc, out, err = run(capsys, "report", path, "--json")
    assert json.loads(out)["damage"]["record_errors"] == 1
    assert "trace is damaged: 1 op(s) ran but were not recorded; reporting the 2 rows it has" in err


# ------------------------------------------------------------------ 7. foreign files: one line, exit 2
def test_a_foreign_parquet_file_is_refused(tmp_path, capsys):
    path = nine_parts(tmp_path / "t")
    pq.write_table(pa.table({"a": [1, 2]}), path / "part-000100.parquet")
    one_error(
        capsys, path, r"part-000100.parquet is not an optrace part \(no optrace metadata\); move it out of the trace"
    )


def test_a_part_of_another_trace_is_refused(tmp_path, capsys):
    path = nine_parts(tmp_path / "t")
    other = nine_parts(tmp_path / "other")
    shutil.copy(other / "part-000000.parquet", path / "part-000009.parquet")
    one_error(
        capsys,
        path,
        r"part-000009.parquet belongs to trace '[0-9a-f]{32}', not '[0-9a-f]{32}' like "
        r"part-000000.parquet \(copied from another trace\?\); move it out",
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda p: (p / "part-x.parquet").mkdir(),
            r"part-x.parquet is a directory, not an optrace part; move it out of the trace",
        ),
        (
            lambda p: (p / "data.csv").write_text("a,b\n1,2\n"),
            r"data.csv is not an optrace part \(a trace holds only part-\*\.parquet files\); move it out",
        ),
    ],
    ids=["directory_named_like_a_part", "csv_file"],
)
def test_other_entries_are_refused(tmp_path, capsys, make, message):
    path = nine_parts(tmp_path / "t")
    make(path)
    one_error(capsys, path, message)


@pytest.mark.parametrize("cut", ["truncated", "empty", "corrupt"])
def test_a_damaged_part_file_is_one_line(tmp_path, capsys, cut):
    path = nine_parts(tmp_path / "t")
    part = path / "part-000004.parquet"
    data = part.read_bytes()
    part.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "corrupt": b"x" * len(data)}[cut])
    one_error(capsys, path, r"not a readable Parquet trace \(part-000004.parquet: [^\n]+\)")


def test_a_newer_schema_is_refused(tmp_path, capsys):
    path = nine_parts(tmp_path / "t")
    for part in part_paths(path):
        table = read_part(part)
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        meta["schema_version"] = 7
        pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), part)
    one_error(
        capsys, path, rf"trace schema version 7 is newer than this optrace reads \({SCHEMA_VERSION}\); upgrade optrace"
    )


def test_a_whole_trace_reports_no_damage(tmp_path, capsys):
    path = nine_parts(tmp_path / "t")
    rc, out, err = run(capsys, "report", path, "--json")
    got = json.loads(out)
    assert rc == 0 and err == "" and got["complete"] is True
    assert got["damage"] == {
        "record_errors": 0,
        "lost_rows": 0,
        "missing_rows": 0,
        "missing_parts": 0,
        "seq_gaps": 0,
        "damaged_marker": 0,
    }
    assert marker_facts(path)["rows"] == 45


# ------------------------------------------------------------------ 11. smaller defects in the CLI
@pytest.mark.parametrize("value", ["-1", "0", "x"])
def test_top_must_be_at_least_one(tmp_path, capsys, value):
    path = nine_parts(tmp_path / "t")
    with pytest.raises(SystemExit) as raised:
        main(["report", str(path), "--top", value])
    err = capsys.readouterr().err
    assert raised.value.code == 2
    assert (
        err
        == f"optrace report: error: argument --top: expected an int >= 1, got {value!r} (see optrace report --help)\n"
    )


@pytest.mark.parametrize("flag, value", [("--step-time", "inf"), ("--step-time", "-2"), ("--peak-tflops", "nan")])
def test_bad_cli_numbers(tmp_path, capsys, flag, value):
    path = nine_parts(tmp_path / "t")
    with pytest.raises(SystemExit) as raised:
        main(["report", str(path), flag, value])
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        f"optrace report: error: argument {flag}: expected a finite number > 0, got {value!r} (see optrace report --help)\n"
    )


def test_large_memory_prints_in_tib():
    assert human_bytes(1.28e3 * 2**30) == "1.25 TiB"  # a 70B model's peak: 1,280 GiB
    assert human_bytes(3 * 2**30) == "3 GiB" and human_bytes(2**50) == "1 PiB"


def test_compare_against_an_empty_trace_is_refused(tmp_path, capsys):
    full = nine_parts(tmp_path / "full")
    empty = tmp_path / "empty"
    with Tracer(empty):
        pass
    rc, out, err = run(capsys, "compare", full, empty)
    assert rc == 2 and out == ""
    assert err.strip() == (
        f"optrace compare: error: {empty}: the trace has no ops (nothing ran inside `with Tracer(...)`); nothing to compare"
    )


def test_the_report_says_compiled_code_ran_eagerly(tmp_path, capsys):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    compiled = torch.compile(model)
    path = tmp_path / "t"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: global module hooks fire for the OptimizedModule too
        with Tracer(path, model=compiled):
            compiled(torch.randn(2, 4))
    rc, out, err = run(capsys, "report", path)
    assert rc == 0 and err == ""
    note = (
        "torch.compile'd code ran eagerly under the tracer (1 call of compiled regions: Sequential 1); the "
        "figures describe the eager program. Its FLOPs are the eager program's (a compiler's fusion changes bytes and "
        "time, not FLOPs); traced numerics can differ from compiled ones in the last bits"
    )
    assert f"- compiled_ran_eagerly: {note}" in unwrapped(out)  # a caveat, wrapped to the width
    rc, out, _ = run(capsys, "report", path, "--json")
    assert json.loads(out)["compiled_ran_eagerly"] is True
    assert {"code": "compiled_ran_eagerly", "message": note} in json.loads(out)["caveats"]
