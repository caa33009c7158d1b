"""The README and the docs pages: every Python block runs, each page's blocks in order in one namespace in an
empty directory, and every output block shown under a code block is what that code prints (after the
normalisations of NORMALISE). The README stays a front page (size and line-length limits), and the site builds
with `mkdocs build --strict` where mkdocs is installed (the `docs` extra)."""

import contextlib
import io
import re
import shutil
import subprocess
import sys

import pytest

from tests import helpers
from tests.helpers import forked

ROOT = helpers.ROOT
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
DEMO = "runs/gpt.parquet"  # a page whose Python reads it starts with the demo's trace there (fixture `demo`)

# Blocks the tests do not run, each marked in its page by `<!-- skip: REASON -->` on the line before the block.
SKIPPED = {
    ("docs/distributed.md", "needs torchrun"),
    ("docs/plan.md", "traces Llama-3-8B on the meta device, 13-23 s"),
    ("docs/sql_dialects.md", "needs Spark (pyspark and a JDK): tests/reports/sql/test_dialects.py runs these views"),
}

# What differs from run to run, replaced by a placeholder in the output shown and in the output printed alike.
NORMALISE = [
    (r"\d[\d,]*(\.\d+)? ?(ns|us|µs|ms|s)\b", "<time>"),  # a measured time: 1.52 ms, 12 s
    (r"[\d,]+(\.\d+)? tok/s", "<rate> tok/s"),  # tokens per second of a measured step
    (r"MFU \d+(\.\d+)?% \(fp32 ideal peak of the CPU\)", "MFU <pct>"),  # of a measured step time
    # a CPU whose clock /proc/cpuinfo does not give has no ideal peak (tracer.peaks.cpu_ideal_flops)
    (r"MFU N/A: no peak for this device and dtype \(pass peak_flops=\)", "MFU <pct>"),
    (r"0x[0-9a-f]+", "<addr>"),  # an object's address
]


def normalise(text):
    for pattern, placeholder in NORMALISE:
        text = re.sub(pattern, placeholder, text)
    return text


def blocks(page):
    """[(line, language, code, output or None, skip reason or None)] for each fenced code block of the page, in
    order. An output block is a fence without a language right after a code block (blank lines between)."""
    lines = (ROOT / page).read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        start, language = i + 1, fence.group(1)
        end = lines.index("```", start)
        previous = next((x for x in reversed(lines[:i]) if x.strip()), "")
        skip = re.fullmatch(r"<!-- skip: (.*) -->", previous)
        code = "\n".join(lines[start:end]) + "\n"
        i, output = end + 1, None
        while i < len(lines) and not lines[i].strip():
            i += 1
        if language and i < len(lines) and lines[i] == "```":
            out_end = lines.index("```", i + 1)
            output = "\n".join(lines[i + 1 : out_end]) + "\n"
            i = out_end + 1
        found.append((start, language, code, output, skip and skip.group(1)))
    return found


def test_the_readme_is_a_front_page():
    """At most 300 lines and 40 KB, prose wrapped at 120 columns (a table row may be longer), the first example
    within 10 lines, the four commands and the two set-up commands named, and every docs page linked."""
    text = (ROOT / "README.md").read_text()
    lines = text.split("\n")
    assert len(lines) <= 300 and len(text.encode()) <= 40_000, (len(lines), len(text.encode()))
    assert [n for n, line in enumerate(lines, 1) if len(line) > 120 and not line.startswith("|")] == []
    first = next(b for b in blocks("README.md") if b[1] == "python")
    assert first[1] == "python" and len(first[2].strip().splitlines()) <= 10 and first[3]
    for command in ("make demo", "make test", "optrace report", "optrace compare", "optrace export", "optrace plan"):
        assert command in text, command
    linked = set(re.findall(r"\]\(docs/([\w.]+\.md)", text))
    assert linked == {p.removeprefix("docs/") for p in PAGES if p.startswith("docs/") and p != "docs/index.md"}


def test_every_page_is_in_the_site_nav():
    nav = set(re.findall(r":\s*([\w]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert nav == {p.removeprefix("docs/") for p in PAGES if p.startswith("docs/")}


def test_the_skipped_blocks_are_the_listed_ones():
    marked = {(page, skip) for page in PAGES for *_, skip in blocks(page) if skip}
    assert marked == SKIPPED


def test_every_output_shown_follows_code_that_is_run_or_listed():
    """An output block under a shell command is shown only where the command is skipped with its reason."""
    unchecked = [
        (page, line)
        for page in PAGES
        for line, language, _, output, skip in blocks(page)
        if output is not None and language != "python" and not skip
    ]
    assert unchecked == []


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's trace: examples/gpt.py as `make demo` runs it (3 AdamW steps of the example GPT, fp32)."""
    where = tmp_path_factory.mktemp("demo")
    done = forked.run(
        script=ROOT / "examples" / "gpt.py",
        args=["--out", DEMO],
        cwd=where,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return where / DEMO


@pytest.mark.parametrize("page", [p for p in PAGES if any(b[1] == "python" for b in blocks(p))])
def test_the_page_runs_as_shown(page, tmp_path, monkeypatch, request):
    """The page's Python blocks, in order, in one namespace, from an empty directory (holding the demo's trace
    when the page reads it); each output block under one is what it printed."""
    runnable = [b for b in blocks(page) if b[1] == "python" and not b[4]]
    if any(DEMO in code for _, _, code, _, _ in runnable):
        shutil.copytree(request.getfixturevalue("demo"), tmp_path / DEMO)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    namespace = {"__name__": "__docs__"}
    for line, _, code, output, _ in runnable:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{page}:{line}", "exec"), namespace)
        if output is not None:
            assert normalise(printed.getvalue()) == normalise(output), f"{page}:{line}"


def test_the_site_builds_strict(tmp_path):
    """`mkdocs build --strict` (what `make docs` runs): no broken link, no docstring mkdocstrings cannot read."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()
