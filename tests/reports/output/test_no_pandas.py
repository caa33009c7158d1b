"""`optrace report`, `report --json`, `compare`, `compare --json`, `plan` and `plan --json` import no pandas:
no module of optrace's imports it, and pandas is not loaded when they end.

Each command runs in a fresh interpreter (runpy of reports.output.cli) whose `builtins.__import__` records every
`import pandas` statement a module of `reports` executes (the IMPORT_NAME instruction of its own code: a library
that looks pandas up from C under a reports frame, as DuckDB's `register` does, is not one): none does.

And pyarrow itself imports pandas when it converts Python or numpy values (Array.to_numpy, pyarrow.array of Python
values or of a numpy array, a Python scalar in a compute function, Schema.empty_table): the report's path converts
with reports.arrays instead, so `optrace report` and `report --json` of the example GPT (its roofline given a memory
roof) never load pandas at all: `python -X importtime` lists no module of it (test_report_loads_no_pandas).
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from tests import helpers
from tracer import Tracer
from tracer.schema import part_paths

_CHILD = textwrap.dedent(
    """
    import builtins, dis, json, runpy, sys
    found, original = set(), builtins.__import__

    def imported(name, globals=None, locals=None, fromlist=(), level=0):
        module = (globals or {}).get("__name__", "")
        if (name == "pandas" or name.startswith("pandas.")) and module.startswith("reports"):
            try:
                frame = sys._getframe(1)
            except ValueError:  # called from C with no Python frame (a DuckDB thread)
                frame = None
            if frame is not None and dis.opname[frame.f_code.co_code[frame.f_lasti]] == "IMPORT_NAME":
                callers = []  # a statement of the module's own; the modules of optrace it runs for
                while frame is not None:
                    caller = frame.f_globals.get("__name__", "")
                    if caller.startswith("reports") and caller not in callers:
                        callers.append(caller)
                    frame = frame.f_back
                found.add(" <- ".join(callers))
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = imported
    sys.argv, code = ["optrace", *sys.argv[1:]], None
    try:
        RUN
    except SystemExit as exc:
        code = exc.code
    print(json.dumps({"importers": sorted(found), "loaded": "pandas" in sys.modules, "code": code}), file=sys.stderr)
    """
)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two one-step traces of a Linear(8, 4) (tokens=4), fp32 and under a doubled batch."""
    paths = []
    for name, batch in (("small", 4), ("large", 8)):
        path = tmp_path_factory.mktemp("no-pandas") / f"{name}.parquet"
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 4, bias=False)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with Tracer(path, model=net, tokens=batch, run_name=name):
            net(torch.ones(batch, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        paths.append(str(path))
    return paths


def _run(args, run='runpy.run_module("reports.output.cli", run_name="__main__")'):
    """{importers: "module <- caller <- ..." of each `import pandas` a module of optrace executed (its callers among
    optrace's modules), loaded: pandas in sys.modules, code: exit status},
    and the command's stdout (`run`: what the child runs, `optrace ARGS` by default)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.replace("RUN", run), *args],
        capture_output=True,
        text=True,
        cwd=helpers.ROOT,
        timeout=120,
    )
    found = json.loads(done.stderr.strip().splitlines()[-1])
    assert found["code"] in (0, None), done.stderr
    return found, done.stdout


_COMMANDS = {"report": ["report"], "report --json": ["report", "--json"], "compare": ["compare"]}


@pytest.mark.parametrize("command", ["report", "report --json", "compare", "compare --json"])
def test_optrace_modules_import_no_pandas(two_runs, command):
    """No module of optrace executes an `import pandas` while the command runs, and pandas is not loaded at its end.
    On a2063a6, reports/__init__ alone imported reports.compare, and the Trace (reports.sql.engine),
    reports.sql.tables and the printers imported it; on dd7848f reports.compare, compare_words, gate and baseline."""
    args = command.split()
    found, out = _run([*args, *two_runs[: 2 if args[0] == "compare" else 1]])
    assert out.strip()  # the command printed its report
    assert found["importers"] == [] and not found["loaded"]


def test_a_baseline_file_and_the_gate_import_no_pandas(two_runs, tmp_path):
    """`compare --save-baseline`, then `compare --json BASE TRACE --fail-if ...` (reports.baseline, reports.gate):
    no module of optrace executes an `import pandas`. On dd7848f reports.baseline imported it at its top and the
    gate read its rows from a DataFrame."""
    base = tmp_path / "base.json"
    found, out = _run(["compare", "--save-baseline", str(base), two_runs[0]])
    assert found["importers"] == [] and base.is_file() and "saved the baseline of small" in out
    rules = ["--fail-if", "flops<-1%", "--fail-if", "op:aten.mm.default:flops>+150%"]
    found, out = _run(["compare", "--json", str(base), two_runs[1], *rules])
    assert found["importers"] == []
    got = json.loads(out)
    # forward mm 2 * B * 8 * 4 and the weight's gradient 2 * 4 * B * 8: 512 FLOPs at batch 4, 1024 at 8 (+100%);
    # with sum (B * 4), its gradient's and SGD's 32, the run's 560 and 1088 (+94.3%): neither rule breaks
    total = next(r for r in got["rows"] if r["phase"] == "total" and r["run"] == "large")
    assert total["flops_per_step"] == 1088 and total["flops_change_pct"] == pytest.approx(100 * 528 / 560)
    assert got["gate"] == {"checks": rules[1::2], "breaches": [], "passed": True}


def test_compare_of_runs_with_a_step_time_imports_no_pandas(tmp_path):
    """compare's MFU (a run with an untraced step time) is reports.mfu's table over reports.sql.flops' Arrow table,
    as the report's: no module of optrace executes an `import pandas`. On dd7848f reports.sql.flops.frame made it a
    DataFrame."""
    paths = []
    for name, batch in (("small", 4), ("large", 8)):
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 4, bias=False)
        with Tracer(tmp_path / name, model=net, tokens=batch, run_name=name) as tracer:
            net(torch.ones(batch, 8)).sum().backward()
            tracer.set_step_time(0.01)
        paths.append(str(tmp_path / name))
    found, out = _run(["compare", "--json", *paths])
    assert found["importers"] == []
    mfu = {r["run"]: r["mfu_pct"] for r in json.loads(out)["rows"] if r["phase"] == "total"}
    # model FLOPs per step: forward mm 2 * B * 8 * 4 and the weight's gradient as much, 128 * B, over 0.01 s: the
    # MFU of batch 8 is twice batch 4's (the same device and dtype)
    assert mfu["small"] > 0 and mfu["large"] == pytest.approx(2 * mfu["small"], rel=1e-12)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """The example GPT with fused causal attention (the causal column read), 2 steps in several parts, and a memory
    roof of 10 GB/s recorded (the roofline's tables made)."""
    path = helpers.gpt_trace(tmp_path_factory.mktemp("no-pandas") / "gpt", attention="sdpa", bandwidth=1e10)
    assert len(part_paths(path)) > 1
    return str(path)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A 2-rank job: a simulated FSDP rank (tests.tracer.distributed.test_job.simulate, a fake process group of 4
    ranks) and its copy as rank 1."""
    from tests.tracer.distributed.test_job import simulate

    root = tmp_path_factory.mktemp("no-pandas") / "job"
    simulate(root, 4)
    helpers.copy_rank(root / "rank=0", root / "rank=1", 1)
    return str(root)


# `optrace ARGS` for each ARGS of argv[1] (JSON), one after another in this process, each one's stdout after a line
_SEVERAL = """
import contextlib, io, json, sys
from reports.output.cli import main
for args in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    print("----", code)
    print(out.getvalue())
"""


def _importtime(*commands):
    """(the modules `python -X importtime` imported while it ran `optrace ARGS` for each ARGS of `commands`, one after
    another in one child: a module is imported once, so none imported pandas if it is not listed; their stdouts)."""
    import json as json_

    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _SEVERAL, json_.dumps(commands)],
        capture_output=True,
        text=True,
        cwd=helpers.ROOT,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "reports.sql.engine" in imported and "pyarrow" in imported  # the importtime lines are read
    runs = done.stdout.split("---- ")[1:]
    assert [run.split("\n", 1)[0] for run in runs] == ["0"] * len(commands)  # each command's exit status
    return imported, [run.split("\n", 1)[1] for run in runs]


def _pandas(imported):
    return [m for m in imported if m.split(".")[0] == "pandas" or m == "pyarrow.pandas_compat"]


def test_report_loads_no_pandas(gpt):
    """`python -X importtime` running `optrace report T`, `report --full T` and `report --json T` imports no module
    of pandas, nor pyarrow's pandas shim (pyarrow.pandas_compat, imported with it): every section of the report
    (--full: explain and the roofline too) is made and printed without it. On dd7848f, the first conversion
    (reports.sql.rowpass's `seq` column to numpy) imported it, and --json's roofline imported it at the top of
    reports.time.roofline."""
    imported, (text, full, js) = _importtime(["report", gpt], ["report", "--full", gpt], ["report", "--json", gpt])
    assert _pandas(imported) == []
    roofline = json.loads(js)["roofline"]
    assert roofline["available"] and roofline["peak_bytes_per_s"] == 1e10  # the roofline's tables were made
    assert "Memory: peak" in text and "Memory: peak" in full
    assert "Roofline, per step" not in text and "Roofline, per step" in full


def test_report_of_a_job_loads_no_pandas(job):
    """The distributed sections too (reports.distributed.sql_ranks: the job's traffic per step, the ranks side by side
    and their imbalance), in `report` and `report --json`: on dd7848f, reports.distributed.collectives imported pandas
    at its top."""
    imported, (text, js) = _importtime(["report", job], ["report", "--json", job])
    assert _pandas(imported) == []
    found = json.loads(js)
    assert [r["rank"] for r in found["ranks"]] == [0, 1] and found["imbalance"]
    assert found["distributed"]["world_size"] == 4 and found["distributed"]["collectives"]
    assert "Distributed: rank 0 of world size 4" in text and "Ranks (2 of 4)" in text and "Imbalance" in text


@pytest.mark.parametrize("command", ["plan", "plan --json"])
def test_plan_imports_no_pandas(two_runs, command):
    """`optrace plan` and `plan --json` read the trace through the Trace (reports.plan.rows.trace_runs) and plan its
    Arrow rows: no module of optrace executes an `import pandas`. On 73896a2 thirteen did (reports.plan.plan, .ops and
    .pipeline at their top; reports.loading.load, reports.tables, reports.memory.frame_rows, reports.steps, ...)."""
    found, out = _run([*command.split(), two_runs[0], "--gpu", "H100"])
    assert found["importers"] == [] and not found["loaded"]
    if command == "plan":
        assert out.startswith("optrace plan: small on H100 SXM (8 per node), world size 1, micro-batch 4 (traced 4)")
    else:
        # model FLOPs per step: forward mm 2 * 4 * 8 * 4 = 256, the weight's gradient as much, sum 4 * 4 = 16: 528
        # (SGD's 32 are the optimizer's)
        assert json.loads(out)["model_flops_per_step"] == 528


def test_the_recorder_sees_an_import():
    """The child's recorder names the module of optrace that imports pandas when one does (the library's tables:
    reports.tables, at its top), and not pyarrow's or DuckDB's look-ups of it."""
    found, _ = _run([], run="import reports; reports.by_op")
    assert "reports.tables <- reports" in found["importers"] and found["loaded"]


def test_export_loads_no_pandas(two_runs, tmp_path):
    """`optrace export` to JSON: no module of optrace executes an `import pandas`, and pandas is not loaded at its end.
    On f3dcb3d pyarrow loaded it: pq.read_table (its pyarrow.dataset) for the first op's start, pyarrow.array of the
    role storage ids, Array.to_numpy in the seq check and the role rows, and Python strings given to compute
    functions to join each op's args."""
    out = tmp_path / "small.json"
    found, said = _run(["export", two_runs[0], "-o", str(out)])
    assert found["importers"] == [] and not found["loaded"]
    ops = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    # the Linear's forward mm (2 * 4 * 8 * 4 = 256 FLOPs) and its weight gradient's (2 * 4 * 4 * 8 = 256)
    assert sorted(e["args"]["flops"] for e in ops if e["args"]["op"] == "aten.mm.default") == [256, 256]
