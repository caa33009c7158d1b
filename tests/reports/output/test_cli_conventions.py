"""The `optrace` command's manners: --version, help on every argument, one error prefix, export to
.json.gz and to stdout, the viewer hint per format, a crashed run's exception in the header, and the
caveat under a roofline row above 100% of its roof.

The trace: a Linear(4, 3) on a [2, 4] input, forward and backward, on the CPU."""

import gzip
import json
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch

from reports.output.cli import _parser, main
from tests import helpers
from tests.helpers import unwrapped
from tracer import Tracer

ROOT = helpers.ROOT


def _step(model):
    torch.manual_seed(0)
    model(torch.randn(2, 4)).sum().backward()


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    path = tmp_path_factory.mktemp("manners") / "linear.parquet"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with Tracer(path, model=model, tokens=2, run_name="linear") as tr:
        _step(model)
        tr.set_bandwidth({"bytes_per_s": 1.0})  # a roof of 1 B/s: every memory-bound op is above it
    return str(path)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    path = tmp_path_factory.mktemp("manners") / "crashed.parquet"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with pytest.raises(RuntimeError, match="boom"):
        with Tracer(path, model=model, tokens=2, run_name="crashed"):
            _step(model)
            raise RuntimeError("boom")
    return str(path)


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"optrace {version('optrace')}\n"


def test_version_in_a_subprocess_imports_no_torch():
    code = (
        "import sys; from reports.output.cli import main\ntry: main(['--version'])\nexcept SystemExit: pass\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == [f"optrace {version('optrace')}", "False"], done.stderr


def test_every_argument_has_help():
    parser = _parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert set(commands) == {"report", "compare", "export", "plan"}
    for name, sub in commands.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"optrace {name} {action.dest}: no help text"
    helps = {(name, a.dest): a.help for name, sub in commands.items() for a in sub._actions}
    assert helps[("export", "output")] == (
        "OUT.json (Chrome JSON), OUT.json.gz (the same, gzip-compressed), "
        "OUT.pftrace (Perfetto protobuf) or - (Chrome JSON to stdout)"
    )
    assert helps[("compare", "traces")] == (
        "two or more traces or baseline files (FILE.json, from --save-baseline); changes are against the first"
    )
    assert "(Perfetto protobuf)" in commands["export"].format_help()  # argparse prints it


def test_one_error_prefix(tmp_path, linear, capsys):
    rc, out, err = run(capsys, "export", linear, "-o", tmp_path / "x.txt")
    assert rc == 2 and out == ""
    assert err.startswith("optrace export: error: the output must end in .json or .json.gz"), err
    assert err.count("export:") == 1, err
    rc, out, err = run(capsys, "compare", linear, tmp_path / "missing")
    assert rc == 2 and err.count("error:") == 1 and err.startswith("optrace compare: error: "), err


def test_export_json_gz_gunzips_to_the_json(tmp_path, linear, capsys):
    rc, out, _ = run(capsys, "export", linear, "-o", tmp_path / "t.json")
    assert rc == 0
    rc, out_gz, _ = run(capsys, "export", linear, "-o", tmp_path / "t.json.gz")
    assert rc == 0
    plain = (tmp_path / "t.json").read_bytes()
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == plain
    assert (tmp_path / "t.json.gz").stat().st_size < len(plain)
    ops = json.loads(plain)["traceEvents"]
    assert out_gz == out.replace("t.json ", "t.json.gz ")
    assert re.fullmatch(
        r"optrace export: (\d+) ops -> .*t\.json\.gz \(open it at https://ui\.perfetto\.dev or chrome://tracing\)\n",
        out_gz,
    )
    assert int(re.search(r"(\d+) ops", out_gz).group(1)) == sum(e["ph"] == "X" for e in ops)
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file is gone


def test_export_to_stdout(tmp_path, linear, capsys):
    run(capsys, "export", linear, "-o", tmp_path / "t.json")
    rc, out, err = run(capsys, "export", linear, "-o", "-")
    assert rc == 0
    assert out == (tmp_path / "t.json").read_text()  # stdout holds the trace and nothing else
    assert re.fullmatch(
        r"optrace export: \d+ ops -> stdout \(open it at https://ui\.perfetto\.dev or chrome://tracing\)\n", err
    )


def test_export_pftrace_hint_names_perfetto_only(tmp_path, linear, capsys):
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    rc, out, err = run(capsys, "export", linear, "-o", tmp_path / "t.pftrace")
    assert rc == 0, err
    assert out.endswith(" (open it at https://ui.perfetto.dev)\n") and "chrome://tracing" not in out


def test_crashed_run_names_its_exception(crashed, capsys):
    rc, out, err = run(capsys, "report", crashed)
    assert rc == 0, err
    header = out.splitlines()[0]
    assert header.endswith(", INCOMPLETE)"), header  # the words in the first caveat
    said = "- incomplete: INCOMPLETE: the traced code raised RuntimeError: boom; figures cover the rows it has"
    assert said in unwrapped(out)


def test_roofline_above_the_roof_is_marked(linear, capsys):
    rc, out, err = run(capsys, "report", linear, "--sections", "roofline")
    assert rc == 0, err
    section = out[out.index("\nRoofline") :]
    marked = [line for line in section.splitlines() if re.search(r"\d%\*$", line)]
    assert marked, section
    assert re.search(
        r" \* \d+ row\(s\) above 100% of the roof: outside the roofline's model \(the bandwidth roof "
        r"is a DRAM triad, and small tensors stay in cache, which is faster than DRAM\) ",
        unwrapped(section),  # wrapped to the width
    )
    assert int(re.search(r"\* (\d+) row", section).group(1)) == len(marked)


def test_mfu_above_100_pct_has_a_caveat(linear, capsys):
    # a step of 1 ns against a peak of 1 MFLOP/s: the model's FLOPs cannot have run in it
    rc, out, err = run(capsys, "report", linear, "--step-time", "1e-9", "--peak-tflops", "1e-6")
    assert rc == 0, err
    assert re.search(r"MFU \d[\d.]*%", out) and "MFU N/A" not in out
    said = (
        "MFU above 100%, outside its model: the step time or the peak is wrong (a step time shorter than "
        "the traced step, or a peak below the device's dense peak for this dtype)"
    )
    assert f"- mfu_above_100: {said}" in unwrapped(out)
    caveats = json.loads(run(capsys, "report", linear, "--step-time", "1e-9", "--peak-tflops", "1e-6", "--json")[1])
    assert {"code": "mfu_above_100", "message": said} in caveats["caveats"]
    rc, out, err = run(capsys, "report", linear, "--step-time", "1", "--peak-tflops", "1000")
    assert rc == 0 and "above 100%" not in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "TRACE", "--top", "-3"], "optrace report: error: argument --top: expected an int >= 1, got '-3'"),
        (["report", "TRACE", "--engine", "foo"], "optrace report: error: argument --engine: invalid choice: 'foo'"),
        (
            ["report", "TRACE", "--step-time", "1e-320"],  # MFU was inf: no step of a traced model runs in under a ns
            "optrace report: error: argument --step-time: expected seconds >= 1e-09 (one ns), got '1e-320'",
        ),
        (["report"], "optrace report: error: the following arguments are required: trace"),
        (["frob"], "optrace: error: argument command: invalid choice: 'frob'"),
    ],
)
def test_a_bad_flag_is_one_line(linear, capsys, argv, message):
    """argparse printed its usage (four lines) before the error."""
    with pytest.raises(SystemExit) as stopped:
        main([str(linear) if a == "TRACE" else a for a in argv])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == "" and err.count("\n") == 1 and err.startswith(message), err


@pytest.mark.parametrize(
    "command, raised",
    [
        ("report", KeyboardInterrupt),
        ("export", KeyboardInterrupt),
        ("report", RuntimeError("Query interrupted")),  # DuckDB takes the SIGINT during a query and raises this
    ],
)
def test_ctrl_c_is_one_line_and_status_130(linear, tmp_path, capsys, monkeypatch, command, raised):
    """Ctrl-C printed a KeyboardInterrupt traceback of ~20 lines; now one line and the shell's status for SIGINT
    (128 + 2), as a broken pipe is one quiet exit too."""
    import reports.output.cli as cli

    def interrupted(args):
        raise raised

    monkeypatch.setattr(cli, f"_{command}", interrupted)
    argv = [command, linear] + (["-o", str(tmp_path / "out.json")] if command == "export" else [])
    try:
        rc, out, err = run(capsys, *argv)
    except KeyboardInterrupt:  # pytest would stop the session
        pytest.fail("the KeyboardInterrupt left main: a traceback for the user")
    assert (rc, out, err) == (130, "", f"optrace {command}: interrupted\n")


def test_an_infinite_mfu_is_above_100_pct_in_json(linear, tmp_path, capsys):
    """A step time of 5e-324 s in the metadata makes MFU inf: --json said "above_100_pct": [] (it tested the
    figure after it became the string "inf"), and numpy's overflow warnings came out as notes."""
    import shutil

    import pyarrow.parquet as pq

    from tracer.schema import METADATA_KEY, part_paths, read_part

    path = shutil.copytree(linear, tmp_path / "t")
    last = part_paths(path)[-1]
    table = read_part(last)
    meta = json.loads(table.schema.metadata[METADATA_KEY])
    meta["step_time"] = {"median_s": 5e-324}
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), last)
    rc, out, err = run(capsys, "report", path, "--json")
    found = json.loads(out)["mfu_details"]
    assert (rc, err) == (0, "")
    assert (found["mfu"], found["hfu"], found["above_100_pct"]) == ("inf", "inf", ["mfu", "hfu"])
