"""No sum wraps: a 405B-shaped trace's FLOP totals pass int64 (9.2e18) and every report
gives the closed form, exact or float64 (reports/steps.py `summable`)."""

import json

import pytest
import torch
from torch import nn

import reports
from reports.output.cli import main
from reports.output.export import export_chrome
from reports.steps import fits_int64, summable
from tracer import Tracer

TOKENS, D, FF, LAYERS = 2**24, 16384, 53248, 400  # a 16M-token batch through 405B-sized matmuls
PER_MATMUL = 2 * TOKENS * D * FF  # 2 * 16,777,216 * 16,384 * 53,248 = 29,273,397,577,908,224 (13 * 2**51)
TOTAL = LAYERS * PER_MATMUL  # 11,709,359,031,163,289,600 = 1.17e19 > 2**63 - 1 = 9.22e18


class Matmuls(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(D, FF, device="meta"), requires_grad=False)

    def forward(self, x):
        for _ in range(LAYERS):
            x @ self.w  # meta tensors: shapes only, instant
        return x


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("overflow") / "t"
    model = Matmuls()
    with Tracer(path, model=model, tokens=TOKENS):
        model(torch.empty(TOKENS, D, device="meta"))
    return path


def test_the_closed_form_wraps_in_int64():
    assert TOTAL == 11_709_359_031_163_289_600 and TOTAL > 2**63 - 1
    assert TOTAL - 2**64 < 0  # what an int64 sum would show: -6.74e18


def test_every_total_is_the_closed_form(trace):
    df = reports.load(trace)
    mm = df[df["op"] == "aten.mm.default"]
    assert len(mm) == LAYERS and (mm["flops"] == PER_MATMUL).all() and not mm["flops_bound"].any()
    assert not fits_int64(df["flops"].to_numpy())
    # 400 * 13 * 2**51 = 5200 * 2**51: exact in float64, so the figures compare exactly
    assert reports.per_step(df, mask=df["phase"] == "forward") == TOTAL
    assert reports.per_step(df) == TOTAL
    table = reports.breakdown(df).set_index("phase")
    assert table.loc["forward", "flops"] == TOTAL and table.loc["total", "flops"] == TOTAL
    assert reports.by_op(df).set_index("op").loc["aten.mm.default", "flops"] == TOTAL
    assert reports.by_phase(df).set_index("phase").loc["forward", "flops"] == TOTAL
    steps = reports.by_step(df)
    assert steps["flops"].tolist() == [TOTAL] and steps["flops_forward"].tolist() == [TOTAL]
    modules = reports.by_module(df).set_index("module")
    assert modules.loc["Matmuls", "flops"] == TOTAL and modules.loc["Matmuls", "subtree_flops"] == TOTAL
    assert modules.loc["Matmuls", "subtree_flops_pct"] == 100.0
    assert reports.by_dtype(df)["matmul_flops"].tolist() == [TOTAL]
    roof = reports.roofline(df).set_index("op")
    assert roof.loc["aten.mm.default", "flops_per_step"] == TOTAL  # one step
    compared = reports.compare(df, by="phase").set_index("phase")
    assert compared.loc["total", "flops_per_step"] == compared.loc["forward", "flops_per_step"] == TOTAL


def test_the_trace_of_files_sums_the_phases_past_int64(trace):
    """by_step over the files (the engine the CLI runs): flops_forward, a sum past int64, comes back as float64
    (DuckDB's cast of its 128-bit sum to BIGINT raised before)."""
    from reports.sql import tables
    from reports.sql.engine import Trace

    with Trace(trace) as files:
        steps = tables.by_step(files)
    assert steps["flops_forward"].tolist() == [TOTAL] and steps["flops_forward"].dtype == "float64"


def test_json_and_export_totals(trace, tmp_path, capsys):
    assert main(["report", str(trace), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    flops = summary["flops"] if "flops" in summary else summary[next(iter(summary))]["flops"]
    assert flops["forward"] == TOTAL and flops["total"] == TOTAL
    out = tmp_path / "t.json"
    export_chrome(trace, out)
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    counters = [e["args"]["flops"] for e in events if e.get("name") == "cumulative FLOPs"]
    assert counters[-1] == TOTAL and counters == sorted(counters)  # Python ints: exact


def test_summable_keeps_small_sums_integer():
    import numpy as np

    small = np.array([1, 2, 3], dtype=np.int64)
    assert summable(small) is small
    big = np.array([2**62, 2**62], dtype=np.int64)
    assert summable(big).dtype == np.float64 and summable(big).sum() == 2.0**63
