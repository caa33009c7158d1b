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
from reports.plan.calibration import fit, leave_one_out, pooled, stack_step
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
    # each matmul took twice the sweep's time: 0.673 x (175.45 us / 0.673) / 350.9 us = 0.5 (the ns rounding: 1e-6)
    assert fitted["matmul_stack"][0] == pytest.approx(0.5, rel=1e-5)
    # every other kernel moved its bytes at half the 3.35 TB/s: memory_efficiency 0.5 (0.8 assumed)
    assert fitted["memory_efficiency"][0] == pytest.approx(0.5, rel=1e-3)
    assert fitted["matmul_stack"][1].startswith("calibrated on run m: measured: 11 matmul-bound ops")
    by_name = {c["name"]: c for c in changes}
    # Hopper's default matmul_stack, fitted on published runs (reports.plan.assumptions BY_GENERATION)
    assert by_name["matmul_stack"]["old"] == 0.673 and by_name["memory_efficiency"]["old"] == 0.8
    # what the matmuls reach together: 783.33 / 989.4 x 0.673 = 0.5328 before, 0.7917 / 2 after
    assert by_name["matmul ops reach"]["old"] == pytest.approx(SWEEP_4096 / 989.4e12 * 0.673, rel=1e-9)
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
    import contextlib

    import reports.output.cli as cli
    from reports.plan.rows import frame_runs

    stack(tmp_path / "t", 4096, batch=4096)
    real = cli._plan_runs

    @contextlib.contextmanager
    def runs(path):  # MEASURED: the timed frame's run, as the CLI reads a trace's (reports.plan.rows.Run)
        if str(path) != "MEASURED":
            with real(path) as found:
                yield found
            return
        yield frame_runs(measured)

    monkeypatch.setattr(cli, "_plan_runs", runs)
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100 SXM", "--calibrate", "MEASURED"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "Calibrated on MEASURED:",
        "  matmul_stack           0.673 -> 0.5",
        "  memory_efficiency      0.8 -> 0.5",
    ]
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100 SXM", "--calibrate", "MEASURED", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in found["calibration"]] == ["matmul_stack", "memory_efficiency", "matmul ops reach"]


def test_a_published_step_fits_the_stack_by_scaling_only_the_matmul_time():
    # a plan at stack 1 takes 1.0 s a step, 0.6 s of it matmul-bound; the published step is 1.2 s: the matmuls
    # need 0.6 + 1.2 - 1.0 = 0.8 s, so the stack is 1 x 0.6 / 0.8 = 0.75
    assert stack_step(1.0, 0.6, 1.0, 1.2) == pytest.approx(0.75, rel=1e-12)
    # a published step the other terms already pass (0.6 + 0.3 - 1.0 < 0) finds none: the range's top, 2
    assert stack_step(1.0, 0.6, 1.0, 0.3) == 2.0


def test_leave_one_out_takes_the_median_of_the_others():
    # a toy table of 3 runs of one generation: a (source x) 0.6, b (source y) 0.7, c (source y) 0.9, and one run of
    # another generation, alone in it
    fits = {
        "a": {"generation": "hopper", "source": "x", "stack": 0.6},
        "b": {"generation": "hopper", "source": "y", "stack": 0.7},
        "c": {"generation": "hopper", "source": "y", "stack": 0.9},
        "d": {"generation": "ampere", "source": "x", "stack": 0.8},
    }
    # in-sample: the median of all three, 0.7; of d's generation, d's own 0.8
    assert pooled(fits) == {"hopper": 0.7, "ampere": 0.8}
    # each run at the median of the other two: a (0.7 + 0.9) / 2 = 0.8, b (0.6 + 0.9) / 2 = 0.75, c (0.6 + 0.7) / 2
    # = 0.65; d has no other run of its generation: nan, of 0 runs
    out = leave_one_out(fits)
    assert {k: (pytest.approx(v), n) for k, (v, n) in out.items() if k != "d"} == {
        "a": (0.8, 2),
        "b": (0.75, 2),
        "c": (0.65, 2),
    }
    assert out["d"][1] == 0 and out["d"][0] != out["d"][0]
    # stricter, other sources only: a (x) the median of b and c, 0.8; b and c (y) a's 0.6 alone
    by_source = leave_one_out(fits, by="source")
    assert {k: (pytest.approx(v), n) for k, (v, n) in by_source.items() if k != "d"} == {
        "a": (0.8, 2),
        "b": (0.6, 1),
        "c": (0.6, 1),
    }
    # a run left out of the pool (its fit matched nothing) still gets the pool's median: e at 0.7 (a, b, c)
    e = {"generation": "hopper", "source": "z"}
    assert leave_one_out(fits, runs={"e": e})["e"] == (0.7, 3)
