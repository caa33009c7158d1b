"""`optrace plan TRACE --gpu G --calibrate MEASURED` (reports.plan.calibration): the efficiencies fitted from a
trace timed on G, printed old -> new, then used to plan TRACE.

MEASURED here is tests.reports.plan.test_plan's stack of 4 bf16 Linear(4096, 4096) on x [4096, 4096] (every
matmul 4096 x 4096 x 4096, 2 x 4096^3 = 137,438,953,472 FLOPs, which XLA's sweep measured at 783.33 TFLOP/s on
an H100 SXM: 175.45 us), its metadata set to a CUDA H100 with op times, and its op times written: each matmul
twice the sweep's time, each other kernel its bytes over half the H100's 3.35 TB/s.
"""

import json

import numpy as np
import pytest

import reports
from reports.output.cli import main
from reports.plan.calibration import fit
from tests.reports.plan.test_plan import stack

SWEEP_4096 = 783.33e12  # FLOP/s: XLA's sm_90 table at 4096 x 4096 x 4096, bf16
MATMUL_S = 2 * 4096**3 / SWEEP_4096  # 175.45 us


def _timed_on_h100(df):
    out = df.copy()
    runs = {}
    for run, meta in df.attrs["runs"].items():
        device = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 80 * 2**30, "fake": False}
        runs[run] = {**meta, "device": device, "timing": {"mode": "cuda"}}
    out.attrs = {**df.attrs, "runs": runs}
    matmul = (out["flop_kind"] == "matmul").to_numpy()
    nbytes = out["bytes_read"].to_numpy(np.float64) + out["bytes_written"].to_numpy(np.float64)
    kernel = ~out["is_view"].to_numpy(bool) & (nbytes > 0)
    seconds = np.where(matmul, 2 * MATMUL_S, np.where(kernel, nbytes / (3.35e12 * 0.5), 0.0))
    out["duration_ns"] = np.round(seconds * 1e9).astype("int64")
    out["busy_ns"] = np.nan
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    path = tmp_path_factory.mktemp("calibrate")
    df = stack(path / "m", 4096, batch=4096)
    return df, _timed_on_h100(df)


def test_the_fit_halves_the_matmul_stack_and_measures_the_memory_efficiency(traces):
    _, measured = traces
    fitted, changes = fit(measured, "H100 SXM")
    # each matmul took twice the sweep's time: matmul_stack 1 x 175.45 us / 350.9 us = 0.5 (the ns rounding: 1e-6)
    assert fitted["matmul_stack"][0] == pytest.approx(0.5, rel=1e-5)
    # every other kernel moved its bytes at half the 3.35 TB/s: memory_efficiency 0.5 (0.8 assumed)
    assert fitted["memory_efficiency"][0] == pytest.approx(0.5, rel=1e-3)
    assert fitted["matmul_stack"][1].startswith("calibrated on run m: measured: 11 matmul-bound ops")
    by_name = {c["name"]: c for c in changes}
    assert by_name["matmul_stack"]["old"] == 1.0 and by_name["memory_efficiency"]["old"] == 0.8
    # what the matmuls reach together: 783.33 / 989.4 = 0.7917 before, half of it after
    assert by_name["matmul ops reach"]["old"] == pytest.approx(SWEEP_4096 / 989.4e12, rel=1e-9)
    assert by_name["matmul ops reach"]["new"] == pytest.approx(SWEEP_4096 / 989.4e12 / 2, rel=1e-5)
    assert "vector_efficiency" not in fitted  # no vector-bound op was timed: it stays as assumed


def test_plan_with_calibrate_prints_what_changed_and_plans_with_it(traces, tmp_path, capsys):
    df, measured = traces
    planned = reports.plan(df, "H100 SXM", calibrated=fit(measured, "H100 SXM")[0]).iloc[0]
    # 11 matmuls at 783.33 TFLOP/s x 0.5: 11 x 350.9 us = 3.860 ms
    assert planned["compute_bound_s"] == pytest.approx(11 * 2 * MATMUL_S, rel=1e-5)
    # --assume wins over the calibration
    given = reports.plan(df, "H100 SXM", assumptions={"matmul_stack": 1.0}, calibrated=fit(measured, "H100 SXM")[0])
    assert given.iloc[0]["compute_bound_s"] == pytest.approx(11 * MATMUL_S, rel=1e-9)


def test_calibrate_refuses_a_trace_not_measured_on_the_target(traces, tmp_path, capsys):
    df, _ = traces
    with pytest.raises(
        reports.ReportError,
        match=r"^plan: --calibrate needs a trace measured on H100 SXM with op "
        r"times; this one ran on meta",
    ):
        fit(df, "H100 SXM")
    stack(tmp_path / "t", 64)
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--calibrate", str(tmp_path / "t")]) == 2
    assert "--calibrate needs a trace measured on H100 with op times" in capsys.readouterr().err


def test_cli_prints_old_to_new(traces, tmp_path, capsys, monkeypatch):
    df, measured = traces
    import reports.loading.load as loading

    stack(tmp_path / "t", 4096, batch=4096)
    real = loading.load
    monkeypatch.setattr(loading, "load", lambda path, *a, **k: measured if str(path) == "MEASURED" else real(path))
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100 SXM", "--calibrate", "MEASURED"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "Calibrated on MEASURED:",
        "  matmul_stack           1 -> 0.5",
        "  memory_efficiency      0.8 -> 0.5",
    ]
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100 SXM", "--calibrate", "MEASURED", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in found["calibration"]] == ["matmul_stack", "memory_efficiency", "matmul ops reach"]
