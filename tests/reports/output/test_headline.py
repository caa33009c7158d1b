"""`optrace report`: the headline first (reports.output.headline), the text within 100 columns and 60 lines by default
(reports.output.report_text), --full, --sections, --depth, and --json's `headline` and `caveats` from the same figures.

The small trace: Linear(8, 4, bias=False) on a batch of 4 (tokens=4), the loss `.sum()`, SGD, one traced step of
set_step_time(0.001). N = 8 * 4 = 32 parameters, T = 4 tokens, so 6·N·T = 6 * 32 * 4 = 768.
    forward   mm 2 * 4 * 8 * 4 = 256, sum 4 * 4 = 16                        272
    backward  dL/dW = x^T @ dL/dy: 2 * 8 * 4 * 4 = 256 (x needs no gradient)  256
    optimizer SGD, one add per weight: 32                                      32
    total                                                                    560 = 0.729 x 768
"""

import itertools
import json
import re

import pytest
import torch
from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step
from torch import nn

import tracer.metering.meter as meter_module
from reports.output.cli import main
from tests.helpers import copy_rank, unwrapped
from tracer import Tracer
from tracer.metering.meter import Meter


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.fixture(autouse=True)
def columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # shutil.get_terminal_size reads it first


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    path = tmp_path_factory.mktemp("headline") / "linear"
    torch.manual_seed(0)
    net = nn.Linear(8, 4, bias=False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with Tracer(path, model=net, tokens=4, run_name="linear") as tr:
        net(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        tr.set_step_time(0.001)
    return path


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """A GPT of 2 layers at 2 traced steps, with a bandwidth (a roofline section): its --full text is longer than
    60 lines and wider than 100 columns."""
    path = tmp_path_factory.mktemp("headline") / "gpt"
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, 2)
    with Tracer(path, model=model, tokens=2 * cfg.seq_len, run_name="a-gpt-with-a-long-run-name") as tr:
        for _ in range(2):
            train_step(model, opt, idx, targets, None)
        tr.set_step_time(0.01)
        tr.set_bandwidth({"bytes_per_s": 1e10})
    return path


def test_the_first_lines_are_the_headline(linear, capsys):
    lines = run(capsys, "report", linear, "--peak-tflops", "1e-6").splitlines()
    assert lines[0].startswith("optrace report: linear  (") and lines[0].endswith(", complete)")
    assert lines[1:7] == [
        "FLOPs      560 per step = 0.729 x 6·N·T = 768 (N = 32, T = 4 tokens)",  # 560 / 768 = 0.729
        # model FLOPs 272 + 256 = 528 in 0.001 s = 528 kFLOP/s, over a peak of 1 MFLOP/s
        "MFU        52.8%, step 1.0 ms",
        # parameters 32 * 4 B = 128 B, its gradient 128 B (at the peak, in the optimizer step), ...
        lines[3],
        "Top op     aten.mm.default: 512 FLOPs per step (91.4%)",  # 256 + 256 of 560
        # forward mm 256 + backward mm 256 = 512 of 560: the sum (the loss) and the optimizer run outside it
        "Top module Linear: 512 FLOPs over 1 step(s) (91.4%, with its children)",
        "Warnings   0",
    ]
    assert re.fullmatch(r"Memory     peak \d+ B live, largest \w+ \d+ B \(\d+\.\d%\)", lines[3]), lines[3]


def test_json_carries_the_same_headline(linear, capsys):
    got = json.loads(run(capsys, "report", linear, "--peak-tflops", "1e-6", "--json"))
    h = got["headline"]
    assert h["flops"] == {"per_step": 560, "expected": 768, "ratio": pytest.approx(560 / 768), "n": 32, "tokens": 4}
    assert h["mfu"]["value"] == pytest.approx(0.528) and h["mfu"]["source"] == "step_time"  # 528 / 0.001 / 1e6
    assert h["mfu"]["step_time_s"] == 0.001 and got["mfu"] == h["mfu"]["value"] and got["mfu_source"] == "step_time"
    assert h["top_op"] == {"op": "aten.mm.default", "flops_per_step": 512, "pct": pytest.approx(100 * 512 / 560)}
    assert h["top_module"] == {"module": "Linear", "depth": 0, "flops": 512, "pct": pytest.approx(100 * 512 / 560)}
    assert h["memory"]["peak_live_bytes"] == got["peak_live_bytes"]
    assert h["memory"]["bytes"] == max(got["memory"]["categories"].values())
    assert got["memory"]["categories"][h["memory"]["largest_category"]] == h["memory"]["bytes"]
    assert h["warnings"] == 0 and got["caveats"] == []


def test_without_a_step_time_mfu_is_a_caveat(linear, capsys, tmp_path):
    path = tmp_path / "t"
    torch.manual_seed(0)
    net = nn.Linear(8, 4, bias=False)
    with Tracer(path, model=net, tokens=4):
        net(torch.randn(4, 8)).sum().backward()
    out = run(capsys, "report", path)
    assert "MFU        N/A: no untraced step time (Tracer.set_step_time(time_step(...)) or --step-time)" in out
    assert "Warnings   1: mfu_unavailable (Caveats below)" in out
    got = json.loads(run(capsys, "report", path, "--json"))
    assert got["caveats"] == [
        {
            "code": "mfu_unavailable",
            "message": "MFU N/A: no untraced step time (Tracer.set_step_time(time_step(...)) or --step-time)",
        }
    ]
    assert got["headline"]["warnings"] == 1 and got["mfu"] is None and got["mfu_source"] is None


def test_the_default_text_fits_100_columns_and_60_lines(gpt, capsys):
    out = run(capsys, "report", gpt)
    lines = out.splitlines()
    assert len(lines) <= 60 and max(len(line) for line in lines) <= 100, (len(lines), out)
    assert lines[-1] == "Not shown: explain, roofline (--sections NAME,... or --full)"
    full = run(capsys, "report", gpt, "--full").splitlines()
    assert len(full) > 60 and max(len(line) for line in full) > 100  # the limits cut something


def test_a_wider_terminal_gets_wider_text(gpt, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    lines = run(capsys, "report", gpt).splitlines()
    assert max(len(line) for line in lines) > 100 and all(len(line) <= 300 for line in lines)


def test_full_prints_every_section_printed_before(gpt, capsys):
    """The sections of the report before the headline, all in --full, in their order."""
    out = run(capsys, "report", gpt, "--full")
    headings = [
        "\nFLOPs per step against 2/4/6 x N x T\n",
        "\n  - a-gpt-with-a-long-run-name: per training step (2 steps traced; T = 32 tokens per step;",
        "\nMFU (model FLOPs per second of untraced step time / promised FLOP/s)\n",
        "\nTop 8 ops by FLOPs, per step (2 step(s) traced)\n",
        "\nTop modules by FLOPs, totals over all 2 step(s) (children rolled up; depth <= 2)\n",
        "\nRoofline, per step (2 step(s) traced; op time from busy_ns; bytes are algorithmic; roofs ",
        "\nMemory: peak ",
        "\nViews (no new memory) vs copies, totals over all 2 step(s)\n",
    ]
    at = [out.find(h) for h in headings]
    assert -1 not in at and at == sorted(at), [h for h, i in zip(headings, at) if i < 0]
    assert "Not shown:" not in out


def test_sections_picks_sections_in_their_order(gpt, capsys):
    out = run(capsys, "report", gpt, "--sections", "memory,ops")
    assert "\nTop 8 ops by FLOPs" in out and "\nMemory: peak" in out
    assert out.index("\nTop 8 ops") < out.index("\nMemory: peak")  # the report's order, not the flag's
    assert "FLOPs per step against" not in out and "Top modules" not in out and "Not shown" not in out
    assert out.splitlines()[1].startswith("FLOPs      ")  # the headline still comes first


def test_an_unknown_section_is_one_line(gpt, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["report", str(gpt), "--sections", "ops,frob"])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    assert err == (
        "optrace report: error: argument --sections: unknown section(s) 'frob'; the sections are caveats, flops, "
        "explain, mfu, ops, modules, uncounted, roofline, memory, views, meter, distributed, ranks "
        "(see optrace report --help)\n"
    )


def test_depth_chooses_the_top_modules(gpt, capsys):
    shown = {}
    for depth in ("0", "1", "3"):
        out = run(capsys, "report", gpt, "--sections", "modules", "--depth", depth)
        table = out[out.index("\nTop modules") :].splitlines()[3:]
        shown[depth] = {re.match(r"\s*(.+?)\s+[\d.]+(?: [kMGTP])?\s+[\d.]+%$", line).group(1) for line in table}
    assert shown["0"] == {"GPT", "(outside modules)"}  # the root, and the optimizer's and loss's ops outside it
    assert {"blocks", "lm_head", "wte"} <= shown["1"] and not any("." in m for m in shown["1"])
    assert {"blocks.0.attn", "blocks.1.mlp"} <= shown["3"] or any(m.count(".") == 2 for m in shown["3"])
    got = json.loads(run(capsys, "report", gpt, "--json", "--depth", "1"))["top_modules"]
    assert got["depth"] == 1 and max(r["depth"] for r in got["rows"]) == 1


def _metered(path, monkeypatch):
    """Linear(8, 4, bias=False) at batch 4 for 8 steps, under a Meter whose clock reads 1 ms a step but 3 ms at step
    4: steps 0 and 1 traced, 2-7 metered (1, 1, 3, 1, 1, 1 ms)."""
    readings = itertools.count()

    def clock(self):  # a reading at each step's end, and one more after a step that traced or wrote
        k = next(readings)
        return 0.001 * k + (0.002 if k >= 7 else 0.0)  # reading 7 ends step 4

    monkeypatch.setattr(meter_module.Meter, "_clock", clock)
    torch.manual_seed(0)
    net = nn.Linear(8, 4, bias=False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with Meter(path, model=net, tokens=4, peak_flops=1e6) as m:
        for _ in range(8):
            net(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            m.step()
    return path


def test_a_metered_trace_has_the_meters_mfu_in_the_headline(tmp_path, capsys, monkeypatch):
    """It said "MFU N/A: no untraced step time" and, 43 lines later, the Meter's MFU; --json had mfu: null."""
    path = _metered(tmp_path / "m", monkeypatch)
    out = run(capsys, "report", path)
    # model FLOPs 272 + 256 = 528 per step; 528 / 0.001 s / 1e6 FLOP/s = 52.8%, 528 / 0.003 / 1e6 = 17.6%
    assert out.splitlines()[2] == (
        "MFU        52.8% (Meter: median of 6 metered steps, 17.6%-52.8%), step 1.0 ms; NOISY: see Caveats"
    )
    assert "MFU N/A" not in out and "N/A: no untraced step time" not in out
    noise = (
        "step time: the median of 6 metered steps (1.0-3.0 ms); the slowest took 3.0x the fastest, so MFU is "
        "uncertain by as much"
    )
    assert f"- step_time_noise: {noise}" in unwrapped(out)
    got = json.loads(run(capsys, "report", path, "--json"))
    mfu = got["headline"]["mfu"]
    assert (mfu["source"], mfu["steps"], mfu["step_time_s"]) == ("meter", 6, pytest.approx(0.001))
    assert (mfu["value"], mfu["min"], mfu["max"]) == (
        pytest.approx(0.528),
        pytest.approx(0.176),
        pytest.approx(0.528),
    )
    assert got["mfu"] == mfu["value"] == got["meter"]["mfu"]["median"] and got["mfu_source"] == "meter"
    assert got["mfu_details"]["mfu"] is None  # the traced step time's MFU: none recorded
    assert [c["code"] for c in got["caveats"]] == ["step_time_noise"] and got["caveats"][0]["message"].startswith(noise)
    # a step time given by hand is the answer asked for
    got = json.loads(run(capsys, "report", path, "--json", "--step-time", "0.002", "--peak-tflops", "1e-6"))
    assert got["headline"]["mfu"]["source"] == "step_time" and got["mfu"] == pytest.approx(0.264)  # 528 / 0.002 / 1e6


def test_a_job_of_two_ranks_has_rank_0s_headline_and_its_ranks(linear, capsys, tmp_path):
    """The linear trace as ranks 0 and 1 of one job: the headline is rank 0's, the ranks section fits after it."""
    for rank in (0, 1):
        copy_rank(linear, tmp_path / "job" / f"rank={rank}", rank)
    out = run(capsys, "report", tmp_path / "job", "--peak-tflops", "1e-6")
    lines = out.splitlines()
    assert lines[0].startswith("optrace report: linear/rank=0  (")
    assert lines[1:3] == [
        "FLOPs      560 per step = 0.729 x 6·N·T = 768 (N = 32, T = 4 tokens)",  # rank 0's, as the one run's
        "MFU        52.8%, step 1.0 ms",
    ]
    assert re.search(r"^Ranks \(2( of \d)?\): per step, traced times$", out, re.M)  # the ranks section fits
    assert len(lines) <= 60 and max(len(line) for line in lines) <= 100
    got = json.loads(run(capsys, "report", tmp_path / "job", "--peak-tflops", "1e-6", "--json"))
    assert got["headline"]["flops"]["per_step"] == 560 and [r["rank"] for r in got["ranks"]] == [0, 1]
