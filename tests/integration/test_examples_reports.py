"""The report examples as a user runs them: examples/compare_precision.py and examples/matmul_mfu.py.

Both run in one child Python (tests.helpers.run_examples), each from an empty directory (the scripts put the
checkout on sys.path).
"""

import re

import pytest
import torch

from reports.compare import compare
from reports.loading.load import load
from tests.helpers import run_examples


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """What compare_precision.py and matmul_mfu.py --size 256 printed, run in one child Python; the directory each
    ran in is cwd/<script>."""
    cwd = tmp_path_factory.mktemp("examples")
    found = run_examples(cwd, ("compare_precision.py", []), ("matmul_mfu.py", ["--size", "256"]))
    for result in found.values():
        assert result["code"] == 0 and "Traceback" not in result["stderr"], result
    return found, cwd


# ------------------------------------------------------------------ compare_precision.py
@pytest.fixture(scope="module")
def precision(scripts):
    """(stdout, working directory) of one run of compare_precision.py."""
    found, cwd = scripts
    return found["compare_precision.py"]["stdout"], cwd / "compare_precision.py"


def test_compare_precision_prints_the_tables(precision):
    out, _ = precision
    assert out.startswith("By phase (signed changes of bf16 against fp32, in %)\n")
    assert "\nBytes allocated by dtype\n" in out
    assert re.search(r"^\s*total\s+bf16\s", out, re.M)
    assert re.search(r"^\s*bf16\s+bfloat16\s", out, re.M)  # autocast made bfloat16 storages
    assert not re.search(r"^\s*fp32\s+bfloat16\s", out, re.M)  # the fp32 run made none


def test_compare_precision_matmul_bytes_halve(precision):
    out, _ = precision
    line = re.search(r"^matmul output bytes: fp32 ([\d,]+), bf16 ([\d,]+) \(ratio 0\.50\)$", out, re.M)
    assert line, out
    fp32, bf16 = (int(g.replace(",", "")) for g in line.groups())
    assert fp32 == 2 * bf16  # float32: 4 bytes per element, bfloat16: 2, for the same shapes


def test_compare_precision_traces_by_op(precision):
    """reports.compare on the two traces the script wrote: every mm writes half the bytes under bf16 autocast."""
    _, cwd = precision
    fp32, bf16 = cwd / "runs" / "gpt_fp32.parquet", cwd / "runs" / "gpt_bf16.parquet"
    assert fp32.is_dir() and bf16.is_dir()
    table = compare(load([fp32, bf16]), by="op")
    mm = table[table["op"] == "aten.mm.default"].set_index("run")
    assert list(mm.index) == ["fp32", "bf16"]
    assert mm.loc["fp32", "bytes_allocated_change_pct"] == 0.0
    # exactly: (2 - 4) / 4 bytes for every output = -50% (the ratio 0.5 before)
    assert mm.loc["bf16", "bytes_allocated_change_pct"] == -50.0
    assert mm.loc["bf16", "flops_change_pct"] == 0.0  # the same matmuls, so the same FLOPs
    assert mm.loc["bf16", "bytes_allocated_per_step"] * 2 == mm.loc["fp32", "bytes_allocated_per_step"]


# ------------------------------------------------------------------ matmul_mfu.py
@pytest.fixture(scope="module")
def matmul_out(scripts):
    return scripts[0]["matmul_mfu.py"]["stdout"]


def test_matmul_mfu_flops(matmul_out):
    # B = D = K = 256: 2 * 256 * 256 * 256 = 2 * 16,777,216 = 33,554,432
    assert matmul_out.splitlines()[0] == "256 x 256 @ 256 x 256: 2·B·D·K = 33,554,432 FLOPs"
    assert 2 * 256**3 == 33554432


def test_matmul_mfu_line_per_dtype(matmul_out):
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    sections = re.findall(r"^(\w+) (float32|bfloat16): [\d.]+ ms, actual [\d.]+ GFLOP/s$", matmul_out, re.M)
    assert sections == [(d, t) for d in devices for t in ("float32", "bfloat16")], matmul_out
    mfu = re.findall(r"^  MFU = actual / promised = (\d+\.\d{3}|N/A)$", matmul_out, re.M)
    assert len(mfu) == len(sections), matmul_out
    for value in mfu:
        assert value == "N/A" or float(value) > 0
