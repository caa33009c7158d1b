"""`optrace compare` and reports.compare on distributed traces (a `rank=R` directory per rank): every rank of every
trace given is compared, and a gate sees the second trace.

Two 2-rank jobs made from one-process traces by tests.helpers.copy_rank (the layout torchrun's ranks write): `a` a
step of Linear(8, 4), `b` of Linear(8, 8), both without bias, on T = 2 rows of x that need no gradient.
Forward: the matmul, 2·T·8·4 = 128 FLOPs in `a`, 2·T·8·8 = 256 in `b`, and the sum of y. `p`: a job whose rank 0
is a's step and rank 1 b's, to show that each run is compared with the baseline trace's run of its rank."""

import contextlib
import io
import json

import pytest
import torch

import reports
from reports.output.cli import main
from tests.helpers import copy_rank
from tracer import Tracer


def _job(root, name, *widths):
    """A 2-rank job `name` whose rank R traced a step of Linear(8, widths[R]) (one width: both ranks)."""
    for rank, width in enumerate(widths * 2 if len(widths) == 1 else widths):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, width, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        one = root / f"one{rank}" / name  # the run is named by this directory: `a`, its ranks `a/rank=R`
        with Tracer(one, model=model, tokens=2):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        copy_rank(one, root / name / f"rank={rank}", rank)
    return str(root / name)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare_ranks")
    return _job(root, "a", 4), _job(root, "b", 8)


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """`p`, a job whose ranks differ (as pipeline stages do): rank 0 Linear(8, 4), rank 1 Linear(8, 8)."""
    return _job(tmp_path_factory.mktemp("compare_stages"), "p", 4, 8)


def _cli(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["compare", *argv])
    return code, out.getvalue()


def test_the_library_compares_every_rank_of_each_trace(jobs):
    a, b = jobs
    table = reports.compare([a, b])
    forward = table[table["phase"] == "forward"].set_index("run")
    # before: only a's two ranks, b left out ["a/rank=0", "a/rank=1"]
    assert list(forward.index) == ["a/rank=0", "a/rank=1", "b/rank=0", "b/rank=1"]
    # the matmul and the sum's 1 per element of y: 2·2·8·4 + 2·4 = 136 in a, 2·2·8·8 + 2·8 = 272 in b
    assert forward["flops_per_step"].tolist() == [136, 136, 272, 272]
    assert forward["flops_change_pct"].tolist() == [0.0, 0.0, 100.0, 100.0]  # (272 - 136) / 136 = +100%


def test_the_cli_compares_every_rank_and_its_gate_sees_the_second_trace(jobs):
    a, b = jobs
    code, text = _cli(a, b, "--json")
    runs = json.loads(text)["runs"]
    assert runs == ["a/rank=0", "a/rank=1", "b/rank=0", "b/rank=1"]  # before: ["a/rank=0", "a/rank=1"]
    # b's step: forward 256 + backward dL/dW 256 + SGD's update more than a's: a breach of flops>+1%, exit 1
    # (before: a's rank 1 against its rank 0, no change, exit 0: the gate passed a trace it never read)
    code, text = _cli(a, b, "--fail-if", "flops>+1%")
    assert code == 1
    assert "b/rank=0 total flops" in text and "b/rank=1 total flops" in text


def test_a_baseline_file_against_a_distributed_trace_compares_each_rank(jobs, tmp_path):
    a, b = jobs
    base = tmp_path / "base.json"
    reports.save_baseline(f"{a}/rank=0", str(base))
    table = reports.compare([str(base), b])
    # the baseline (a rank's directory keeps its rank in its name), then each of b's ranks
    assert sorted(set(table["run"])) == ["a/rank=0", "b/rank=0", "b/rank=1"]


def test_an_empty_trace_after_a_distributed_one_is_refused_in_one_line(jobs, tmp_path, capsys):
    a, _ = jobs
    with Tracer(tmp_path / "empty"):
        pass
    # before: the CLI checked the first runs of the Trace (a's two ranks) against the paths given, so the empty
    # trace passed and printed every figure as a fall of 100%, exit 0; the library gave it 0 FLOPs per phase
    assert main(["compare", a, str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"optrace compare: error: {tmp_path / 'empty'}: the trace has no ops (nothing ran inside `with Tracer(...)`); "
        "nothing to compare"
    )
    with pytest.raises(reports.ReportError, match="empty: the trace has no ops"):
        reports.compare([a, str(tmp_path / "empty")])


def test_a_frame_filtered_to_one_rank_compares_that_rank_of_each_trace(jobs):
    a, b = jobs
    df = reports.load([a, b])
    table = reports.compare(df[df["rank"] == 1])
    forward = table[table["phase"] == "forward"].set_index("run")
    # before: a/rank=0 and b/rank=0, whose rows were filtered out, stood as runs of 0 FLOPs, a/rank=0 the baseline:
    # every change +inf%
    assert list(forward.index) == ["a/rank=1", "b/rank=1"]
    assert forward["flops_change_pct"].tolist() == [0.0, 100.0]  # 136 -> 272 FLOPs per step


def test_a_distributed_trace_compares_with_itself(jobs):
    a, _ = jobs
    code, text = _cli(a, a, "--json")  # before: "rank=0 and rank=0 hold the same trace", exit 2
    found = json.loads(text)
    assert code == 0 and found["runs"] == ["a/rank=0", "a/rank=1", "a/rank=0#2", "a/rank=1#2"]
    forward = [(r["run"], r["flops_per_step"], r["flops_change_pct"]) for r in found["rows"] if r["phase"] == "forward"]
    assert forward == [(run, 136, 0.0) for run in found["runs"]]  # 2·2·8·4 + 2·4 = 136 in every run


# `p`: rank 0 a step of Linear(8, 4), rank 1 of Linear(8, 8); per step: forward 2·2·8·w + 2·w (136 / 272), backward
# dL/dW 2·2·8·w (128 / 256), SGD's update w·8 (32 / 64): totals 296 and 592 FLOPs


def test_each_run_is_compared_with_the_baseline_traces_run_of_its_rank(jobs, stages):
    _, b = jobs
    table = reports.compare([stages, b])
    total = table[table["phase"] == "total"].set_index("run")
    assert list(total.index) == ["p/rank=0", "p/rank=1", "b/rank=0", "b/rank=1"]
    assert total["flops_per_step"].tolist() == [296, 592, 592, 592]
    # p/rank=1 is a baseline (0.0, as p/rank=0's row), not (592 - 296) / 296 = +100% against p/rank=0; b/rank=0
    # against p/rank=0 (592 - 296) / 296 = +100%; b/rank=1 against p/rank=1: 0.0 (before: +100% against p/rank=0)
    assert total["flops_change_pct"].tolist() == [0.0, 0.0, 100.0, 0.0]
    # the peaks: 328 B (width 4), 584 B (width 8); b/rank=0 (584 - 328) / 328 = +78.05%
    assert total["peak_live_bytes"].tolist() == [328, 584, 584, 584]
    assert total["peak_live_bytes_change_pct"].round(2).tolist() == [0.0, 0.0, 78.05, 0.0]


def test_the_gate_checks_each_rank_against_its_rank(jobs, stages):
    a, _ = jobs
    # a's ranks: 296 FLOPs each; against p/rank=1's 592, a/rank=1 fell (296 - 592) / 592 = -50%
    code, text = _cli(stages, a, "--fail-if", "flops<-1%")
    assert code == 1  # before: a/rank=1 against p/rank=0 (296 against 296), exit 0
    assert "BREACH flops<-1%: a/rank=1 total flops 296 FLOPs/step against 592 in p/rank=1 (-50.00%)" in text
    assert "a/rank=0 total flops" not in text  # 296 against p/rank=0's 296
    # before: p's own rank 1 against its rank 0 (592 against 296, +100%) breached, exit 1
    code, text = _cli(stages, a, "--fail-if", "flops>+1%")
    assert code == 0 and "Gate: 1 check, 0 breached" in text


def test_the_cli_says_which_run_is_against_which(jobs, stages):
    _, b = jobs
    code, text = _cli(stages, b)
    assert code == 0
    assert text.splitlines()[0] == (
        "optrace compare: b/rank=0 against p/rank=0; b/rank=1 against p/rank=1 (baselines by rank: p/rank=0, "
        "p/rank=1); per step, except peak_live"
    )  # before: "p/rank=1, b/rank=0, b/rank=1 against p/rank=0 (baseline)"
    assert "What changed in p/rank=1" not in text
    assert "What changed in b/rank=1:\n  no change: the same ops, FLOPs, bytes, peak and dtypes per step" in text
    code, text = _cli(stages, b, "--json")
    found = json.loads(text)
    assert found["baseline"] == "p/rank=0"
    assert found["baselines"] == {  # before: no key
        "p/rank=0": "p/rank=0",
        "p/rank=1": "p/rank=1",
        "b/rank=0": "p/rank=0",
        "b/rank=1": "p/rank=1",
    }
    assert list(found["changes"]) == ["b/rank=0", "b/rank=1"]  # before: p/rank=1 too, +100% FLOPs


def test_a_baseline_named_pairs_within_its_trace_and_a_frame_pairs_too(jobs, stages):
    _, b = jobs
    # baseline p/rank=1, a rank of p: p's ranks are the baselines, b/rank=0 against p/rank=0 (592 - 296) / 296 =
    # +100%, b/rank=1 against p/rank=1: 0.0 (before: every run against p/rank=1, p/rank=0 (296 - 592) / 592 = -50%)
    table = reports.compare([stages, b], baseline="p/rank=1")
    total = table[table["phase"] == "total"].set_index("run")
    assert total["flops_change_pct"].tolist() == [0.0, 0.0, 100.0, 0.0]  # before: [-50.0, 0.0, 0.0, 0.0]
    # a frame of both traces pairs as the paths do: b/rank=1 against p/rank=1 (before: +100% against p/rank=0)
    table = reports.compare(reports.load([stages, b]))
    total = table[table["phase"] == "total"].set_index("run")
    assert total["flops_change_pct"].tolist() == [0.0, 0.0, 100.0, 0.0]
