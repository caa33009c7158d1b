"""reports.compare: an fp32 run against a bf16 autocast run of the same MLP, and two different models.

MLP: Linear(4, 8) -> ReLU -> Linear(8, 2) on x [3, 4]. Under torch.autocast("cpu", bfloat16) every
matmul writes bfloat16 (2 bytes) where fp32 writes float32 (4 bytes): half the output bytes.
"""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from reports.compare import compare
from reports.errors import ReportError
from reports.flops.mfu import mfu
from reports.loading.load import load
from reports.output.cli import main
from tracer import Tracer


def trace(path, model, dtype=None, run_name=None, steps=1):
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    with Tracer(path, model=model, run_name=run_name, tokens=3) as tracer:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        tracer.set_step_time(0.01)
    return path


def mlp(*widths):
    torch.manual_seed(0)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    return [
        trace(d / "fp32.parquet", mlp(4, 8, 2), run_name="fp32"),
        trace(d / "bf16.parquet", mlp(4, 8, 2), dtype=torch.bfloat16, run_name="bf16", steps=2),
    ]


@pytest.fixture(scope="module")
def runs(paths):
    return load(paths)


def row(table, key, run, by="op"):
    return table[(table[by] == key) & (table["run"] == run)].iloc[0]


def test_bf16_halves_the_matmul_output_bytes(runs):
    table = compare(runs, by="op")
    for op in ("aten.mm.default", "aten.addmm.default"):
        bf16 = row(table, op, "bf16")
        # signed: 2 bytes per bfloat16 element against 4 per float32: (2 - 4) / 4 = -50% (the ratio 0.5 before)
        assert bf16["bytes_allocated_change_pct"] == -50.0
        assert bf16["flops_change_pct"] == 0.0  # the same arithmetic
        assert row(table, op, "fp32")["bytes_allocated_change_pct"] == 0.0
    # forward: addmm [3, 4] @ [4, 8] -> [3, 8] and [3, 8] @ [8, 2] -> [3, 2]: (24 + 6) * 4 bytes per fp32 step
    assert row(table, "aten.addmm.default", "fp32")["bytes_allocated_per_step"] == (24 + 6) * 4
    assert row(table, "aten.addmm.default", "bf16")["bytes_allocated_per_step"] == (24 + 6) * 2
    # the casts exist only under autocast: x / 0
    assert row(table, "aten._to_copy.default", "bf16")["bytes_allocated_change_pct"] == np.inf
    assert row(table, "aten._to_copy.default", "fp32")["ops_per_step"] == 0


def test_layout_and_order(runs):
    table = compare(runs)  # by phase, baseline the first run
    assert list(table.columns) == [
        "phase",
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
    ]
    assert list(table["phase"][:2]) == ["total", "total"] and list(table["run"][:2]) == ["fp32", "bf16"]
    assert dict(zip(table["run"], table["steps"])) == {"fp32": 1, "bf16": 2}  # values are per step
    base = table[table["run"] == "fp32"]
    assert (base[["flops_change_pct", "bytes_allocated_change_pct", "peak_live_bytes_change_pct"]] == 0.0).all().all()
    assert (base["change_pct"] == 0).all()
    keys = table.loc[table["phase"] != "total"]
    per_key = keys["change_pct"].abs().groupby(keys["phase"], sort=False).max()
    assert list(per_key) == sorted(per_key, reverse=True)  # biggest differences first
    fp32 = runs[runs["run"] == "fp32"]
    total = row(table, "total", "fp32", by="phase")
    assert total["flops_per_step"] == fp32["flops"].sum()
    assert total["peak_live_bytes"] == fp32["live_bytes"].max()
    assert total["traced_us_per_step"] == pytest.approx(fp32["duration_ns"].sum() / 1000)


def test_mfu_on_the_total_rows(runs):
    table = compare(runs)
    rates = mfu(runs).set_index("run")["mfu"]
    totals = table[table["phase"] == "total"].set_index("run")["mfu_pct"]
    np.testing.assert_allclose(totals.to_numpy(), 100 * rates.reindex(totals.index).to_numpy(), equal_nan=True)
    assert table.loc[table["phase"] != "total", "mfu_pct"].isna().all()


def test_baseline_and_paths(runs, paths):
    table = compare(runs, by="op", baseline="bf16")
    assert row(table, "aten.mm.default", "fp32")["bytes_allocated_change_pct"] == 100.0  # 4 bytes against 2
    assert list(table["run"][:2]) == ["fp32", "bf16"]
    from_paths = compare([str(p) for p in paths], by="op")
    pd.testing.assert_frame_equal(
        from_paths.drop(columns=["traced_us_per_step", "traced_us_change_pct", "mfu_pct"]),
        compare(runs, by="op").drop(columns=["traced_us_per_step", "traced_us_change_pct", "mfu_pct"]),
    )


def test_different_models_compare_by_op_and_phase(tmp_path):
    small = trace(tmp_path / "small.parquet", mlp(4, 8, 2), run_name="small")  # 2 Linear layers
    deep = trace(tmp_path / "deep.parquet", mlp(4, 16, 16, 2), run_name="deep")  # 3 Linear layers
    df = load([small, deep])
    by_op = compare(df, by="op")
    assert row(by_op, "aten.addmm.default", "deep")["ops_per_step"] == 3
    assert row(by_op, "aten.addmm.default", "small")["ops_per_step"] == 2
    # forward matmul FLOPs: 2 * 3 * (4*16 + 16*16 + 16*2) = 2112 against 2 * 3 * (4*8 + 8*2) = 288
    assert row(by_op, "aten.addmm.default", "deep")["flops_change_pct"] == pytest.approx(100 * (2112 / 288 - 1))
    assert set(compare(df, by="phase")["phase"]) == {"total", "forward", "backward", "optimizer"}
    by_module = compare(df, by="module")
    assert row(by_module, "4", "small", by="module")["ops_per_step"] == 0  # the deep model's third Linear
    assert row(by_module, "4", "deep", by="module")["ops_per_step"] > 0


def test_empty_keeps_dtypes(runs):
    empty, full = compare(runs.iloc[0:0]), compare(runs)
    assert list(empty["phase"]) == ["total", "total"]
    assert empty.dtypes.to_dict() == full.dtypes.to_dict()


def test_errors(runs):
    with pytest.raises(ReportError, match=r"compare: by must be one of \['phase', 'op', 'module'\], got 'dtype'"):
        compare(runs, by="dtype")
    with pytest.raises(ReportError, match=r"compare: baseline 'fp16' is not one of the runs \['fp32', 'bf16'\]"):
        compare(runs, baseline="fp16")
    with pytest.raises(ReportError, match=r"compare: expected a DataFrame from reports.load or trace paths, got int"):
        compare(42)
    with pytest.raises(ReportError, match=r"compare: the trace lacks column\(s\) \['duration_ns'\]"):
        compare(runs.drop(columns="duration_ns"))
    with pytest.raises(ReportError, match=r"no such file or directory"):
        compare(["/nonexistent/trace.parquet"])


# Keys that would collide with the whole-run "total" row: a model whose child module is named `total` (an attribute
# `self.total = nn.Linear(8, 4)`) gives the compare-by-module key "total", the name of each run's whole-run row.
class _Totals(nn.Module):
    def __init__(self):
        super().__init__()
        self.total = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.total(x)


def _trace(path, batch):
    torch.manual_seed(0)
    model = _Totals()
    with Tracer(path, model=model, tokens=batch):
        model(torch.randn(batch, 8)).sum().backward()
    return path


@pytest.fixture(scope="module")
def totals(tmp_path_factory):
    root = tmp_path_factory.mktemp("review")
    return [_trace(root / "b2.parquet", 2), _trace(root / "b4.parquet", 4)]


def test_a_module_named_total_is_its_own_key(totals):
    table = compare(load(totals), by="module")
    whole = table[table["module"] == "total"]
    module = table[table["module"] == "total (module)"]
    assert list(whole["run"]) == ["b2", "b4"] and list(module["run"]) == ["b2", "b4"]
    # the Linear's forward mm: 2 * batch * 8 * 4 FLOPs = 128 (batch 2), 256 (batch 4); its weight gradient
    # mm in the backward is as many (the input needs no gradient): 256 and 512 per step, x 2.0
    assert list(module["flops_per_step"]) == [256.0, 512.0]
    assert list(module["flops_change_pct"]) == [0.0, 100.0]  # x 2.0: +100%
    # the whole run adds the sum (2 * 4 = 8 and 4 * 4 = 16 FLOPs): 264 and 528
    assert list(whole["flops_per_step"]) == [264.0, 528.0]


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_the_cli_compares_a_module_named_total(totals, capsys, engine):
    main(["compare", *map(str, totals), "--by", "module", "--json", "--engine", engine])
    rows = json.loads(capsys.readouterr().out)["rows"]
    module = [r for r in rows if r["module"] == "total (module)"]
    assert [r["flops_per_step"] for r in module] == [256, 512]  # as above


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_the_data_of_each_iteration_is_one_per_step_whatever_the_steps_traced(loops, capsys, engine):
    # k iterations make k randn batches; the step rule puts the first two in step 0 (the second runs after
    # step 0's optimizer, before step 1's forward), so "other" has rows in k - 1 steps. Per step it must be
    # one randn, not k / (k - 1) of one (2 at k = 2, 1.5 at k = 3, as it was).
    main(["compare", *map(str, loops), "--json", "--engine", engine])
    rows = {(r["phase"], r["run"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["other", "s2"]["ops_per_step"] == 1 and rows["other", "s3"]["ops_per_step"] == 1
    # randn(4, 8) and randn(8, 8) in float32: 4 * 8 * 4 = 128 and 8 * 8 * 4 = 256 bytes, x 2.0
    assert (
        rows["other", "s2"]["bytes_allocated_per_step"] == 128
        and rows["other", "s3"]["bytes_allocated_per_step"] == 256
    )
    assert rows["other", "s3"]["bytes_allocated_change_pct"] == 100  # x 2.0: +100% (the ratio 2 before)
    # a step is 34 ops at either batch and step count: 1 randn + 8 forward + 21 backward + 4 SGD add_
    assert rows["total", "s2"]["ops_per_step"] == 34 and rows["total", "s3"]["ops_per_step"] == 34


# ------------------------------------------------------------------ signed changes, the words, the gate, baselines
class _Checkpointed(nn.Module):
    """mlp(4, 8, 2) under activation checkpointing: the backward re-runs the forward it needs."""

    def __init__(self):
        super().__init__()
        self.body = mlp(4, 8, 2)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.body, x, use_reentrant=False)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory, paths):
    d = tmp_path_factory.mktemp("gate")
    plain = trace(d / "plain", mlp(4, 8, 2), run_name="plain")
    again = trace(d / "again", mlp(4, 8, 2), run_name="again")
    ckpt = trace(d / "ckpt", _Checkpointed(), run_name="ckpt")
    return {"plain": str(plain), "again": str(again), "ckpt": str(ckpt), "dir": d}


def test_a_fall_is_a_negative_change(runs):
    total = row(compare(runs), "total", "bf16", by="phase")
    # bytes allocated per step: fp32 1,696, bf16 1,452 (matmul outputs in 2 bytes, not 4, plus the casts):
    # (1452 - 1696) / 1696 = -14.39%: signed, where change_pct printed an unsigned 14.4%
    assert (
        total["bytes_allocated_per_step"],
        row(compare(runs), "total", "fp32", by="phase")["bytes_allocated_per_step"],
    ) == (1452, 1696)
    assert total["bytes_allocated_change_pct"] == pytest.approx(100 * (1452 - 1696) / 1696)
    assert total["change_pct"] == pytest.approx(100 * (1452 - 1696) / 1696)  # the larger move, its sign kept


@pytest.mark.parametrize("source", ["paths", "frame"])
def test_what_changed_in_words(paths, runs, source):
    from reports.compare import runs_of_sources
    from reports.compare_words import changes

    words = changes(runs_of_sources([str(p) for p in paths] if source == "paths" else runs))["bf16"]
    assert words[0] == "totals: FLOPs/step +0.0%, bytes allocated/step -14.4%, peak live bytes -0.2%, ops/step +3.5%"
    assert words[1] == "ops added: aten._to_copy.default (9/step)"  # autocast's casts
    assert words[2].startswith("dtype float32 -> bfloat16: aten.t.default, aten.addmm.default,")
    # at the peak the loss's activation is one bfloat16 element, 2 bytes, against 4 in float32: -50%
    assert words[-1] == "memory at peak: activations 4 -> 2 bytes (-50.0%)"


def test_the_gate_fails_on_recompute_and_passes_on_the_same_run(checkpointed, capsys):
    from reports import check

    # recompute adds the checkpointed forward it re-runs: addmm [3, 4] @ [4, 8] 2 * 3 * 4 * 8 = 192, relu 3 * 8 = 24:
    # 1,254 + 216 = 1,470 FLOPs per step, +17.22%
    found = check(checkpointed["ckpt"], checkpointed["plain"], ["flops>+1%", "peak_live_bytes>+5%"])
    assert [(b.rule, b.run, b.value, b.base) for b in found] == [("flops>+1%", "ckpt", 1470.0, 1254.0)]
    assert str(found[0]) == "flops>+1%: ckpt total flops 1,470 FLOPs/step against 1,254 in plain (+17.22%)"
    assert check(checkpointed["again"], checkpointed["plain"], ["flops>+0%", "peak_live_bytes>+0%", "ops>+0"]) == []
    rc = main(
        ["compare", checkpointed["plain"], checkpointed["ckpt"], "--fail-if", "flops>+1%", "--fail-if", "ops>+50%"]
    )
    out, err = capsys.readouterr()
    assert rc == 1
    assert "Gate: 2 checks, 1 breached\n  BREACH flops>+1%: ckpt total flops 1,470 FLOPs/step" in out
    assert (
        err
        == "optrace compare: breach: flops>+1%: ckpt total flops 1,470 FLOPs/step against 1,254 in plain (+17.22%)\n"
    )
    # 216 FLOPs/step in the recompute rows: 216 / 1470 = 14.7% of the run's FLOPs
    assert "  recompute: new, 216 FLOPs/step in " in out and "(14.7% of its FLOPs): checkpointing re-runs" in out
    assert main(["compare", checkpointed["plain"], checkpointed["again"], "--fail-if", "flops>+0%"]) == 0
    # a named key: the forward's FLOPs did not change (the recompute runs in the backward), the backward's did
    assert check(checkpointed["ckpt"], checkpointed["plain"], ["phase:forward:flops>+0%"]) == []
    assert [b.key for b in check(checkpointed["ckpt"], checkpointed["plain"], ["phase:backward:flops>+0%"])] == [
        "backward"
    ]


def test_a_baseline_file_gives_the_trace_baseline_table(checkpointed, capsys):
    base = checkpointed["dir"] / "base.json"
    assert main(["compare", "--save-baseline", str(base), checkpointed["plain"]]) == 0
    assert (
        capsys.readouterr().out == f"optrace compare: saved the baseline of plain ({checkpointed['plain']}) to {base}\n"
    )
    for by in ("phase", "op", "module"):
        from_trace = compare([checkpointed["plain"], checkpointed["ckpt"]], by=by)
        from_file = compare([str(base), checkpointed["ckpt"]], by=by)
        pd.testing.assert_frame_equal(from_file, from_trace)  # the same figures, to the last bit
    # against the same trace: the baseline's run is renamed, the figures equal
    table = compare([str(base), checkpointed["plain"]], by="op")
    assert list(table["run"][:2]) == ["plain (baseline)", "plain"] and (table["flops_change_pct"] == 0).all()
    assert main(["compare", str(base), checkpointed["ckpt"], "--fail-if", "flops>+1%", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["gate"]["passed"] is False and [b["rule"] for b in got["gate"]["breaches"]] == ["flops>+1%"]
    assert got["gate"]["breaches"][0]["change"] == pytest.approx(100 * (1470 - 1254) / 1254)


def test_a_baseline_file_lists_the_steps_in_phase_order(checkpointed, tmp_path):
    """The file's `steps` in tracer.schema.PHASES' order whatever order the trace's phase_steps rows came in (DuckDB's
    GROUP BY gives none: four saves of one trace wrote its `steps` lines in three orders), so a committed baseline
    does not change when saved again from the same trace."""
    from reports.baseline import write_baseline
    from reports.compare import figures
    from reports.sql.engine import Trace

    with Trace(checkpointed["plain"]) as t:
        run = figures(t)[0]
    files = []
    for n, steps in enumerate(({"other": 4, "optimizer": 3, "backward": 2, "forward": 1}, {"other": 4, "forward": 1})):
        run.steps = steps
        write_baseline(run, tmp_path / f"{n}.json", "plain")
        files.append(json.loads((tmp_path / f"{n}.json").read_text()))
    assert list(files[0]["steps"].items()) == [("forward", 1), ("backward", 2), ("optimizer", 3), ("other", 4)]
    assert list(files[1]["steps"].items()) == [("forward", 1), ("other", 4)]


@pytest.mark.parametrize(
    "expr, message",
    [
        (
            "flops=1%",
            r"--fail-if 'flops=1%': expected \[phase\|op\|module:NAME:\]METRIC\(>\|>=\|<\|<=\)\[\+\|-\]NUMBER\[%\]",
        ),
        (
            "flop>+1%",
            r"--fail-if 'flop>\+1%': metric 'flop' is not one of ops, flops, bytes_allocated, peak_live_bytes",
        ),
        ("flops>+x%", r"--fail-if 'flops>\+x%': expected \["),
        (
            "op:aten.nope.default:flops>+0%",
            r"--fail-if 'op:aten.nope.default:flops>\+0%': no op 'aten.nope.default' in any run \(plain, ckpt\)",
        ),
    ],
)
def test_a_bad_gate_is_one_line(checkpointed, capsys, expr, message):
    from reports import check

    with pytest.raises(ReportError, match=message):
        check(checkpointed["ckpt"], checkpointed["plain"], [expr])
    assert main(["compare", checkpointed["plain"], checkpointed["ckpt"], "--fail-if", expr]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("optrace compare: error: --fail-if ")


def test_gate_raises_for_a_test(checkpointed):
    from reports import gate
    from reports.gate import Breached

    gate(checkpointed["again"], checkpointed["plain"], ["flops>+0%"])  # nothing changed: no error
    with pytest.raises(Breached, match=r"^flops>\+1%: ckpt total flops 1,470"):
        gate(checkpointed["ckpt"], checkpointed["plain"], ["flops>+1%"])
    with pytest.raises(ReportError, match="not a baseline file"):
        (checkpointed["dir"] / "bad.json").write_text("{}")
        gate(checkpointed["ckpt"], str(checkpointed["dir"] / "bad.json"), ["flops>+1%"])


def test_modules_at_a_depth(checkpointed):
    # depth 1 sums body.0, body.1 and body.2 into "body": the forward and the recompute of the checkpointed MLP
    deep = compare([checkpointed["ckpt"]] * 1 + [checkpointed["ckpt"]], by="module")
    shallow = compare([checkpointed["ckpt"], checkpointed["ckpt"]], by="module", depth=1)
    run = deep["run"].iloc[0]
    parts = deep[(deep["run"] == run) & deep["module"].str.startswith("body.")]
    body = shallow[(shallow["run"] == run) & (shallow["module"] == "body")].iloc[0]
    assert body["flops_per_step"] == parts["flops_per_step"].sum() and body["flops_per_step"] > 0


def test_a_view_column_of_integers_holding_a_null_reads_as_float64_nan():
    """reports.compare._arrays (compare.sql's views as numpy): a BIGINT column with a null (a key's max(live_bytes)
    over rows that lack it) reads as float64 with NaN there, as DuckDB's fetchdf gave it; without one it stays
    int64. It raised ValueError (numpy_of given NaN for an int64 null)."""
    import pyarrow as pa

    from reports.arrays import array_of
    from reports.compare import _arrays

    table = pa.table({"peak_live_bytes": array_of([1488, None], pa.int64()), "ops": array_of([8, 3], pa.int64())})
    got = _arrays(table)
    assert got["peak_live_bytes"].dtype == np.float64 and got["peak_live_bytes"].tolist()[0] == 1488.0
    assert np.isnan(got["peak_live_bytes"][1])
    assert got["ops"].dtype == np.int64 and got["ops"].tolist() == [8, 3]


def test_a_distributed_baseline_pairs_each_run_with_its_rank():
    from reports.compare import Figures, baselines_of

    def run(name, rank=None, job=None):
        return Figures(name, {}, {}, 1, float("nan"), None, rank, job)

    runs = [run("a/rank=0", 0, "a"), run("a/rank=1", 1, "a")]
    runs += [run("b/rank=0", 0, "b"), run("b/rank=1", 1, "b"), run("b/rank=2", 2, "b"), run("c")]
    # a's ranks are baselines (each against itself); b/rank=2 (a has no rank 2) and c (one process) against a/rank=0
    assert baselines_of(runs) == {
        "a/rank=0": "a/rank=0",
        "a/rank=1": "a/rank=1",
        "b/rank=0": "a/rank=0",
        "b/rank=1": "a/rank=1",
        "b/rank=2": "a/rank=0",
        "c": "a/rank=0",
    }
    # a baseline named in a distributed trace: pairs within it, a rank it lacks and c against the run named
    assert baselines_of(runs, "b/rank=1") == {
        "a/rank=0": "b/rank=0",
        "a/rank=1": "b/rank=1",
        "b/rank=0": "b/rank=0",
        "b/rank=1": "b/rank=1",
        "b/rank=2": "b/rank=2",
        "c": "b/rank=1",
    }
    # a baseline of one process: every run against it, as before
    assert baselines_of(runs, "c") == dict.fromkeys([r.name for r in runs], "c")


@pytest.mark.xfail(
    strict=True,
    reason="reports.compare._rank_of takes a frame's run's job from its name: a second trace named like the first "
    "(x/a, y/a) with more ranks names its rank 2 'a/rank=2', no '#2', so it joins the baseline's job and is compared "
    "with itself (0%)",
)
def test_a_loaded_frame_of_two_jobs_of_one_name_pairs_the_extra_rank_with_the_baseline(tmp_path):
    """x/a: 2 ranks of Linear(8, 4), y/a: 3 ranks of Linear(8, 8) (no bias, T = 2 rows): forward 2·2·8·4 = 128
    FLOPs + the sum's 8 = 136 in x, 2·2·8·8 = 256 + 16 = 272 in y. y's rank 2 (x has none) is compared with the
    baseline x/a/rank=0: +100%, as `compare([x/a, y/a])` of the paths says."""
    from tests.helpers import copy_rank

    for where, width, ranks in (("x", 4, 2), ("y", 8, 3)):
        for rank in range(ranks):
            torch.manual_seed(0)
            model = nn.Linear(8, width, bias=False)
            one = tmp_path / where / f"one{rank}" / "a"
            with Tracer(one, model=model, tokens=2):
                model(torch.randn(2, 8)).sum().backward()
            copy_rank(one, tmp_path / where / "a" / f"rank={rank}", rank)
    paths = [str(tmp_path / "x" / "a"), str(tmp_path / "y" / "a")]
    for table in (compare(paths), compare(load(paths))):
        forward = table[table["phase"] == "forward"].set_index("run")
        assert forward["flops_per_step"].to_dict() == {
            "a/rank=0": 136.0,
            "a/rank=1": 136.0,
            "a/rank=0#2": 272.0,
            "a/rank=1#2": 272.0,
            "a/rank=2": 272.0,
        }
        assert forward["flops_change_pct"].to_dict() == {
            "a/rank=0": 0.0,
            "a/rank=1": 0.0,
            "a/rank=0#2": 100.0,  # (272 - 136) / 136
            "a/rank=1#2": 100.0,
            "a/rank=2": 100.0,  # against a/rank=0; the loaded frame gave 0.0 (against itself)
        }


def test_one_distributed_traces_frame_compares_its_ranks_with_the_first(tmp_path):
    """p: rank 0 a step of Linear(8, 4), rank 1 of Linear(8, 8) (tests.integration.test_compare_ranks._job): total
    FLOPs 2·2·8·4 + 8 + 2·2·8·4 + 32 = 296 (forward mm and sum, backward mm, SGD's add_) and 2·296 = 592; alone, no
    other trace to pair with, rank 1 is compared with rank 0: +100%, as `optrace compare p/rank=0 p/rank=1` says."""
    from tests.integration.test_compare_ranks import _job

    table = compare(load(_job(tmp_path, "p", 4, 8)))
    total = table[table["phase"] == "total"].set_index("run")
    assert total["flops_per_step"].to_dict() == {"p/rank=0": 296.0, "p/rank=1": 592.0}
    assert total["flops_change_pct"].to_dict() == {"p/rank=0": 0.0, "p/rank=1": 100.0}  # (592 - 296) / 296; got 0.0
