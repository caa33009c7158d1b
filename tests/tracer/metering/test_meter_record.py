"""What Meter.step() returns: tracer.metering.record.StepFigures, a dict of the step's figures printed as one line."""

import re

import torch

from tests.tracer.metering.test_meter import PEAK, Net, run
from tracer.metering import meter as meter_module
from tracer.metering.meter import Meter
from tracer.metering.record import WIDTH, StepFigures, peak_label

KEYS = [
    "step",
    "traced",
    "step_time_s",
    "tokens",
    "tokens_per_s",
    "model_flops",
    "hardware_flops",
    "flops_estimated",
    "mfu",
    "hfu",
]
H100 = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}
BF16_TRACE = {"dtype": "bfloat16", "peak_flops_per_s": 989.4e12, "peak_source": "NVIDIA H100 SXM datasheet"}


GIVEN = {"dtype": "float32", "peak_flops_per_s": 1e9, "peak_source": "given"}  # Meter(peak_flops=1e9)


def figures(trace=None, device=None, **given):
    return StepFigures({**dict.fromkeys(KEYS), "traced": False, "flops_estimated": False, **given}, trace, device)


def test_a_metered_step_prints_step_time_tokens_per_s_and_mfu_in_one_line():
    step = figures(
        BF16_TRACE,
        H100,
        step=12,
        step_time_s=0.04131,
        tokens=1024,
        tokens_per_s=1024 / 0.04131,
        model_flops=1.165e13,
        hardware_flops=1.2e13,
        mfu=0.28503,
        hfu=0.29,
    )
    # 1024 / 0.04131 = 24,788.2 tok/s; 0.28503 = 28.5%; the H100's name as tracer.peaks.match_device reads it
    assert str(step) == "step 12: 41.3 ms, 24,788 tok/s, MFU 28.5% (bf16 peak of H100 SXM)"
    assert step["mfu"] == 0.28503 and step == dict(step)  # still the dict of unrounded figures
    assert repr(step) == repr(dict(step))


def test_the_line_names_what_is_missing():
    traced = figures(step=0, traced=True, step_time_s=0.0321, tokens=256, model_flops=1000)
    assert str(traced) == "step 0: traced (32.1 ms with the tracer on), no MFU: traced time is not step time"
    new = figures(step=5, step_time_s=2.5, tokens=256, tokens_per_s=102.4)  # a new signature: no FLOPs yet
    assert str(new) == "step 5: 2.50 s, 102 tok/s, MFU N/A: no traced FLOPs for this step's signature yet"
    no_peak = figures(step=3, step_time_s=0.0015, model_flops=1000)  # no tokens=: no tokens/s
    assert str(no_peak) == "step 3: 1.50 ms, MFU N/A: no peak for this device and dtype (pass peak_flops=)"
    estimated = figures(GIVEN, step=9, step_time_s=0.005, mfu=0.000123, model_flops=7, flops_estimated=True)
    assert str(estimated) == "step 9: 5.00 ms, MFU 0.0123% (FLOPs estimated; given peak)"
    unknown = StepFigures(dict.fromkeys(KEYS))  # after close(), or a step the meter could not meter
    assert str(unknown) == "step ?: no figures (the meter is closed, or could not meter this step)"


def test_the_line_is_at_most_120_characters_whatever_the_figures():
    long = {"type": "cuda", "name": "Accelerator " * 20}  # no datasheet entry: the name as given
    step = figures(
        BF16_TRACE,
        long,
        step=10**12,
        step_time_s=12345.678,
        tokens_per_s=1.5e15,
        mfu=0.5,
        model_flops=1,
        flops_estimated=True,
    )
    assert len(str(step)) == WIDTH == 120  # cut at 117 characters and "..."
    assert str(step) == (
        "step 1000000000000: 12345.68 s, 1,500,000,000,000,000 tok/s, MFU 50.0% (FLOPs estimated; "
        "bf16 peak of Accelerator Acc..."
    )


def test_peak_label():
    assert peak_label(BF16_TRACE, {"type": "cuda", "name": "Some GPU"}) == "bf16 peak of Some GPU"  # not in the table
    cpu = {"type": "cpu", "name": "x86"}
    assert peak_label({**BF16_TRACE, "dtype": "float32"}, cpu) == "fp32 ideal peak of the CPU"
    assert peak_label({**BF16_TRACE, "peak_source": "given"}, H100) == "given peak"
    assert peak_label({**BF16_TRACE, "peak_flops_per_s": None}, H100) is None
    assert peak_label({}, H100) is None  # no trace: no FLOPs, no peak


LINE = re.compile(r"step (\d+): (\d+\.?\d*) (ms|s), ([\d,]+) tok/s, MFU (\d+\.?\d*(?:e-\d+)?)% \((.*)\)")


def test_meter_step_on_the_cpu_prints_one_line(tmp_path):
    """Net, batches of 2, 2, 2, 4 (the 4 a new signature), tokens=2, peak_flops given."""
    _, steps = run(tmp_path / "given", [2, 2, 2, 4])
    assert [type(s) for s in steps] == [StepFigures] * 4 and [list(s) for s in steps] == [KEYS] * 4
    assert all(len(str(s)) <= 120 for s in steps)
    assert str(steps[0]).startswith("step 0: traced (") and str(steps[1]).startswith("step 1: traced (")
    found = LINE.fullmatch(str(steps[2]))
    assert found, str(steps[2])
    step, shown, unit, rate, mfu, peak = found.groups()
    seconds = steps[2]["step_time_s"]
    assert (step, rate, peak) == ("2", f"{2 / seconds:,.0f}", "given peak")  # tokens=2
    time = seconds * (1e3 if unit == "ms" else 1)
    assert abs(float(shown) - time) <= 0.005 * time  # three significant digits
    assert abs(float(mfu) / 100 - 1896 / seconds / PEAK) <= 0.005 * 1896 / seconds / PEAK  # 948 * 2 FLOPs
    assert str(steps[3]).endswith(", MFU N/A: no traced FLOPs for this step's signature yet")


def test_meter_step_names_the_table_peak_of_the_device(tmp_path, monkeypatch):
    """Without peak_flops=, the peak tracer.peaks.lookup gave for the run's device (here an H100, by name)."""
    monkeypatch.setattr(meter_module, "lookup", lambda device, dtype: (989.4e12, "NVIDIA H100 SXM datasheet"))
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with Meter(tmp_path / "h100", model=net, tokens=2) as m:
        for _ in range(3):
            net(torch.randn(2, 8)).square().sum().backward()
            opt.step()
            opt.zero_grad()
            m.step()
        m._tracer._meta["device"] = H100  # the name the run's device had on a GPU
        line = str(m.figures(2))
    assert line.endswith(" (fp32 peak of H100 SXM)") and len(line) <= 120, line
    after = m.step()
    assert after == dict.fromkeys(KEYS) | {"traced": False, "flops_estimated": False}
    assert str(after) == "step ?: no figures (the meter is closed, or could not meter this step)"
