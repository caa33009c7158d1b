"""`--json` is the whole report: every section of the text report in `report --json`, and `compare --json`
one object, with infinite ratios as "inf", never a silent null.

The traces: a Linear(4, 3) on a [2, 4] input, forward and backward on the CPU, once in float32 and once
under bf16 autocast (which adds the _to_copy ops the float32 run does not have)."""

import json
import re

import pytest
import torch

import reports
from reports.output.cli import main
from tracer import Tracer

SECTIONS = {
    "error",
    "breakdown",
    "mfu_details",
    "top_ops",
    "top_modules",
    "roofline",
    "uncounted_ops",
    "memory",
    "views",
    "distributed",
}


def _trace(path, autocast):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with Tracer(path, model=model, tokens=2, run_name="bf16" if autocast else "fp32") as tr:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(x).float().sum().backward()
        tr.set_bandwidth({"bytes_per_s": 1.0})  # a roof of 1 B/s: every memory-bound op is above it
    return str(path)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("json")
    return _trace(d / "fp32.parquet", False), _trace(d / "bf16.parquet", True)


def _strict(text):
    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)  # no NaN / Infinity


def _cli(capsys, *argv):
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def bullets(text):
    """The "  - " lines of a report's text, each with the lines it was wrapped onto ("    ...") joined back."""
    found = []
    for line in text.splitlines():
        if line.startswith("  - "):
            found.append(line[4:])
        elif line.startswith("    ") and found:
            found[-1] += " " + line.strip()
    return found


def test_report_json_has_every_section(traces, capsys):
    got = _strict(_cli(capsys, "report", traces[0], "--json"))
    assert SECTIONS <= set(got)
    assert {"run", "params", "tokens", "flops", "mfu", "peak_live_bytes", "damage"} <= set(got)  # the keys of before
    # breakdown: forward 2 * 2 * 4 * 3 = 48 FLOPs of addmm, 2·N·T = 2 * 12 * 2 = 48
    rows = {r["phase"]: r for r in got["breakdown"]["rows"]}
    assert rows["forward"]["weight_matmul_flops"] == 48 and rows["forward"]["expected_flops"] == 48
    assert rows["total"]["flops"] == got["flops"]["total"]
    text = _cli(capsys, "report", traces[0], "--sections", "explain")
    assert got["breakdown"]["explain"] == bullets(text) and bullets(text)  # the same lines as the text report
    assert got["error"] is None
    assert got["memory"]["peak"]["peak_live_bytes"] == got["peak_live_bytes"]
    assert sum(got["memory"]["categories"].values()) == got["peak_live_bytes"]  # the categories add up at the peak
    ops = {r["op"]: r for r in got["top_ops"]["rows"]}
    assert got["top_ops"]["unit"] == "per step"
    assert ops["aten.addmm.default"] == {
        "op": "aten.addmm.default",
        "ops_per_step": 1,
        "flops_per_step": 48,
        "flops_pct": pytest.approx(100 * 48 / got["flops"]["total"]),
        "bytes_allocated_per_step": 24,
    }  # 2 * 3 float32 outputs = 24 bytes
    assert got["top_modules"]["rows"][0]["module"] == "Linear"
    kinds = {k["kind"]: k for k in got["views"]["kinds"]}
    assert kinds["view"]["ops"] >= 1 and kinds["view"]["bytes_allocated"] == 0  # model.weight.t() at least; no memory
    df = reports.load(traces[0])
    assert got["top_ops"]["rows"][0]["flops_per_step"] == int(reports.by_op(df)["flops"].iloc[0])  # one step


def test_report_json_makes_the_flop_rows_once(traces, capsys, monkeypatch):
    """The breakdown, explain and mfu_details of --json read the FLOP rows the headline read: one table of them (a
    second was a query of every row, the Trace's read having handed its kept rows out once)."""
    import reports.sql.flops as flops

    made, table = [], flops.table
    monkeypatch.setattr(flops, "table", lambda *a, **k: made.append(1) or table(*a, **k))
    got = _strict(_cli(capsys, "report", traces[0], "--json"))
    assert got["breakdown"]["available"] and got["mfu_details"]  # sections that read them, after the memory ones
    assert len(made) == 1


def test_report_json_roofline_marks_rows_above_the_roof(traces, capsys):
    got = _strict(_cli(capsys, "report", traces[0], "--json"))["roofline"]
    assert got["available"] and got["peak_bytes_per_s"] == 1
    above = [r for r in got["rows"] if r["above_roof"]]
    assert above and all(r["efficiency"] > 1 for r in above)
    assert "DRAM triad" in got["above_roof_note"]
    text = _cli(capsys, "report", traces[0], "--sections", "roofline")
    assert int(re.search(r"^  \* (\d+) row\(s\) above 100%", text, re.M).group(1)) == len(above)
    assert {r["bound"] for r in got["split"]} == {"compute", "memory", "other"}


def test_report_json_names_a_crash(tmp_path, capsys):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with pytest.raises(RuntimeError, match="boom"):
        with Tracer(tmp_path / "c.parquet", model=model, tokens=2):
            model(torch.randn(2, 4))
            raise RuntimeError("boom")
    got = _strict(_cli(capsys, "report", tmp_path / "c.parquet", "--json"))
    assert got["complete"] is False and got["error"] == "RuntimeError: boom"


def test_compare_json_is_one_object_with_infinities_named(traces, capsys):
    got = _strict(_cli(capsys, "compare", *traces, "--by", "op", "--json"))
    assert isinstance(got, dict) and got["runs"] == ["fp32", "bf16"] and got["baseline"] == "fp32"
    assert set(got["columns"]) == set(got["rows"][0]) and "change_pct" in got["columns"]
    assert '"inf"' in got["note"]
    base = {r["op"]: r for r in got["rows"] if r["run"] == "fp32"}
    copies = [r for r in got["rows"] if r["run"] == "bf16" and r["op"] == "aten._to_copy.default"]
    assert copies and base["aten._to_copy.default"]["ops_per_step"] == 0  # autocast's casts: none in float32
    assert copies[0]["bytes_allocated_change_pct"] == "inf"  # x / 0, said so, not a null
    missing = [r for r in got["rows"] if r["run"] == "fp32" and r["ops_per_step"] == 0]
    assert missing and all(r["flops_change_pct"] == 0 for r in missing)  # 0 against 0: no change (the ratio was null)
    assert all(r["peak_live_bytes"] is None and r["peak_live_bytes_change_pct"] is None for r in missing)  # no peak


def test_top_ops_are_per_step(tmp_path, capsys):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with Tracer(tmp_path / "two.parquet", model=model, tokens=2) as tr:
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            tr.step()
        tr.set_bandwidth({"bytes_per_s": 1e10})
    got = _strict(_cli(capsys, "report", tmp_path / "two.parquet", "--json"))
    addmm = next(r for r in got["top_ops"]["rows"] if r["op"] == "aten.addmm.default")
    df = reports.load(tmp_path / "two.parquet")
    assert int(reports.by_op(df).set_index("op").loc["aten.addmm.default", "flops"]) == 96  # 2 steps * 2 * 2 * 4 * 3
    assert addmm["ops_per_step"] == 1 and addmm["flops_per_step"] == 48  # 96 / 2 steps
    text = _cli(capsys, "report", tmp_path / "two.parquet", "--full")
    assert "Top 8 ops by FLOPs, per step (2 step(s) traced)" in text
    assert re.search(r"^\s*aten\.addmm\.default\s+1\s+48\s", text, re.M)
    assert "\nRoofline, per step (2 step(s) traced; " in text
    assert re.search(
        r"^\s+op\s+dtype ops_per_step flops_per_step bytes_per_step\s+intensity time_per_step ", text, re.M
    )
    assert re.search(r"^\s*addmm\.default float32\s+1\s+48\s", text, re.M)  # 1 op, 48 FLOPs per step, as Top ops
    roof = next(r for r in got["roofline"]["rows"] if r["op"] == "aten.addmm.default")
    assert roof["ops_per_step"] == 1 and roof["flops_per_step"] == 48 and got["roofline"]["unit"].startswith("per step")
    unit = r"[\d.]+ (?:s|ms|us|ns)"  # humanised seconds, as in the table's time_per_step
    assert re.search(rf"^  memory-bound\s+{unit} per step \(\d+\.\d%\), {unit} at the roof$", text, re.M), text


def test_strict_names_infinities_and_nulls_nan():
    from reports.output.report_json import json_value, strict

    assert strict({"a": [float("inf"), float("nan"), 1.5], "b": -float("inf"), "c": "x"}) == {
        "a": ["inf", None, 1.5],
        "b": "-inf",
        "c": "x",
    }
    assert json_value(float("inf")) == "inf" and json_value(float("nan")) is None and json_value(3.0) == 3


def test_another_ranks_untimed_collectives_are_a_caveat(tmp_path, capsys):
    from tests.helpers import copy_rank
    from tests.reports.loading.test_damage import rewrite, set_metadata
    from tracer.schema import part_paths

    for rank in (0, 1):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        with Tracer(tmp_path / f"one{rank}", model=model, tokens=2):
            model(torch.randn(2, 4)).sum().backward()
        copy_rank(tmp_path / f"one{rank}", tmp_path / "job" / f"rank={rank}", rank)
    for part in part_paths(tmp_path / "job" / "rank=1"):
        rewrite(part, set_metadata(collectives_untimed=3))  # rank 1's 3 collectives timed to their launch
    main(["export", str(tmp_path / "job"), "-o", str(tmp_path / "job.json")])
    caveats = json.loads((tmp_path / "job.json").read_text())["otherData"]["caveats"]
    assert [[c["code"] for c in caveats[r]] for r in ("0", "1")] == [[], ["collectives_untimed"]]
    capsys.readouterr()
    assert main(["report", str(tmp_path / "job"), "--json"]) == 0
    said = [c["message"] for c in json.loads(capsys.readouterr().out)["caveats"] if c["code"] == "collectives_untimed"]
    assert len(said) == 1 and "3 collectives" in said[0]
