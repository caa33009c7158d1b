"""The README's first example runs and prints what the README says it prints; the meter's example (docs/meter.md)
runs as written. tests/integration/test_docs.py runs every other block of the README and the docs pages."""

import re

from tests import helpers
from tests.helpers import forked

ROOT = helpers.ROOT


def test_readme_example_output_is_real(tmp_path):
    """Run from an empty directory: the trace's parent (runs/) is made by the Tracer."""
    text = (ROOT / "README.md").read_text()
    code, output = re.search(r"```python\n(.*?)```\n```\n(.*?)```", text, re.S).groups()
    assert len(code.strip().splitlines()) <= 10
    done = forked.run(code, cwd=tmp_path, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == output


def test_readme_meter_example_runs_as_written(tmp_path):
    """The first block of docs/meter.md, run alone from an empty directory: 5 steps, the first two traced, each
    printed as one line of at most 120 characters, in the format of the lines the page shows."""
    text = (ROOT / "docs" / "meter.md").read_text()
    code, shown = re.search(r"```python\n(.*?)```\n```\n(.*?)```", text, re.S).groups()
    done = forked.run(
        code, cwd=tmp_path, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
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


_DOCS = [
    "README.md",
    "benchmarks/README.md",
    "Makefile",
    ".ci/run",
    *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
]


def _docs():
    return {name: (ROOT / name).read_text(encoding="utf-8") for name in _DOCS}


def test_the_python_m_commands_the_docs_give_name_modules_of_the_checkout():
    """`python -m tracer.native.build_ext`, not the module's place before tracer/ had subpackages
    (`python -m tracer.build_ext` then failed with "No module named tracer.build_ext")."""
    import importlib.util

    named = {
        (doc, m)
        for doc, text in _docs().items()
        for m in re.findall(r"python[\d.]* -m ((?:tracer|reports)[\w.]*)", text)
    }
    assert named  # the README's build line at least
    missing = sorted((doc, m) for doc, m in named if importlib.util.find_spec(m) is None)
    assert missing == []


def _resolves(name):
    """Whether a dotted name (`tracer.schema.part_paths`) is a module of the checkout or a name one defines."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    else:
        return False
    for j, part in enumerate(parts[i:]):
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        # a name made at its first use (tracer.metering.callbacks.LightningMeter needs Lightning): defined in the source
        source = getattr(found, "__file__", None) or ""
        text = open(source, encoding="utf-8").read() if source.endswith(".py") else ""
        return j == len(parts[i:]) - 1 and re.search(rf"^\s*(class|def) {part}\b|^{part} = ", text, re.M) is not None
    return True


def test_the_dotted_names_the_docs_give_import():
    """Each `tracer.<module>.<name>` and `reports.<module>.<name>` in the docs is there to import
    (`tracer.meter_callbacks.LightningMeter` is tracer.metering.callbacks.LightningMeter since the move)."""
    named = {
        (doc, n.rstrip("."))
        for doc, text in _docs().items()
        for n in re.findall(r"(?<![\w/.])(?:tracer|reports)\.[A-Za-z_][\w.]*", text)
    }
    files = (".py", ".md", ".sql", ".cpp", ".h", ".so", ".parquet")
    missing = sorted((doc, n) for doc, n in named if not n.endswith(files) and not _resolves(n))
    assert missing == []


def test_the_files_the_docs_name_are_there():
    """`tracer/writer.py` is tracer/store/writer.py since the move: every path of the checkout a doc names exists."""
    named = {
        (doc, p)
        for doc, text in _docs().items()
        for p in re.findall(r"(?<![\w/.-])(?:tracer|reports|tests|examples|benchmarks|docs)/[\w/.*-]*[\w*]", text)
    }
    elsewhere = {"docs/performance.md"}  # torchtitan's, which the README cites
    missing = sorted((doc, p) for doc, p in named if p not in elsewhere and not list(ROOT.glob(p)))
    assert missing == []
