"""The README's first example runs and prints what the README says it prints."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_output_is_real(tmp_path):
    """Run from an empty directory: the trace's parent (runs/) is made by the Tracer."""
    text = (ROOT / "README.md").read_text()
    code, output = re.search(r"```python\n(.*?)```\n```\n(.*?)```", text, re.S).groups()
    assert len(code.strip().splitlines()) <= 10
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == output
