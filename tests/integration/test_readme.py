"""The README's first example runs and prints what the README says it prints; the meter's example (docs/meter.md)
runs as written. tests/integration/test_docs.py runs every other block of the README and the docs pages."""

import re
import subprocess
import sys

from tests import helpers

ROOT = helpers.ROOT


def test_readme_example_output_is_real(tmp_path):
    """Run from an empty directory: the trace's parent (runs/) is made by the Tracer."""
    text = (ROOT / "README.md").read_text()
    code, output = re.search(r"```python\n(.*?)```\n```\n(.*?)```", text, re.S).groups()
    assert len(code.strip().splitlines()) <= 10
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == output


def test_readme_meter_example_runs_as_written(tmp_path):
    """The first block of docs/meter.md, run alone from an empty directory: 5 steps, the first two traced, each
    printed as one line of at most 120 characters, in the format of the lines the page shows."""
    text = (ROOT / "docs" / "meter.md").read_text()
    code, shown = re.search(r"```python\n(.*?)```\n```\n(.*?)```", text, re.S).groups()
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    traced = r"step [01]: traced \(\d+\.?\d* m?s with the tracer on\), no MFU: traced time is not step time"
    metered = r"step \d+: \d+\.?\d* m?s, [\d,]+ tok/s, MFU \d+\.?\d*% \(fp32 ideal peak of the CPU\)"
    no_peak = r"step \d+: \d+\.?\d* m?s, [\d,]+ tok/s, MFU N/A: no peak for this device and dtype \(pass peak_flops=\)"
    assert [bool(re.fullmatch(traced, line)) for line in lines] == [True, True, False, False, False], lines
    # a CPU whose clock /proc/cpuinfo does not give has no ideal peak (tracer.peaks.cpu_ideal_flops)
    assert all(re.fullmatch(metered, line) or re.fullmatch(no_peak, line) for line in lines[2:]), lines
    assert all(len(line) <= 120 for line in lines)
    shown = shown.splitlines()  # the page's lines have the format of the printed ones
    assert [bool(re.fullmatch(traced, line)) for line in shown] == [True, True, False, False, False], shown
    assert all(re.fullmatch(metered, line) for line in shown[2:]) and shown[2].startswith("step 2: ")
    assert (tmp_path / "runs" / "meter").is_dir()
