"""benchmarks/plan_validation.py and the table it writes into docs/planning.md: every row cites where its figure is
published, the table covers at least 12 planned runs from at least 3 sources on at least 2 GPU generations with
tensor- and pipeline-parallel runs listed, and the smallest run, re-traced and re-planned here, reproduces the
table's figure."""

import importlib.util
import re

import pytest

from tests import helpers

ROOT = helpers.ROOT
PAGE = ROOT / "docs" / "planning.md"


@pytest.fixture(scope="module")
def validation():
    spec = importlib.util.spec_from_file_location("plan_validation", ROOT / "benchmarks" / "plan_validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows():
    text = PAGE.read_text()
    block = text[text.index("<!-- plan_validation: start -->") : text.index("<!-- plan_validation: end -->")]
    rows = [line.split(" | ") for line in block.splitlines() if line.startswith("| ") and not line.startswith("| run")]
    return {r[0].removeprefix("| "): r for r in rows}, block


def test_every_row_cites_its_source_and_published_figure(validation):
    rows, block = _rows()
    assert set(rows) == {run.name for run in validation.RUNS}
    for run in validation.RUNS:
        row = rows[run.name]
        assert re.search(r"github\.com|arXiv", row[-1]), run.name  # the source: a repository and file, or a paper
        assert run.source in row[-1]
        if run.status:
            assert row[3].startswith("pending: ")
        else:
            assert row[2].split(" (")[0] == f"{run.published:,.0f}"  # the published tokens/s/GPU, as printed
    planned = [r for r in validation.RUNS if not r.status]
    assert len(planned) >= 12
    sources = {r.source.split(",")[0].split(" (")[0] for r in planned}
    assert len(sources) >= 3, sources  # llm-foundry, torchtitan, fms-fsdp
    assert {r.gpu.split()[0] for r in planned} >= {"A100", "H100"}
    pending = " ".join(r.status for r in validation.RUNS)
    assert "--tp" in pending and "--pp" in pending
    assert "median |error|" in block and re.search(r"at commit [0-9a-f]{7}", block)


def test_the_smallest_run_reproduces_the_table(validation, tmp_path):
    (run,) = [r for r in validation.RUNS if r.name == "mpt-125m-a100"]
    result = validation.validate([run], tmp_path, log=lambda s: None)[run.name]
    rows, _ = _rows()
    planned = rows[run.name][3].split(" (")[0]
    assert f"{result['planned']:,.0f}" == planned
    assert rows[run.name][4] == f"{result['error_pct']:+.1f}%"
