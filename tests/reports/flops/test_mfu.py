"""reports.mfu and reports.peaks: exact MFU on a synthetic trace, None when unknowable, peak tables."""

import copy
import subprocess
import sys

import pandas as pd
import pyarrow as pa
import pytest
import torch
from torch import nn

from reports.errors import ReportError
from reports.flops.mfu import matmul_dtype, mfu
from reports.flops.peaks import PEAKS, cpu_ideal_flops, match_device, peak_flops
from reports.flops.rows import Rows
from reports.loading.load import load
from tests import helpers

B, D, H, K = 32, 8, 16, 4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, H)
        self.fc2 = nn.Linear(H, K)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).square().mean()


def trace_mlp(path, step_time=None, ceiling=None, autocast=False):
    from tracer import Tracer

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(B, D)
    with Tracer(path, model=model, tokens=B, run_name="mlp") as tr:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
    if step_time is not None:
        tr.set_step_time(step_time)
    if ceiling is not None:
        tr.set_ceiling(ceiling)
    return load(path)


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mfu") / "mlp"
    trace_mlp(path)
    return path


@pytest.fixture
def mlp(mlp_path):
    return load(mlp_path)  # fresh per test: tests edit the metadata


def synthetic(df):
    """The trace with every FLOP zeroed but one forward matmul (0.4e9), one backward matmul
    (0.8e9) and one optimizer op (0.3e9): model FLOPs 1.2e9, hardware FLOPs 1.5e9."""
    df = df.copy()
    df.attrs = copy.deepcopy(df.attrs)
    df["flops"] = 0
    mm = df["flop_kind"] == "matmul"
    df.loc[df.index[mm & (df["phase"] == "forward")][0], "flops"] = 400_000_000
    df.loc[df.index[mm & (df["phase"] == "backward")][0], "flops"] = 800_000_000
    df.loc[df.index[df["phase"] == "optimizer"][-1], "flops"] = 300_000_000
    return df


def test_mfu_exact_on_a_synthetic_trace(mlp):
    row = mfu(synthetic(mlp), step_time_s=0.01, peak_flops=2e11).iloc[0]
    assert row["model_flops_per_step"] == 1.2e9  # 0.4e9 forward + 0.8e9 backward
    assert row["hardware_flops_per_step"] == 1.5e9  # + 0.3e9 optimizer
    assert row["achieved_flops_per_s"] == pytest.approx(1.2e11)  # 1.2e9 FLOPs / 0.01 s
    assert row["mfu"] == pytest.approx(0.6)  # 1.2e11 / 2e11
    assert row["hfu"] == pytest.approx(0.75)  # 1.5e9 / 0.01 s / 2e11
    assert row["peak_source"] == "given" and row["step_time_source"] == "given"
    assert row["tokens_per_s"] == pytest.approx(3200)  # 32 tokens / 0.01 s


def test_step_time_from_metadata_and_ceiling(tmp_path):
    ceiling = {"dtype": "float32", "n": 64, "seconds": 1.0, "flops_per_s": 4e11}
    df = synthetic(trace_mlp(tmp_path / "timed", step_time=0.02, ceiling=ceiling))
    row = mfu(df, peak_flops=2e11).iloc[0]
    assert row["step_time_s"] == 0.02 and row["step_time_source"] == "untraced median (metadata)"
    assert row["mfu"] == pytest.approx(0.3)  # 1.2e9 / 0.02 s = 6e10; / 2e11
    assert row["mfu_of_achievable"] == pytest.approx(0.15)  # 6e10 / 4e11 measured float32 matmuls
    assert row["ceiling_dtype"] == "float32"
    # a ceiling measured in another dtype says nothing about this run
    df.attrs["runs"]["mlp"]["ceiling"]["dtype"] = "bfloat16"
    assert pd.isna(mfu(df, peak_flops=2e11).iloc[0]["mfu_of_achievable"])


def test_no_step_time_no_mfu(mlp):
    row = mfu(mlp).iloc[0]
    assert pd.isna(row["step_time_s"]) and pd.isna(row["achieved_flops_per_s"])
    assert pd.isna(row["mfu"]) and pd.isna(row["hfu"])
    assert row["step_time_source"] == "none: no untraced step time"
    assert row["model_flops_per_step"] > 0  # the FLOPs are known all the same


def test_no_matching_peak_no_mfu(mlp):
    df = mlp
    df.attrs["runs"]["mlp"]["device"] = {"type": "cuda", "name": "Tesla T4"}
    row = mfu(df, step_time_s=0.01, dtype="bfloat16").iloc[0]
    assert pd.isna(row["peak_flops_per_s"]) and pd.isna(row["mfu"])
    assert "T4 has no dense bfloat16 peak" in row["peak_source"]
    assert row["achieved_flops_per_s"] > 0
    df.attrs["runs"]["mlp"]["device"] = {"type": "cuda", "name": "NVIDIA RTX A1000"}
    row = mfu(df, step_time_s=0.01).iloc[0]
    assert pd.isna(row["mfu"]) and "no datasheet peak for device 'NVIDIA RTX A1000'" in row["peak_source"]
    df.attrs["runs"]["mlp"]["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}
    row = mfu(df, step_time_s=0.01, dtype="bfloat16").iloc[0]
    assert row["peak_flops_per_s"] == 989.4e12 and pd.isna(row["ideal_flops_per_s"])


def test_cpu_peak_is_the_ideal(mlp):
    row = mfu(mlp, step_time_s=0.01).iloc[0]
    ideal, source = cpu_ideal_flops(mlp.attrs["runs"]["mlp"]["device"], "float32")
    assert row["dtype"] == "float32"
    assert row["peak_flops_per_s"] == row["ideal_flops_per_s"] == ideal
    assert row["peak_source"] == source and source.startswith("CPU ideal: ")


def test_dtype_is_the_one_carrying_matmul_flops(tmp_path):
    assert mfu(trace_mlp(tmp_path / "bf16", autocast=True)).iloc[0]["dtype"] == "bfloat16"


def test_fused_attention_recomputation_is_not_model_flops(tmp_path):
    from tracer import Tracer

    b, h, s, e = 2, 2, 8, 4
    q, k, v = (torch.randn(b, h, s, e, requires_grad=True) for _ in range(3))
    with Tracer(tmp_path / "sdpa", tokens=b * s, run_name="sdpa"):
        nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
    df = load(tmp_path / "sdpa")
    att = df[df["flop_kind"] == "attention"].set_index("phase")["flops"]
    # forward: 2 * b * h * s * s * (e + e) = 2 * 2 * 2 * 8 * 8 * 8 = 4,096
    # backward: 2 * b * h * s * s * (3e + 2e) = 10,240, of which q @ k^T again: 2 * b * h * s * s * e = 2,048
    assert (att["forward"], att["backward"]) == (4096, 10240)
    row = mfu(df, step_time_s=1.0, peak_flops=1e9).iloc[0]
    assert row["recompute_flops_per_step"] == 2048
    assert row["model_flops_per_step"] == df["flops"].sum() - 2048
    assert row["hardware_flops_per_step"] == df["flops"].sum()


def test_several_runs(tmp_path, mlp_path):
    from tracer import Tracer

    other = tmp_path / "other"
    torch.manual_seed(0)
    model = MLP()
    with Tracer(other, model=model, tokens=B, run_name="fwd_bwd"):
        model(torch.randn(B, D)).backward()
    out = mfu(load([mlp_path, other]), step_time_s={"mlp": 0.01, "fwd_bwd": 0.02}, peak_flops=1e12)
    assert list(out["run"]) == ["mlp", "fwd_bwd"]
    assert list(out["step_time_s"]) == [0.01, 0.02]
    assert out["optimizer_flops_per_step"].iloc[1] == 0
    assert out["model_flops_per_step"].iloc[0] == out["model_flops_per_step"].iloc[1]  # same forward + backward


def test_errors(mlp):
    with pytest.raises(ReportError, match=r"mfu: step_time_s must be a number > 0 \(or \{run: number\}\), got 0"):
        mfu(mlp, step_time_s=0)
    with pytest.raises(ReportError, match=r"mfu: peak_flops must be a number > 0 \(or \{run: number\}\), got 'fast'"):
        mfu(mlp, peak_flops="fast")
    with pytest.raises(
        ReportError, match=r"mfu: dtype must be a dtype name such as 'bfloat16' or a torch.dtype, got 3"
    ):
        mfu(mlp, dtype=3)
    with pytest.raises(ReportError, match=r"mfu: the trace lacks column\(s\) \['input_dtypes'\]; load it with them"):
        mfu(mlp.drop(columns=["input_dtypes"]))
    with pytest.raises(ReportError, match=r"peak_flops: override must be FLOP/s > 0, got -1"):
        peak_flops({"type": "cpu"}, "float32", override=-1)


# peaks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", None),  # slower than the SXM part, not in the table
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10G", "A10G"),  # not A10, not A100
        ("NVIDIA A10", "A10"),
        ("NVIDIA RTX A1000", None),  # never "A100" inside "A1000"
        ("NVIDIA RTX A1000 Laptop GPU", None),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", None),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA GeForce RTX 4080", None),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI250X/MI250", "MI250X"),
        ("AMD Instinct MI210", None),
        ("AMD EPYC 7763 64-Core Processor", None),
        ("", None),
        (None, None),
    ],
)
def test_match_device(name, key):
    assert match_device(name) == key


def test_peak_table_is_dense_and_sourced():
    devices = {d for d, _ in PEAKS}
    assert devices >= {
        "T4",
        "V100 SXM2",
        "A10",
        "A10G",
        "A100",
        "L4",
        "L40S",
        "H100 SXM",
        "H100 PCIe",
        "H100 NVL",
        "H200",
        "B200",
        "RTX 3090",
        "RTX 4090",
        "TITAN RTX",
        "MI250X",
        "MI300X",
    }
    for (device, dtype), (value, source) in PEAKS.items():
        assert value > 0 and source, (device, dtype)
        assert dtype in ("float32", "tfloat32", "bfloat16", "float16", "float8")
    # dense, not the datasheets' 2:4-sparse figures
    assert PEAKS[("H100 SXM", "bfloat16")][0] == 989.4e12
    assert PEAKS[("A100", "bfloat16")][0] == 312e12
    assert PEAKS[("A100", "float32")][0] == 19.5e12
    assert ("T4", "bfloat16") not in PEAKS  # Turing has no bf16 tensor cores


@pytest.mark.parametrize(
    "device, dtype, expected",
    [
        # 4 cores x 3.0 GHz x (16 lanes x 2 FMA x 2 units = 64) = 7.68e11
        (
            {"type": "cpu", "cores": 4, "threads": 4, "max_mhz": 3000, "mhz": 1200, "isa": ["avx512f", "avx2", "fma"]},
            "float32",
            7.68e11,
        ),
        # AVX2: 8 lanes x 2 x 2 = 32 per cycle: 4 x 3e9 x 32 = 3.84e11; float64 half that
        ({"type": "cpu", "cores": 4, "threads": 4, "mhz": 3000, "isa": ["avx2", "fma"]}, "float32", 3.84e11),
        ({"type": "cpu", "cores": 4, "threads": 4, "mhz": 3000, "isa": ["avx2", "fma"]}, "float64", 1.92e11),
        # torch uses 2 threads of 8 logical CPUs: 2 x 2e9 x 64 = 2.56e11
        ({"type": "cpu", "cores": 8, "threads": 2, "mhz": 2000, "isa": ["avx512f"]}, "float32", 2.56e11),
        # AMX: 1,024 bf16 FLOPs per cycle: 2 x 2e9 x 1024 = 4.096e12; AVX512_BF16: 2 x 64 = 128
        ({"type": "cpu", "cores": 2, "threads": 2, "mhz": 2000, "isa": ["amx_bf16", "avx512f"]}, "bfloat16", 4.096e12),
        (
            {"type": "cpu", "cores": 2, "threads": 2, "mhz": 2000, "isa": ["avx512_bf16", "avx512f"]},
            "bfloat16",
            5.12e11,
        ),
        # bf16 without native support runs in fp32; AVX2 + FMA: 2 x 2e9 x 32 = 1.28e11
        ({"type": "cpu", "cores": 2, "threads": 2, "mhz": 2000, "isa": ["avx2", "fma"]}, "bfloat16", 1.28e11),
        # AVX without FMA: a multiply and an add unit, 8 x 2 = 16 per cycle: 2 x 2e9 x 16 = 6.4e10
        ({"type": "cpu", "cores": 2, "threads": 2, "mhz": 2000, "isa": ["avx", "sse2"]}, "float32", 6.4e10),
        ({"type": "cpu", "cores": 2, "threads": 2, "isa": ["avx2"]}, "float32", None),  # no clock
        ({"type": "cpu", "cores": 2, "threads": 2, "mhz": 2000, "isa": ["avx2"]}, "int8", None),
        ({"type": "cuda", "name": "NVIDIA A100-SXM4-80GB"}, "float32", None),
    ],
)
def test_cpu_ideal_flops(device, dtype, expected):
    value, source = cpu_ideal_flops(device, dtype)
    assert value == pytest.approx(expected) if expected else value is None
    assert source


def test_peak_flops_lookup():
    assert peak_flops({"type": "cuda", "name": "NVIDIA A10G"}, "torch.bfloat16")[0] == 70e12
    assert peak_flops({"type": "cuda", "name": "NVIDIA A100-SXM4-80GB"}, "tf32")[0] == 156e12
    assert peak_flops({"type": "cuda", "name": "NVIDIA H100 PCIe"}, "float8_e4m3fn")[0] == 1513e12
    assert peak_flops({"type": "cuda", "name": "NVIDIA H100 PCIe"}, "bf16", override=1e14) == (1e14, "given")
    assert peak_flops(None, "float32") == (None, "the trace records no device")


def test_reports_import_without_torch():
    code = "import sys, reports.tables, reports.flops.breakdown, reports.flops.mfu, reports.flops.peaks; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(helpers.ROOT)
    )
    assert out.stdout.strip() == "False"


def _dtype_rows(rows):
    """Rows of matmuls given as (op, FLOPs, input dtypes)."""
    ops, flops, dtypes = zip(*rows)
    return Rows(
        pa.table(
            {
                "op": list(ops),
                "flop_kind": ["matmul"] * len(ops),
                "flops": pa.array(flops, pa.int64()),
                "input_dtypes": list(dtypes),
            }
        )
    )


@pytest.mark.parametrize(
    "rows, expected",
    [
        # a tie (100 = 60 + 40 FLOPs each): the dtype seen first carries them
        ([("aten.mm.default", 100, ["bfloat16", "bfloat16"]), ("aten.mm.default", 60, ["float32", "float32"]),
          ("aten.mm.default", 40, ["float32", "float32"])], "bfloat16"),
        ([("aten.mm.default", 60, ["float32", "float32"]), ("aten.mm.default", 100, ["bfloat16", "bfloat16"]),
          ("aten.mm.default", 40, ["float32", "float32"])], "float32"),
        # addmm's first input (the bias) is added, not multiplied: 30 FLOPs of bfloat16 against 20 of float32
        ([("aten.addmm.default", 30, ["float32", "bfloat16", "bfloat16"]), ("aten.mm.default", 20, ["float32", "float32"])],
         "bfloat16"),
        # sums past 2**52 (float64 sums row by row): 3 x 2**61 of float32 against 2**62 of bfloat16
        ([("aten.mm.default", 2**62, ["bfloat16", "bfloat16"])] + [("aten.mm.default", 2**61, ["float32", "float32"])] * 3,
         "float32"),
    ],
)  # fmt: skip
def test_matmul_dtype_is_the_dtype_carrying_most_flops(rows, expected):
    assert matmul_dtype(_dtype_rows(rows)) == expected
