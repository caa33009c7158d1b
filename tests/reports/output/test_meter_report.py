"""The report's Meter section names the meter's own bookkeeping failures (reports/output/meter.py, --json `meter.errors`)."""

import json
import threading

import pytest
import torch
from torch import nn

from reports.flops.meter import meter_summary
from reports.output.cli import main as optrace
from tracer.metering.meter import Meter


def test_steps_ended_on_another_thread_are_errors_the_report_names(tmp_path, capsys):
    """The Meter is made on this thread and the loop runs on another: each of its 3 step() calls fails (the tracer
    records only the thread that entered it) and is counted, and the report's error names the count."""
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    m = Meter(tmp_path / "elsewhere", model=net, tokens=2, peak_flops=1e9)

    def loop():
        for _ in range(3):
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            m.step()

    worker = threading.Thread(target=loop)
    with pytest.warns(UserWarning, match="step\\(\\) on another thread") as warned:
        worker.start()
        worker.join()
    assert len(warned) == 1  # once, however many steps fail
    m.close()
    assert m.errors == 3
    summary = meter_summary(tmp_path / "elsewhere")
    assert (summary["steps"], summary["traced_steps"], summary["metered_steps"], summary["errors"]) == (0, [], 0, 3)
    # no op ran on the Meter's thread: the report's one line says why, with the meter's count
    assert optrace(["report", str(tmp_path / "elsewhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"optrace report: error: {tmp_path / 'elsewhere'}: the trace has no ops (nothing ran inside `with "
        "Tracer(...)`); its Meter counted 3 bookkeeping error(s), as a Meter made on another thread than the "
        "loop's does"
    ]


def test_the_report_prints_the_error_count(tmp_path, capsys):
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    m = Meter(tmp_path / "err", model=net, tokens=2, peak_flops=1e9)
    worker = threading.Thread(target=m.step)
    with pytest.warns(UserWarning, match="on another thread"):
        worker.start()
        worker.join()
    net(torch.randn(2, 4)).sum().backward()
    assert m.step()["traced"] is True  # this thread's step is metered as usual
    m.close()
    optrace(["report", str(tmp_path / "err")])
    out = capsys.readouterr().out
    assert "Meter: 1 steps, 0 metered untraced (medians over them), traced: step 0" in out
    assert "  1 meter bookkeeping error(s)" in out
    optrace(["report", str(tmp_path / "err"), "--json"])
    found = json.loads(capsys.readouterr().out)["meter"]
    assert (found["steps"], found["traced_steps"], found["errors"]) == (1, [0], 1)


def test_a_retraced_step_of_another_length_is_explained_with_its_own_tokens(tmp_path, capsys):
    """The traced steps of a metered run have the tokens meter.step(tokens=) gave each: T is their mean, not the
    constructor's tokens=, which made every token of a dense Linear seem to use only part of its weights."""
    import reports

    torch.manual_seed(0)
    model = nn.Linear(64, 64, bias=False)  # N = 4,096
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = Meter(tmp_path / "m", model=model, tokens=32, peak_flops=1e12)
    for it in range(8):
        tokens = 32 if it < 5 else 16
        model(torch.randn(tokens, 64, requires_grad=True)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        meter.step(tokens=tokens)
    meter.close()
    df = reports.load(tmp_path / "m")
    t = reports.breakdown(df).set_index("phase")
    # traced: steps 0 and 1 (32 tokens) and step 6 (16, the new shape's re-trace): T = 80 / 3
    assert t.loc["total", "tokens"] == 80 / 3 and t.loc["total", "n_active"] == 4096  # it said N_active 3,413
    # forward weight matmuls per step: 2·4,096·(32 + 32 + 16) / 3 = 218,453.3 = 2·N·T
    assert t.loc["forward", "weight_matmul_flops"] == pytest.approx(2 * 4096 * 80 / 3, rel=1e-12)
    assert t.loc["forward", "weight_matmul_flops"] == pytest.approx(t.loc["forward", "expected_flops"], rel=1e-12)
    assert reports.mfu(df)["tokens_per_step"].tolist() == [80 / 3]
    optrace(["report", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert "N = 4,096 parameters (matmul), T = 26.67 tokens per step" in out and "N_active" not in out
