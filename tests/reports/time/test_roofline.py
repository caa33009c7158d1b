"""reports.roofline, the bandwidth table and tracer.memory_bandwidth: literal numbers on known ops."""

import math

import pandas as pd
import pytest
import torch

import reports
from reports.errors import ReportError
from reports.flops.peaks import BANDWIDTH, PEAKS, match_device, peak_bandwidth
from reports.time.roofline import roofline, roofline_split
from tests import helpers
from tracer import TraceError, Tracer, memory_bandwidth, read_metadata

N = 1024
PEAK = 1e12  # FLOP/s given: the ridge is 1e12 / 1e11 = 10 FLOPs per byte
BW = 1e11  # bytes/s


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("roofline") / "mm_add.parquet"
    a, b = torch.ones(N, N), torch.ones(N, N)
    with Tracer(path, run_name="mm_add"):
        a @ b
        a + b
        a + b
    df = reports.load(path)
    # fixed op times, so rates are literal: the mm 4 ms, each add 0.5 ms
    df["busy_ns"] = [4_000_000, 500_000, 500_000]
    return df


def test_roofline_mm_and_add_literal(trace):
    t = roofline(trace, peak_flops=PEAK, bandwidth=BW).set_index("op")
    mm, add = t.loc["aten.mm.default"], t.loc["aten.add.Tensor"]
    assert mm["flops_per_step"] == 2 * N**3 == 2_147_483_648  # 2 * 1024^3; one step: per step = the trace
    assert mm["bytes_per_step"] == 3 * 4 * N * N == 12_582_912  # two 4 MiB inputs read, one 4 MiB output written
    assert mm["arithmetic_intensity"] == pytest.approx(2 * N**3 / (12 * N * N)) == pytest.approx(170.6667, rel=1e-6)
    assert add["ops_per_step"] == 2 and add["flops_per_step"] == 2 * N * N  # 1 FLOP per output element, twice
    assert add["arithmetic_intensity"] == pytest.approx(1 / 12)  # 1 FLOP per 12 bytes (4 + 4 read, 4 written)
    assert mm["ridge_flops_per_byte"] == 10.0
    assert mm["bound"] == "compute" and add["bound"] == "memory"
    assert mm["attainable_flops_per_s"] == PEAK  # min(1e12, 170.67 x 1e11)
    assert add["attainable_flops_per_s"] == pytest.approx(BW / 12)  # min(1e12, 1e11 / 12) = 8.33e9
    assert mm["time_s_per_step"] == 0.004 and add["time_s_per_step"] == 0.001
    assert mm["achieved_flops_per_s"] == pytest.approx(2 * N**3 / 0.004)  # 5.37e11
    assert mm["efficiency"] == pytest.approx(2 * N**3 / 0.004 / PEAK)  # 0.537
    # the adds: 2 x 12 MiB in 1 ms = 25.2 GB/s of the 100 GB/s roof
    assert add["achieved_bytes_per_s"] == pytest.approx(2 * 12 * N * N / 0.001)
    assert add["efficiency"] == pytest.approx(2 * 12 * N * N / 0.001 / BW) == pytest.approx(0.2516582)
    assert add["efficiency"] == pytest.approx(add["achieved_flops_per_s"] / add["attainable_flops_per_s"])
    assert mm["time_pct"] == pytest.approx(80.0)  # 4 of 5 ms
    assert list(t.index) == ["aten.mm.default", "aten.add.Tensor"]  # most time first


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    """The mm and the two adds of `trace`, in each of 3 steps, with the same fixed op times."""
    path = tmp_path_factory.mktemp("roofline") / "three.parquet"
    a, b = torch.ones(N, N), torch.ones(N, N)

    class MmAdd(torch.nn.Module):
        def forward(self, a, b):  # forward work: each call is a step of its own after tr.step()
            return a @ b, a + b, a + b

    model = MmAdd()
    with Tracer(path, run_name="three", model=model) as tr:
        for _ in range(3):
            model(a, b)
            tr.step()
    df = reports.load(path)
    df["busy_ns"] = [4_000_000, 500_000, 500_000] * 3
    return df


def test_roofline_is_per_step(trace, three_steps):
    assert three_steps["step"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    t = roofline(three_steps, peak_flops=PEAK, bandwidth=BW).set_index("op")
    mm, add = t.loc["aten.mm.default"], t.loc["aten.add.Tensor"]
    # totals over the 3 steps / 3: exactly the figures of one step
    assert mm["ops_per_step"] == 1 and mm["flops_per_step"] == 2_147_483_648  # 3 * 2 * 1024^3 / 3
    assert mm["bytes_per_step"] == 12_582_912 and mm["time_s_per_step"] == 0.004  # 3 * 12 MiB / 3; 3 * 4 ms / 3
    assert add["ops_per_step"] == 2 and add["flops_per_step"] == 2_097_152  # 6 adds / 3; 6 * 1024^2 / 3
    assert add["bytes_per_step"] == 25_165_824 and add["time_s_per_step"] == 0.001  # 2 * 12 MiB; 2 * 0.5 ms
    assert mm["time_pct"] == 80.0  # 4 of the step's 5 ms
    one = roofline(trace, peak_flops=PEAK, bandwidth=BW).set_index("op")
    assert t.drop(columns="run", errors="ignore").equals(
        one.drop(columns="run", errors="ignore")
    )  # k steps: one step's table


def test_roofline_by_module_and_shape(trace):
    m = roofline(trace, by="module", peak_flops=PEAK, bandwidth=BW)
    assert len(m) == 1 and m["module"][0] == "" and m["dtype"][0] == "float32"
    # 2 * 1024^3 + 2 * 1024^2 FLOPs over 3 x 12 MiB
    assert m["arithmetic_intensity"][0] == pytest.approx((2 * N**3 + 2 * N * N) / (36 * N * N))
    s = roofline(trace, by="shape", peak_flops=PEAK, bandwidth=BW)
    assert list(s["input_shapes"]) == ["[1024, 1024], [1024, 1024]"] * 2


def test_roofline_split_literal(trace):
    s = roofline_split(trace, peak_flops=PEAK, bandwidth=BW).set_index("bound")
    assert list(s.index) == ["compute", "memory", "other"]
    assert s.loc["compute", "time_s"] == 0.004 and s.loc["memory", "time_s"] == 0.001
    assert s.loc["memory", "time_pct"] == pytest.approx(20.0)
    assert s.loc["compute", "roof_time_s"] == pytest.approx(2 * N**3 / PEAK)  # 2.15 ms at the peak
    assert s.loc["memory", "roof_time_s"] == pytest.approx(2 * 12 * N * N / BW)  # 0.25 ms at the bandwidth
    assert s.loc["other", "ops"] == 0 and math.isnan(s.loc["other", "roof_time_s"])


def test_roofline_unknown_bandwidth_is_other(trace):
    t = roofline(trace, peak_flops=PEAK)  # a CPU trace with no measured bandwidth
    assert (t["bound"] == "other").all() and t["attainable_flops_per_s"].isna().all()


def test_roofline_views_are_other(tmp_path):
    with Tracer(tmp_path / "v.parquet"):
        torch.ones(4, 4).t()
    t = roofline(reports.load(tmp_path / "v.parquet"), peak_flops=PEAK, bandwidth=BW).set_index("op")
    assert t.loc["aten.t.default", "bound"] == "other" and t.loc["aten.t.default", "bytes_per_step"] == 0
    assert t.loc["aten.ones.default", "bound"] == "memory"  # 64 bytes written, 0 FLOPs


def test_roofline_bad_input(trace):
    with pytest.raises(ReportError, match="roofline: by must be one of 'op', 'shape', 'module', got 'phase'"):
        roofline(trace, by="phase")
    with pytest.raises(ReportError, match="roofline: bandwidth must be a number > 0, got -1"):
        roofline(trace, bandwidth=-1)
    with pytest.raises(ReportError, match=r"roofline: the trace lacks column\(s\) \['busy_ns'\]"):
        roofline(trace.drop(columns="busy_ns"))


def test_bandwidth_table_covers_every_flop_device():
    assert {key for key, _ in PEAKS} - {"A100"} <= set(BANDWIDTH)
    for key, (value, source) in BANDWIDTH.items():
        assert value > 0 and source
    cases = [
        ("NVIDIA A100-SXM4-40GB", None, 1555e9),
        ("NVIDIA A100-PCIE-40GB", None, 1555e9),
        ("NVIDIA A100-SXM4-80GB", None, 2039e9),
        ("NVIDIA A100 80GB PCIe", None, 1935e9),
        ("NVIDIA A100", 85_000_000_000, 2039e9),  # no size in the name: 79 GiB of memory says 80GB
        ("NVIDIA H100 80GB HBM3", None, 3.35e12),
        ("NVIDIA H100 PCIe", None, 2.0e12),
        ("NVIDIA H200", None, 4.8e12),
        ("AMD Instinct MI250X", None, 1638.4e9),  # per GCD: half of 3.2768 TB/s
    ]
    for name, memory, expected in cases:
        meta = {"type": "cuda", "name": name, "total_memory_bytes": memory}
        assert peak_bandwidth(meta)[0] == pytest.approx(expected), name
    assert peak_bandwidth({"type": "cuda", "name": "NVIDIA A100"})[0] is None  # neither size nor memory
    assert match_device("NVIDIA A100-SXM4-80GB") == "A100"  # the FLOP table's key is unchanged


def test_cpu_bandwidth_is_the_measured_triad():
    cpu = {"type": "cpu", "name": "x"}
    assert peak_bandwidth(cpu)[0] is None
    value, source = peak_bandwidth(cpu, measured={"bytes_per_s": 2e10, "n": 8, "dtype": "float32"})
    assert value == 2e10 and source.startswith("measured")
    assert peak_bandwidth(cpu, override=5e9) == (5e9, "given")
    with pytest.raises(ReportError, match="peak_bandwidth: override must be bytes/s > 0, got 0"):
        peak_bandwidth(cpu, override=0)


def test_memory_bandwidth_triad(tmp_path):
    result = memory_bandwidth(n=2**16, trials=2)
    assert result["bytes"] == 3 * 4 * 2**16  # a, b, c: 65,536 float32 each
    assert result["bytes_per_s"] == pytest.approx(result["bytes"] / result["seconds"])
    with Tracer(tmp_path / "t.parquet") as tr:
        torch.ones(1) + 1
    tr.set_bandwidth(result)
    assert read_metadata(tmp_path / "t.parquet")["bandwidth"]["n"] == 2**16
    df = reports.load(tmp_path / "t.parquet")
    t = roofline(df, peak_flops=PEAK)
    assert (t["peak_bytes_per_s"] == result["bytes_per_s"]).all()
    with pytest.raises(TraceError, match="memory_bandwidth: n must be a positive int, got 0"):
        memory_bandwidth(n=0)
    with pytest.raises(TraceError, match="set_bandwidth: expected the dict memory_bandwidth returns, got 5"):
        tr.set_bandwidth(5)


def test_empty_trace_keeps_columns(trace):
    empty = trace.iloc[0:0]
    t = roofline(empty)
    assert len(t) == 0 and "efficiency" in t.columns and t["flops_per_step"].dtype == "float64"
    assert isinstance(roofline_split(empty), pd.DataFrame)


def test_plot_roofline_draws_roofs_and_points(trace):
    pytest.importorskip("matplotlib")
    from reports.output.plots import plot_roofline

    ax = plot_roofline(trace, peak_flops=PEAK, bandwidth=BW).axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = [line.get_label() for line in ax.get_lines()]
    assert lines == ["memory roof 100 GB/s", "float32 peak 1 TFLOP/s"]
    points = sum(len(c.get_offsets()) for c in ax.collections if "above its roof" not in c.get_label())  # not the rings
    assert points == 2  # mm (compute-bound) and add (memory-bound)


def test_new_report_modules_import_without_torch():
    import subprocess
    import sys

    code = (
        "import importlib, sys\n"
        "for name in ('reports.time.roofline', 'reports.output.export', 'reports.output.pftrace'):\n"
        "    module = importlib.import_module(name)\n"
        "    assert all(hasattr(module, n) for n in module.__all__), name\n"
        "assert 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=helpers.ROOT, check=True)


def test_a_frame_without_run_metadata_names_it(trace):
    """The roofs come from the run metadata (df.attrs["runs"]): a frame that lost it (a merge, a hand-made frame)
    gets reports.load's one-line error rather than NaN roofs and every op "other"; with both roofs given it has no
    need of it."""
    bare = trace.copy()
    bare.attrs = {}
    for call in (lambda: roofline(bare), lambda: roofline_split(bare), lambda: roofline(bare, peak_flops=PEAK)):
        with pytest.raises(ReportError, match=r"expected a DataFrame returned by reports.load \(its attrs\['runs'\]"):
            call()
    t = roofline(bare, peak_flops=PEAK, bandwidth=BW).set_index("op")
    assert t.loc["aten.mm.default", "bound"] == "compute"  # 2 * 1024^3 / (12 * 1024^2) = 170.7 over the ridge of 10


def test_an_arrow_table_needs_both_roofs(trace):
    """A pyarrow Table holds no run metadata, so no device to take a roof from: a one-line error naming the
    arguments rather than NaN roofs and every op "other"."""
    import pyarrow as pa

    table = pa.Table.from_pandas(trace.drop(columns=["run"]), preserve_index=False)
    for call in (lambda: roofline(table, bandwidth=BW), lambda: roofline_split(table, peak_flops=PEAK)):
        with pytest.raises(ReportError, match="a pyarrow Table holds no run metadata: give peak_flops= and bandwidth="):
            call()
    t = roofline(table, peak_flops=PEAK, bandwidth=BW).set_index("op")
    assert t.loc["aten.add.Tensor", "bound"] == "memory"  # 1 FLOP per 12 bytes, under the ridge of 10


def test_with_split_by_module_splits_rows_without_a_module():
    """roofline_with_split(by="module") on rows no module holds: the roofline has no group, the split still has
    every row (as roofline_split gives it), not NaN for a run it took for empty."""
    from reports.time.roofline import roofline_with_split

    df = pd.DataFrame(
        {
            "run": ["r", "r"],
            "step": [0, 0],
            "phase": ["forward", "forward"],
            "op": ["aten.mm.default", "aten.add.Tensor"],
            "module": [None, None],
            "flops": [1000, 10],
            "bytes_read": [100, 80],
            "bytes_written": [50, 40],
            "busy_ns": [None, None],
            "duration_ns": [2000, 1000],
            "input_dtypes": [["float32"], ["float32"]],
            "output_dtypes": [["float32"], ["float32"]],
            "is_view": [False, False],
        }
    )
    df.attrs["runs"] = {"r": {}}
    table, split = roofline_with_split(df, by="module", peak_flops=PEAK, bandwidth=BW)
    assert len(table) == 0
    s = split.set_index("bound")
    # ridge 10 FLOP/byte: the mm 1000 / 150 = 6.7 and the add 10 / 120 are both memory-bound, 2000 + 1000 ns
    assert s.loc["memory", "ops"] == 2 and s.loc["memory", "time_s"] == 3e-6 and s.loc["memory", "time_pct"] == 100
    assert s.loc["memory", "flops"] == 1010 and s.loc["memory", "bytes"] == 270  # 1000 + 10; 150 + 120
    pd.testing.assert_frame_equal(split, roofline_split(df, peak_flops=PEAK, bandwidth=BW))
