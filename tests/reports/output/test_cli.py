"""The `optrace` command: `report` and `compare` on traces of a tiny GPT, and one line (exit 2) for every bad input.

Tiny GPT: GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16), batch 2, so
T = 2 * 8 = 16 tokens per step. N, the parameters that enter a matmul (reports' default):
    qkv 16 * 48 = 768, attn.proj 16 * 16 = 256, mlp.fc 16 * 64 = 1024, mlp.proj 64 * 16 = 1024,
    lm_head 16 * 32 = 512 (biases, embeddings and layer norms enter no matmul): N = 3584.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step

from reports.output.cli import main
from tests import helpers
from tracer import Tracer
from tracer.schema import METADATA_KEY, SCHEMA_VERSION, part_paths, read_part

ROOT = helpers.ROOT
N = 3584  # 768 + 256 + 1024 + 1024 + 512, see the module docstring
T = 16  # batch 2 * seq_len 8
BF16_STEP_TIME = 0.02  # seconds, recorded in the bf16 trace with set_step_time


def tiny_gpt():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16)
    model = GPT(cfg)
    return cfg, model, make_optimizer(model)


def trace_gpt(path, dtype=None, run_name=None, step_time=None):
    cfg, model, opt = tiny_gpt()
    idx, targets = make_batch(cfg, 2)
    with Tracer(path, model=model, tokens=2 * cfg.seq_len, run_name=run_name) as tr:
        train_step(model, opt, idx, targets, dtype)
        if step_time is not None:
            tr.set_step_time(step_time)
    return str(path)


def trace_cut_short(path):
    """Forward and backward, then an exception before the optimizer step: the trace is left incomplete."""
    cfg, model, opt = tiny_gpt()
    idx, targets = make_batch(cfg, 2)
    with pytest.raises(RuntimeError, match="cut short on purpose"):
        with Tracer(path, model=model, tokens=2 * cfg.seq_len, run_name="cut"):
            model(idx, targets).backward()
            raise RuntimeError("cut short on purpose")
    return str(path)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    return {
        "fp32": trace_gpt(d / "gpt_fp32.parquet", run_name="fp32"),
        "bf16": trace_gpt(d / "gpt_bf16.parquet", torch.bfloat16, run_name="bf16", step_time=BF16_STEP_TIME),
        "cut": trace_cut_short(d / "gpt_cut.parquet"),
    }


def run(capsys, *argv):
    """main(argv) in this process: (exit status, stdout, stderr)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def report_json(capsys, *argv):
    rc, out, err = run(capsys, "report", *argv, "--json")
    assert rc == 0, err
    return json.loads(out)  # the whole of stdout is one JSON document


# ------------------------------------------------------------------ optrace report
def test_report_prints_every_section(traces, capsys):
    rc, out, err = run(capsys, "report", traces["fp32"], "--full")
    assert rc == 0, err
    assert err == ""
    assert out.startswith("optrace report: fp32  (")
    assert "complete)" in out.splitlines()[0] and "INCOMPLETE" not in out
    for heading in (
        "FLOPs per step against 2/4/6 x N x T",
        "MFU (model FLOPs per second of untraced step time / promised FLOP/s)",
        "Top 8 ops by FLOPs",
        "Top modules by FLOPs",
        "Memory: peak",
        "Views (no new memory) vs copies",
    ):
        assert heading in out, f"{heading!r} missing from:\n{out}"
    # the order of the sections
    positions = [
        out.index(h) for h in ("FLOPs per step", "MFU (", "Top 8 ops", "Top modules", "Memory: peak", "Views (")
    ]
    assert positions == sorted(positions)
    assert "N = 3,584 parameters (matmul), T = 16 tokens per step" in out
    assert re.search(r"^\s+forward\s", out, re.M) and re.search(r"^\s+total\s", out, re.M)
    assert "N/A: no untraced step time" in out  # fp32 trace: no set_step_time, no --step-time
    assert "aten.mm.default" in out
    for category in ("parameters", "gradients", "optimizer_state"):
        assert re.search(rf"^\s+{category}\s+\d", out, re.M), category


def test_report_top_limits_the_tables(traces, capsys):
    rc, out, err = run(capsys, "report", traces["fp32"], "--top", "2")
    assert rc == 0, err
    assert "Top 2 ops by FLOPs" in out


def test_report_json_numbers(traces, capsys):
    got = report_json(capsys, traces["fp32"])
    assert got["run"] == "fp32" and got["complete"] is True and got["steps"] == 1
    assert got["params"] == 3584  # N, see the module docstring
    assert got["tokens"] == 16  # 2 * 8
    assert got["expected"] == {
        "forward": 114688,  # 2 * N * T = 2 * 3584 * 16
        "backward": 229376,  # 4 * 3584 * 16
        "total": 344064,  # 6 * 3584 * 16
    }
    assert set(got["flops"]) == {"forward", "backward", "optimizer", "other", "total"}
    flops = got["flops"]
    assert flops["other"] == 0 and all(isinstance(v, int) and v > 0 for p, v in flops.items() if p != "other")
    assert flops["total"] == flops["forward"] + flops["backward"] + flops["optimizer"]  # no "other" phase here
    # the weight matmuls alone are 2 N T and 4 N T; attention, norms and the loss come on top
    assert flops["forward"] > got["expected"]["forward"] and flops["backward"] > got["expected"]["backward"]
    assert got["mfu"] is None  # no set_step_time in this trace and no --step-time
    assert got["step_time_s"] is None and got["achieved_flops_per_s"] is None


def test_report_json_peak_is_max_live_bytes(traces, capsys):
    got = report_json(capsys, traces["fp32"])
    live = pd.read_parquet(traces["fp32"], columns=["live_bytes"])["live_bytes"]
    assert isinstance(got["peak_live_bytes"], int)
    assert got["peak_live_bytes"] == int(live.max())


def test_report_json_mfu_from_the_command_line(traces, capsys):
    got = report_json(capsys, traces["fp32"], "--step-time", "0.01", "--peak-tflops", "1")
    model_flops = got["flops"]["forward"] + got["flops"]["backward"]  # matmul attention: nothing recomputed
    assert got["step_time_s"] == 0.01
    assert got["peak_flops_per_s"] == 1e12
    assert got["achieved_flops_per_s"] == pytest.approx(model_flops / 0.01, rel=1e-12)
    assert isinstance(got["mfu"], float)
    assert got["mfu"] == pytest.approx(model_flops / 0.01 / 1e12, rel=1e-12)


def test_report_json_mfu_from_the_traced_step_time(traces, capsys):
    """The bf16 trace recorded set_step_time(0.02): --peak-tflops alone gives MFU."""
    got = report_json(capsys, traces["bf16"], "--peak-tflops", "1")
    model_flops = got["flops"]["forward"] + got["flops"]["backward"]
    assert got["step_time_s"] == BF16_STEP_TIME
    assert got["mfu"] == pytest.approx(model_flops / BF16_STEP_TIME / 1e12, rel=1e-12)
    # the same model, so the same FLOPs and the same 6 N T as fp32 (autocast changes bytes, not FLOPs)
    assert got["expected"]["total"] == 344064  # 6 * 3584 * 16


def test_report_text_shows_mfu_when_timed(traces, capsys):
    rc, out, err = run(capsys, "report", traces["fp32"], "--step-time", "0.01", "--peak-tflops", "1")
    assert rc == 0, err
    assert re.search(
        r"^  step 10\.0 ms, achieved .*FLOP/s, peak 1 TFLOP/s .*: MFU \d+\.\d%, HFU \d+\.\d%$", out, re.M
    ), out


def test_report_plot_writes_pngs(traces, capsys, tmp_path):
    plots = tmp_path / "plots"
    rc, out, err = run(capsys, "report", traces["fp32"], "--plot", plots)
    assert rc == 0, err
    listed = re.search(r"^Plots: (.+)$", out, re.M)
    assert listed, out
    paths = [Path(p) for p in listed.group(1).split(", ")]
    assert sorted(p.name for p in paths) == ["flops.png", "memory.png", "roofline.png"]
    assert sorted(paths) == sorted(plots.iterdir())
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", path
        assert len(data) > 1024, f"{path}: only {len(data)} bytes"


# ------------------------------------------------------------------ optrace compare
def test_compare_prints_signed_changes(traces, capsys):
    rc, out, err = run(capsys, "compare", traces["fp32"], traces["bf16"])
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "optrace compare: bf16 against fp32 (baseline); per step, except peak_live"
    assert lines[1] == "What changed in bf16:" and lines[2].startswith("  totals: FLOPs/step +0.0%, bytes allocated")
    assert "  ops added: aten._to_copy.default" in out  # autocast's casts
    assert re.search(r"^  dtype float32 -> bfloat16: .*aten\.addmm\.default", out, re.M), out
    header = next(line for line in lines if line.lstrip().startswith("phase")).split()
    # 8 figures per key (14 before): the value and its signed change against fp32
    assert header == [
        "phase",
        "run",
        "ops/step",
        "±ops",
        "flops/step",
        "±flops",
        "alloc/step",
        "±alloc",
        "peak_live",
        "±peak",
    ]
    assert (
        lines[-1]
        == "±: signed change against fp32's value for the same phase (new: fp32 has none); alloc: bytes allocated"
    )
    assert not re.search(r"\d+\.\d{4,}|<NA>|\b\d+\.0(?![\d%])", out)  # no raw floats, no pandas NA, no "506.0"
    total = re.search(r"^\s*total\s+bf16\s.*$", out, re.M).group(0)
    assert re.search(r"\s-\d+\.\d%", total), total  # bytes allocated fell: a minus sign, not an unsigned 14.4%


def test_compare_by_op(traces, capsys):
    rc, out, err = run(capsys, "compare", traces["fp32"], traces["bf16"], "--by", "op")
    assert rc == 0, err
    assert not re.search(r"<NA>", out)
    # every mm writes bfloat16 (2 bytes) instead of float32 (4 bytes): (2 - 4) / 4 = -50.0% (the ratio 0.500 before)
    mm = re.search(r"^\s*aten\.mm\.default\s+bf16\s.*$", out, re.M)
    assert mm, out
    assert re.search(r"\s\+0\.0%\s+\S+ \S+\s+-50\.0%\s", mm.group(0)), mm.group(0)  # flops +0.0%, alloc -50.0%


def test_compare_json(traces, capsys):
    rc, out, err = run(capsys, "compare", traces["fp32"], traces["bf16"], "--by", "op", "--json")
    assert rc == 0, err

    def no_constants(name):
        raise AssertionError(f"not strict JSON: {name}")

    got = json.loads(out, parse_constant=no_constants)  # no NaN / Infinity
    assert isinstance(got, dict) and got["by"] == "op" and got["runs"] == ["fp32", "bf16"] and got["baseline"] == "fp32"
    assert set(got["columns"]) == {
        "op",
        "run",
        "steps",
        "ops_per_step",
        "flops_per_step",
        "bytes_allocated_per_step",
        "traced_us_per_step",
        "peak_live_bytes",
        "mfu_pct",
        "ops_change_pct",
        "flops_change_pct",
        "bytes_allocated_change_pct",
        "peak_live_bytes_change_pct",
        "traced_us_change_pct",
        "change_pct",
    }
    records = got["rows"]
    assert records and all(set(r) == set(got["columns"]) for r in records)  # every column documented
    by_key = {(r["op"], r["run"]): r for r in records}
    assert by_key[("total", "fp32")]["bytes_allocated_change_pct"] == 0
    assert by_key[("aten.mm.default", "bf16")]["bytes_allocated_change_pct"] == -50  # 2 bytes against 4 (ratio 0.5)
    assert by_key[("aten.mm.default", "bf16")]["flops_change_pct"] == 0  # autocast: same FLOPs
    assert got["gate"] == {"checks": [], "breaches": [], "passed": True}
    assert got["changes"]["bf16"][1].startswith("ops added: aten._to_copy.default")
    rc, out, err = run(capsys, "compare", traces["fp32"], traces["bf16"], "--json")
    assert rc == 0, err
    assert {r["phase"] for r in json.loads(out)["rows"]} == {"total", "forward", "backward", "optimizer"}


# ------------------------------------------------------------------ an incomplete trace
def test_incomplete_trace_still_reports(traces, capsys):
    rc, out, err = run(capsys, "report", traces["cut"])
    assert rc == 0, err
    assert "INCOMPLETE" in out.splitlines()[0]
    assert "FLOPs per step against 2/4/6 x N x T" in out and "Memory: peak" in out
    notes = err.splitlines()
    assert len(notes) == 1, err
    assert re.fullmatch(
        rf"optrace report: note: {re.escape(traces['cut'])}: trace is incomplete \(cut short\); reporting the \d+ rows it has",
        notes[0],
    ), notes[0]
    assert "Traceback" not in err


def test_incomplete_trace_json(traces, capsys):
    rc, out, err = run(capsys, "report", traces["cut"], "--json")
    assert rc == 0, err
    got = json.loads(out)  # the note goes to stderr, so stdout stays one JSON object
    assert got["complete"] is False
    assert got["flops"]["optimizer"] == 0  # cut before opt.step()
    assert re.search(r"note: .*incomplete", err)


# ------------------------------------------------------------------ bad input: one line, exit 2
def write_garbage_part(d):
    d.mkdir()
    (d / "part-000000.parquet").write_bytes(b"this is not a Parquet file\n" * 10)


def write_plain_parquet(d):
    d.mkdir()
    pq.write_table(pa.table({"a": [1, 2, 3]}), d / "part-000000.parquet")  # no optrace metadata


def rewrite_metadata(trace, d, **changes):
    """Copy `trace` to `d`, changing fields of the optrace metadata in every part."""
    shutil.copytree(trace, d)
    for part in part_paths(d):
        table = read_part(part)
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        meta.update(changes)
        pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), part)


def make_bad(kind, tmp_path, traces):
    """(path, regex of the message after 'optrace report: error: <path>: ')."""
    p = tmp_path / kind
    if kind == "missing":
        return p, r"no such file or directory"
    if kind == "text_file":
        p.write_text("hello, not parquet\n")
        return p, r"not an optrace trace \(a trace is a directory of part-\*\.parquet files\)"
    if kind == "parquet_file":  # a single Parquet file, not a trace directory
        pq.write_table(pa.table({"a": [1, 2, 3]}), p)
        return p, r"not an optrace trace \(a trace is a directory of part-\*\.parquet files\)"
    if kind == "no_parts":
        p.mkdir()
        (p / "notes.txt").write_text("no parts here\n")
        return p, r"not an optrace trace \(no part-\*\.parquet files in it\)"
    if kind == "garbage_part":
        write_garbage_part(p)
        return p, r"not a readable Parquet trace \(.+\)"
    if kind == "empty_part":
        p.mkdir()
        (p / "part-000000.parquet").write_bytes(b"")
        return p, r"not a readable Parquet trace \(.+\)"
    if kind == "no_metadata":
        write_plain_parquet(p)
        return p, r"Parquet without optrace metadata \(was it written by optrace\?\)"
    if kind == "newer_schema":
        rewrite_metadata(traces["fp32"], p, schema_version=99)
        return p, rf"trace schema version 99 is newer than this optrace reads \({SCHEMA_VERSION}\); upgrade optrace"
    raise AssertionError(kind)


BAD = ["missing", "text_file", "parquet_file", "no_parts", "garbage_part", "empty_part", "no_metadata", "newer_schema"]


def assert_one_error_line(rc, out, err, command, path, message):
    assert rc == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(rf"optrace {command}: error: {re.escape(str(path))}: {message}", lines[0]), lines[0]


@pytest.mark.parametrize("kind", BAD)
def test_report_bad_input(kind, tmp_path, traces, capsys):
    path, message = make_bad(kind, tmp_path, traces)
    rc, out, err = run(capsys, "report", path)
    assert out == ""
    assert_one_error_line(rc, out, err, "report", path, message)


@pytest.mark.parametrize("kind", BAD)
def test_report_json_bad_input(kind, tmp_path, traces, capsys):
    """--json prints nothing on stdout for bad input: no half JSON document."""
    path, message = make_bad(kind, tmp_path, traces)
    rc, out, err = run(capsys, "report", path, "--json")
    assert out == ""
    assert_one_error_line(rc, out, err, "report", path, message)


@pytest.mark.parametrize("kind", ["missing", "garbage_part", "no_metadata", "newer_schema"])
def test_compare_bad_input_names_the_bad_trace(kind, tmp_path, traces, capsys):
    path, message = make_bad(kind, tmp_path, traces)
    rc, out, err = run(capsys, "compare", traces["fp32"], path)
    assert out == ""
    assert_one_error_line(rc, out, err, "compare", path, message)


def test_compare_needs_two_traces(traces, capsys):
    rc, out, err = run(capsys, "compare", traces["fp32"])
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("optrace compare: error: expected at least two traces"), lines[0]


def test_compare_needs_two_traces_names_the_trace(traces, capsys):
    rc, out, err = run(capsys, "compare", traces["fp32"])
    assert rc == 2
    assert re.fullmatch(
        rf"optrace compare: error: expected at least two traces, got one: {re.escape(traces['fp32'])}", err.strip()
    )


@pytest.mark.parametrize(
    "raw, message",
    [
        pytest.param(b"{not json", r"optrace metadata is not valid JSON \(.+\)", id="not_json"),
        pytest.param(b"[1, 2]", r"optrace metadata is not a JSON object", id="not_an_object"),
    ],
)
def test_report_corrupt_metadata(raw, message, tmp_path, traces, capsys):
    path = tmp_path / "corrupt"
    shutil.copytree(traces["fp32"], path)
    for part in part_paths(path):
        table = read_part(part)
        pq.write_table(table.replace_schema_metadata({METADATA_KEY: raw}), part)
    rc, out, err = run(capsys, "report", path)
    assert_one_error_line(rc, out, err, "report", path, message)


def test_report_missing_schema_version(tmp_path, traces, capsys):
    path = tmp_path / "noversion"
    rewrite_metadata(traces["fp32"], path, schema_version=None)
    rc, out, err = run(capsys, "report", path)
    assert_one_error_line(rc, out, err, "report", path, r"optrace metadata has no valid schema_version \(got None\)")


# ------------------------------------------------------------------ traces made without model= or tokens=
@pytest.fixture(scope="module")
def bare_trace(tmp_path_factory):
    """The README's linear model, traced with tokens= but no model= (both are optional)."""
    path = tmp_path_factory.mktemp("bare") / "linear.parquet"
    w = torch.randn(256, 64, requires_grad=True)
    x = torch.ones(1024, 256)
    with Tracer(path, tokens=1024):
        (x @ w).sum().backward()
    return str(path)


def test_report_without_model_still_reports(bare_trace, capsys):
    rc, out, err = run(capsys, "report", bare_trace)
    assert rc == 0, err
    assert "N/A: " in out and "no parameter metadata" in out  # the 2/4/6 N T section says why it is missing
    for heading in ("MFU (", "Top ", "Memory: peak", "Views ("):
        assert heading in out
    got = report_json(capsys, bare_trace)
    assert got["params"] is None and got["expected"] is None
    # x @ w: 2 * B * D * K = 2 * 1024 * 256 * 64 = 33,554,432; .sum(): 1 per element, 1024 * 64 = 65,536
    assert got["flops"]["forward"] == 33619968  # 33,554,432 + 65,536


@pytest.mark.parametrize("flag", [[], ["--json"]])
def test_report_empty_trace(flag, tmp_path, capsys):
    """Nothing ran inside the Tracer: zero rows, no model. One line and exit 2, never a traceback."""
    path = tmp_path / "empty.parquet"
    with Tracer(path):
        pass
    rc, out, err = run(capsys, "report", path, *flag)
    assert rc == 2, (out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("optrace report: error: "), err
    assert "empty" in lines[0]  # names the trace (its path, or its run name 'empty')


# ------------------------------------------------------------------ a real process: no traceback reaches the user
@pytest.mark.parametrize("kind", ["good", "garbage_part"])
def test_subprocess(kind, tmp_path, traces):
    if kind == "good":
        path = traces["fp32"]
    else:
        path, message = make_bad(kind, tmp_path, traces)
    done = subprocess.run(
        [sys.executable, "-m", "reports.output.cli", "report", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    if kind == "good":
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        assert "Top 8 ops by FLOPs" in done.stdout and "Memory: peak" in done.stdout
    else:
        assert done.returncode == 2
        assert done.stdout == ""
        assert_one_error_line(done.returncode, done.stdout, done.stderr, "report", path, message)


def test_report_into_a_closed_pipe_is_quiet(traces):
    """`optrace report T | head -0`: the reader is gone before the first line; no traceback, exit 0."""
    report = subprocess.Popen(
        [sys.executable, "-m", "reports.output.cli", "report", str(traces["fp32"])],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    report.stdout.close()  # long before the report's first write (the interpreter is still starting)
    err = report.stderr.read().decode()
    assert report.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ("report", "TRACE"),
        ("report", "TRACE", "--json"),
        ("compare", "TRACE", "TRACE"),
        ("plan", "TRACE", "--gpu", "h100"),
        ("export", "TRACE", "-o", "-"),
    ],
    ids=["report", "report_json", "compare", "plan", "export"],
)
def test_a_stdout_that_cannot_be_written_is_one_line(traces, argv):
    """`optrace report T > /dev/full` printed an OSError traceback (report, compare and plan; export said
    "cannot write '-'"): now each command says it in one line and exits 2 (reports/output/stdout.py)."""
    command = [sys.executable, "-m", "reports.output.cli", *(traces["fp32"] if a == "TRACE" else a for a in argv)]
    with open("/dev/full", "w") as full:
        done = subprocess.run(command, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (
        2,
        f"optrace {argv[0]}: error: cannot write to stdout (No space left on device)\n",
    )


@pytest.mark.parametrize(
    "argv",
    [("report", "TRACE", "--json"), ("compare", "TRACE", "TRACE"), ("plan", "TRACE", "--gpu", "h100")],
    ids=["report_json", "compare", "plan"],
)
def test_a_closed_pipe_is_quiet_for_every_command(traces, argv):
    """`optrace plan T | head -0`: the reader gone before the first write; a quiet exit 0, as for report."""
    read, write = os.pipe()
    os.close(read)  # closed before the command starts: its first flush meets a broken pipe
    command = [sys.executable, "-m", "reports.output.cli", *(traces["fp32"] if a == "TRACE" else a for a in argv)]
    try:
        done = subprocess.run(command, cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")


def test_subprocess_bad_arguments_exit_2(traces):
    """argparse's own errors (an unknown option) exit 2 too, with its usage and no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "reports.output.cli", "report", traces["fp32"], "--no-such-option"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "unrecognized arguments: --no-such-option" in done.stderr


@pytest.mark.parametrize(
    "flag, value", [("--peak-tflops", "0"), ("--peak-tflops", "-1"), ("--step-time", "inf"), ("--step-time", "nan")]
)
def test_report_refuses_non_positive_figures(flag, value, capsys, tmp_path):
    with pytest.raises(SystemExit) as done:
        main(["report", str(tmp_path / "any.parquet"), flag, value])
    assert done.value.code == 2
    assert f"argument {flag}: expected a finite number > 0, got '{value}'" in capsys.readouterr().err


def test_report_gives_the_spread_of_the_untraced_step_times(tmp_path, capsys):
    path = trace_gpt(
        tmp_path / "t", step_time={"median_s": 0.1, "times_s": [0.078, 0.1, 0.719], "warmup": 1, "repeats": 3}
    )
    assert main(["report", path]) == 0
    out = capsys.readouterr().out
    # 719 / 78 = 9.2
    noise = (
        "step time: the median of 3 untraced steps (78.0-719.0 ms); the slowest took 9.2x the fastest, "
        "so MFU is uncertain by as much"
    )
    assert noise in " ".join(out.split())  # a caveat, wrapped to the width
    caveats = report_json(capsys, path)["caveats"]
    assert [c["code"] for c in caveats if c["code"] == "step_time_noise"] == ["step_time_noise"]
    assert next(c["message"] for c in caveats if c["code"] == "step_time_noise").startswith(noise)
    assert main(["report", path, "--step-time", "0.1"]) == 0  # a step time given by hand has no spread to show
    assert "untraced steps" not in capsys.readouterr().out


def test_compare_top_keeps_each_key_whole(traces, capsys):
    rc, out, err = run(capsys, "compare", traces["fp32"], traces["bf16"], "--by", "op", "--top", "3")
    assert rc == 0, err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["op", "run"])  # the table, after the words
    rows = [line.split()[:2] for line in lines[start + 1 :] if re.match(r"\s*(total|aten\.)", line)]
    assert len(rows) == 6  # 3 keys, each with its fp32 and its bf16 row
    assert [r[1] for r in rows] == ["fp32", "bf16"] * 3 and rows[0][0] == rows[1][0] == "total"


def test_report_tables_say_per_step_or_total(traces, capsys):
    rc, out, err = run(capsys, "report", traces["fp32"])
    assert rc == 0, err
    assert "\nTop 8 ops by FLOPs, per step (1 step(s) traced)\n" in out
    assert re.search(r"^\s+op ops_per_step flops_per_step flops_pct bytes_allocated_per_step$", out, re.M)
    assert "\nTop modules by FLOPs, totals over all 1 step(s) (children rolled up; depth <= 2)\n" in out
    assert re.search(r"^\s+module subtree_flops_total subtree_flops_pct$", out, re.M)
    # mm: 11 calls per step (forward 4 + backward 7 in the tiny GPT) as an integer, not '11.0'
    assert re.search(r"^\s*aten\.mm\.default\s+11\s", out, re.M)
