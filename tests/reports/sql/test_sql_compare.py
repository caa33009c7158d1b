"""`optrace compare` (reports.compare: compare.sql's views over the files or a frame's rows) gives the table of
the pandas oracle (tests/oracles/compare.py).

Two runs of a small MLP (2 steps at batch 4, 3 steps at batch 8) and a GPT trace cut mid-step (its
backward and optimizer ran in fewer steps than its forward), by phase, op and module. Every column
equal to the pandas reference, floats to the last bit: both divide the same integer totals by the
same step counts and add the phases in the same order.
"""

import json
import shutil
import warnings

import pandas as pd
import pytest
import torch

import reports
from reports.compare import compare
from reports.errors import ReportError
from reports.sql.engine import Trace
from tests.oracles.compare import compare as oracle
from tests.reports.sql.test_sql import _gpt
from tracer import Tracer


def _mlp(path, steps, batch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(path, model=model, tokens=batch) as t:
        for _ in range(steps):
            model(torch.randn(batch, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            t.step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cut trace warns that it is incomplete
        return [_mlp(root / "a", 2, 4), _mlp(root / "b", 3, 8), _gpt(root / "cut", 2, cut=True)]


@pytest.mark.parametrize("by", ["phase", "op", "module"])
def test_compare_equals_the_reference(runs, by):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = oracle(reports.load(runs), by=by)
        got = compare(Trace(runs), by=by)
        library = reports.compare(reports.load(runs), by=by)  # the same views over the loaded rows
    pd.testing.assert_frame_equal(got, want)
    pd.testing.assert_frame_equal(library, got)
    total = got[got[by] == "total"].set_index("run")
    # per step at batch B: forward addmm 2*B*8*16 + 2*B*16*4 = 384*B; backward dW2, dX2, dW1 512*B; relu,
    # sum, the bias gradients' sums and threshold_backward 16*B + 4*B + 4*B + 16*B + 16*B = 56*B; SGD's add_
    # one FLOP per parameter 8*16 + 16 + 16*4 + 4 = 212: 952*4 + 212 = 4020, 952*8 + 212 = 7828, the same over
    # 2 and 3 steps
    assert total.loc["a", "flops_per_step"] == 4020.0
    assert total.loc["b", "flops_per_step"] == 7828.0
    assert total["steps"].tolist() == [2, 3, 3]


def test_baseline_and_bad_values(runs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = Trace(runs[:2])
        want = oracle(reports.load(runs[:2]), by="phase", baseline="b")
    pd.testing.assert_frame_equal(compare(trace, by="phase", baseline="b"), want)
    with pytest.raises(ReportError, match=r"compare: by must be one of \['phase', 'op', 'module'\], got 'dtype'"):
        compare(trace, by="dtype")
    with pytest.raises(ReportError, match=r"compare: baseline 'c' is not one of the runs \['a', 'b'\]"):
        compare(trace, baseline="c")


@pytest.mark.parametrize("flags", [["--by", "op"], ["--by", "module", "--json"]])
def test_the_cli_prints_the_same_from_either_engine(runs, capsys, flags):
    from reports.output.cli import main

    outs = []
    for engine in ("pandas", "sql"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["compare", *map(str, runs), "--engine", engine, *flags]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "flops" in outs[0]


@pytest.mark.parametrize("timed", [False, True])
def test_the_flop_frame_is_cut_only_for_a_run_with_a_step_time(runs, tmp_path, capsys, monkeypatch, timed):
    """compare passes reports.mfu no step time, so a run's MFU is NaN unless its metadata holds an untraced one: the
    SQL engine cuts MFU's small table (reports.sql.flops.table, mfu_only) only when a run has one, and prints what
    the pandas engine prints either way. Timed: run b says it ran on an H100 at 0.01 s per untraced step."""
    from reports.flops.peaks import peak_flops
    from reports.output.cli import main
    from reports.sql import flops
    from tests.reports.loading.test_damage import rewrite, set_metadata
    from tracer.schema import part_paths

    b = shutil.copytree(runs[1], tmp_path / "b")
    device = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}
    for part in part_paths(b) if timed else ():
        rewrite(part, set_metadata(step_time={"median_s": 0.01}, device=device))
    cut = []
    monkeypatch.setattr(flops, "table", lambda trace, f=flops.table, **kw: cut.append(kw) or f(trace, **kw))
    outs = []
    for engine in ("pandas", "sql"):
        assert main(["compare", str(runs[0]), str(b), "--engine", engine, "--json"]) == 0
        outs.append(capsys.readouterr().out)
    # both engines run the views (the pandas engine over the rows reports.load read): one cut each, when timed
    assert outs[0] == outs[1] and cut == ([{"mfu_only": True}] * 2 if timed else [])
    mfu = {r["run"]: r["mfu_pct"] for r in json.loads(outs[1])["rows"] if r["phase"] == "total"}
    assert mfu["a"] is None
    if timed:  # model FLOPs per step at batch 8: 952 * 8 = 7616 (test_compare_equals_the_reference), float32 matmuls
        assert mfu["b"] == pytest.approx(100 * 7616 / 0.01 / peak_flops(device, "float32")[0], rel=1e-12)
    else:
        assert mfu["b"] is None
