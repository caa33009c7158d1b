"""benchmarks/plan_validation.py and the table it writes into docs/planning.md: every row cites where its figure is
published, the table covers at least 12 planned runs from at least 3 sources on at least 2 GPU generations with
tensor- and pipeline-parallel runs planned, and the smallest run, re-traced and re-planned here, reproduces the
table's figure; every run published as out of memory is planned as not fitting, the smallest re-traced here."""

import importlib.util
import re

import pytest

import reports
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
    assert set(rows) == {run.name for run in validation.RUNS + validation.MEMORY_RUNS}
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
    # tensor- and pipeline-parallel runs planned, not pending: torchtitan's 405B at TP 8, Megatron-LM's 1T at
    # TP 8 x PP 64
    assert any(r.model.tp > 1 for r in planned) and any(r.pp > 1 and r.model.tp > 1 for r in planned)
    assert {r.name for r in validation.RUNS if r.status} == set()
    assert "median |error|" in block and re.search(r"at commit [0-9a-f]{7}", block)


def test_the_smallest_run_reproduces_the_table(validation, tmp_path):
    (run,) = [r for r in validation.RUNS if r.name == "mpt-125m-a100"]
    result = validation.validate([run], tmp_path, log=lambda s: None)[run.name]
    rows, _ = _rows()
    planned = rows[run.name][3].split(" (")[0]
    assert f"{result['planned']:,.0f}" == planned
    assert rows[run.name][4] == f"{result['error_pct']:+.1f}%"


def test_a_published_tflops_per_gpu_is_tokens_per_gpu(validation):
    # Narayanan et al. 2021, equation 3, per token: 96 x 128 x 25,600^2 x (1 + 2,048 / 153,600 + 51,200 / 52,428,800)
    # = 8.0531e12 x 1.014310 = 8.1683e12 FLOPs; 163e12 / 8.1683e12 = 19.955 tokens/s per GPU
    assert validation.megatron_tokens(163, 25600, 128) == pytest.approx(19.955, abs=5e-4)
    (run,) = [r for r in validation.RUNS if r.name == "megatron-1t-a100-tp-pp"]
    assert (run.model.tp, run.pp, run.micro_batches) == (8, 64, 512)  # 3,072 GPUs / (8 x 64) = 6 replicas: 3,072 / 6


def test_every_memory_row_cites_its_source_and_the_published_verdict(validation):
    rows, block = _rows()
    oom = [r for r in validation.MEMORY_RUNS if r.oom]
    assert len(oom) >= 3 and len({validation.source_of(r) for r in oom}) >= 2  # torchtitan, Hugging Face's blog
    for run in validation.MEMORY_RUNS:
        row = rows[run.name]
        assert re.search(r"github\.com|arXiv", row[-1]) and run.source in row[-1], run.name
        assert row[2] == ("out of memory" if run.oom else "ran"), run.name
        # the plan's verdict is the published one: an out-of-memory run does not fit, a run that ran fits
        assert row[4].startswith("NO (" if run.oom else "yes ("), run.name
        assert row[6] == "yes", run.name
    # 19 runs of the throughput table, the 70B selective-op run at batch 1 and GPT-2 XL's FSDP run ran; 3 runs
    # published as OOM
    assert (
        "Memory verdicts: 21 of 21 runs published as running planned as fitting (the throughput table's and the "
        "rows above that ran); 3 of 3 runs published as out of memory planned as not fitting." in block
    )


def test_gpt2_xl_on_one_titan_rtx_does_not_fit(validation, tmp_path):
    # Hugging Face's blog, Table 2: GPT-2 XL, DDP on one 24GB Titan RTX, float32, batch 1: CUDA out of memory
    (run,) = [r for r in validation.MEMORY_RUNS if r.name == "gpt2-xl-titan-rtx-1gpu-oom"]
    path = tmp_path / run.model.key
    validation.trace(run.model, path)
    frame = reports.plan(reports.load(path), run.gpu, gpus_per_node=8)
    (detail,) = frame.attrs["plan"].values()
    memory = detail["memory"]
    # AdamW's two float32 states: 2 x 4 bytes x 1,555,992,290 parameters = 12,447,938,320 bytes
    assert memory["optimizer_state_made_bytes"] == 12_447_938_320
    assert memory["peak_phase"] == "optimizer" and memory["nccl_buffer_bytes"] == 0  # one GPU: no NCCL
    # parameters, gradients and states, 16 x 1,555,992,290 = 24,895,876,640 bytes, and the optimizer's temporaries
    assert memory["peak_bytes_per_rank"] == 31_119_842_416
    # required 1.1 x 31,119,842,416 + 2^30 = 34,231,826,657.6 + 1,073,741,824 = 35,305,568,481.6 > 24 GiB
    assert memory["required_bytes"] == pytest.approx(35_305_568_481.6)
    assert memory["device_memory_bytes"] == 24 * 2**30 and memory["fits"] is False
    assert validation.validate_memory([run], tmp_path, log=lambda s: None)[run.name]["disagreement"] == ""
