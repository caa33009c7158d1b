"""Ops no FLOP formula counts are listed (report, --json), never a silent zero; FLOP bounds are named."""

import json

import pandas as pd
import torch

import reports
from reports.flops.coverage import bounds, uncounted
from reports.output.cli import main
from tracer import Tracer


def _trace(path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8)
    with Tracer(path, model=model, tokens=4):
        y = model(x)
        torch.topk(y, 2, dim=-1)  # no FLOP formula: 0 FLOPs, flop_kind "unknown"
        torch.sort(y, dim=-1)
        torch.sort(y, dim=0)
    return str(path)


def test_uncounted_lists_every_op_without_a_formula(tmp_path):
    df = reports.load(_trace(tmp_path / "t"))
    table = uncounted(df)
    assert sorted(zip(table["op"], table["ops"])) == [("aten.sort.default", 2), ("aten.topk.default", 1)]
    time = df["duration_ns"].sum()
    for row in table.itertuples():
        mine = df.loc[df["op"] == row.op, "duration_ns"].sum()
        assert abs(row.time_pct - 100 * mine / time) < 1e-9
    assert list(table.columns) == ["op", "ops", "duration_us", "time_pct"]


def test_a_fully_counted_trace_has_an_empty_typed_table(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8, bias=False)
    with Tracer(tmp_path / "t", model=model, tokens=4):
        model(torch.randn(4, 8)).sum()
    table = uncounted(reports.load(tmp_path / "t"))
    assert len(table) == 0 and str(table["ops"].dtype) == "int64"


def test_report_text_and_json_name_the_uncounted_ops_and_the_fix(tmp_path, capsys):
    path = _trace(tmp_path / "t")
    assert main(["report", path]) == 0
    text = capsys.readouterr().out
    assert "Ops without a FLOP formula (counted as 0 FLOPs; tracer.register_flop_formula" in text
    assert "aten.sort.default" in text and "aten.topk.default" in text
    assert main(["report", path, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted((r["op"], r["ops"]) for r in summary["uncounted_ops"]) == [
        ("aten.sort.default", 2),
        ("aten.topk.default", 1),
    ]
    assert summary["bound_flops"] == {"flops": 0, "rows": 0}


def test_bounds_sum_the_flagged_rows_per_step():
    df = pd.DataFrame(
        {
            "step": [0, 0, 1, 1],
            "phase": ["forward"] * 4,
            "flops": [10, 2**40, 5, 2**40 + 2],
            "flops_bound": [False, True, False, True],
        }
    )
    assert bounds(df) == {"flops": 2**40 + 1, "rows": 2}  # (2**40 + 2**40 + 2) / 2 steps
    assert bounds(df.drop(columns="flops_bound")) == {"flops": 0, "rows": 0}
