"""reports.plan and `optrace plan`: memory fit, step time, communication and MFU on a named GPU.

Most tests use a bf16 stack of 4 bias-free Linear(d, d) layers on the meta device, x [1024, d],
one forward and backward (`model(x).sum().backward()`, no optimizer), planned on an H100 SXM
(989.4 dense bf16 TFLOP/s, 3.35 TB/s, 80 GiB) with the default assumptions: matmul efficiency
0.8, a 1 GiB CUDA context, 10% fragmentation, no NCCL buffers (no process group).

Its matmuls: 4 forward (x @ W^T), 4 weight gradients and 3 input gradients (x needs none):
11 x 2 x 1024 x d^2 FLOPs. At d = 8192: 11 x 137,438,953,472 = 1,511,828,488,192. Each has
intensity 2 x 1024 x d^2 / (2 x (1024 d + d^2 + 1024 d)) = 819 FLOP/B at d = 8192, above the H100's
ridge (989.4e12 x 0.8) / (3.35e12 x 0.8) = 295: compute-bound, as on an A100 (312e12 / 2.039e12 = 153).
"""

import inspect
import json

import numpy as np
import pytest
import torch
from torch import nn

import reports
from reports.flops.peaks import cpu_ideal_flops
from reports.output.cli import main
from tests.tracer.distributed.test_job import simulate  # the same 4-unit FSDP2 job
from tracer import Tracer

GiB = 2**30
H100_MEMORY = 80 * GiB  # 85,899,345,920


def stack(path, d, batch=1024, layers=4):
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False, dtype=torch.bfloat16) for _ in range(layers)])
        x = torch.empty(batch, d, dtype=torch.bfloat16)
    with Tracer(path, model=model, tokens=batch):
        model(x).sum().backward()
    return reports.load(path)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return stack(tmp_path_factory.mktemp("plan") / "d8192", 8192)


def test_compute_time_is_the_matmul_flops_over_the_peak_times_the_matmul_efficiency(small):
    row = reports.plan(small, "H100 SXM", assumptions={"matmul_efficiency": 0.8}).iloc[0]  # given: every matmul
    # 11 matmuls x 2 x 1024 x 8192^2 = 1,511,828,488,192 FLOPs / (989.4e12 x 0.8) = 1.91003e-3 s
    assert row["compute_bound_s"] == pytest.approx(1_511_828_488_192 / (989.4e12 * 0.8), rel=1e-12)
    assert row["compute_s"] == pytest.approx(
        row["compute_bound_s"] + row["memory_bound_s"] + row["launch_s"], rel=1e-12
    )
    assert row["comm_s"] == 0 and row["exposed_comm_s"] == 0 and row["step_time_s"] == row["compute_s"]


def test_matmuls_are_priced_by_their_shape_from_the_gemm_sweep(tmp_path):
    """On an H100 a bf16 matmul reaches what the published sweep measured at its shape (reports.plan.efficiency),
    times matmul_stack (by default its generation's, fitted on published runs: Hopper 0.673, A100 0.776); an A100
    the same curve scaled to its best GEMM (267.9 of 312 TFLOP/s)."""
    df = stack(tmp_path / "s", 4096, batch=4096)  # every matmul 4096 x 4096 x 4096, a measured shape
    h100 = reports.plan(df, "H100 SXM").iloc[0]
    # 11 x 2 x 4096^3 = 1,511,828,488,192 FLOPs at the sweep's 783.33 TFLOP/s for 4096^3 x 0.673: 2.86776e-3 s
    assert h100["compute_bound_s"] == pytest.approx(1_511_828_488_192 / (783.33e12 * 0.673), rel=1e-9)
    # at the sweep's own figure (matmul_stack 1): 1.93000e-3 s
    sweep = reports.plan(df, "H100 SXM", assumptions={"matmul_stack": 1.0}).iloc[0]
    assert sweep["compute_bound_s"] == pytest.approx(1_511_828_488_192 / 783.33e12, rel=1e-9)
    # an A100: 783.33 / 989.4 = 0.79173 of the peak is the sweep's best, scaled to 267.9 / 312: 267.9 TFLOP/s, x 0.776
    a100 = reports.plan(df, "A100 80GB SXM").iloc[0]
    assert a100["compute_bound_s"] == pytest.approx(1_511_828_488_192 / (267.9e12 * 0.776), rel=1e-9)
    # the stack factor divides: at 0.5 twice the time
    half = reports.plan(df, "H100 SXM", assumptions={"matmul_stack": 0.5}).iloc[0]
    assert half["compute_bound_s"] == pytest.approx(2 * 1_511_828_488_192 / 783.33e12, rel=1e-9)
    (detail,) = reports.plan(df, "H100 SXM").attrs["plan"].values()
    listed = {a["name"]: a for a in detail["assumptions"]}
    assert listed["matmul_efficiency"]["value"] == pytest.approx(783.33 / 989.4 * 0.673, rel=1e-9)
    assert listed["matmul_stack"]["value"] == 0.673 and "published run" in listed["matmul_stack"]["source"]
    assert listed["matmul_efficiency"]["source"].startswith("reports.plan.efficiency: 11 matmul ops")
    # smaller shapes reach less: one layer at batch 256, its forward 256 x 4096 x 4096 measured at 412.03 TFLOP/s,
    # its weight gradient 4096 x 4096 x 256 at 392.16 (x needs no gradient): 2 x 256 x 4096^2 FLOPs each, / 0.673
    small_m = reports.plan(stack(tmp_path / "m", 4096, batch=256, layers=1), "H100 SXM").iloc[0]
    swept = 2 * 256 * 4096**2 * (1 / 412.03e12 + 1 / 392.16e12)
    assert small_m["compute_bound_s"] == pytest.approx(swept / 0.673, rel=1e-9)


def test_the_stack_fits_with_its_headroom(small):
    row = reports.plan(small, "H100").iloc[0]
    # peak in the backward: parameters 4 x 8192^2 x 2 = 536,870,912, all 4 gradients (536,870,912),
    # x and the last input gradient [1024, 8192] bf16 (2 x 16,777,216) and the two 0-d bf16 scalars
    # (sum and its ones_like, 4 bytes): 1,107,296,260
    assert row["peak_bytes_per_rank"] == 1_107_296_260 == reports.peak(small)["peak_live_bytes"].iloc[0]
    # required: 1.1 x 1,107,296,260 + 1 GiB = 1,218,025,886 + 1,073,741,824 = 2,291,767,710
    assert row["required_bytes"] == pytest.approx(2_291_767_710)
    assert row["fits"] and row["device_memory_bytes"] == H100_MEMORY
    assert row["headroom_bytes"] == pytest.approx(85_899_345_920 - 2_291_767_710)  # 83,607,578,210
    assert row["batch"] == 1024 and row["micro_batch"] == 1024


def test_the_stack_100x_larger_does_not_fit(tmp_path):
    row = reports.plan(stack(tmp_path / "d81920", 81920), "H100").iloc[0]  # d x 10: 100x the parameters
    # parameters 4 x 81920^2 x 2 = 53,687,091,200 and as many gradient bytes, x and the last input
    # gradient 2 x 1024 x 81920 x 2 = 335,544,320, the scalars 4: 107,709,726,724
    assert row["peak_bytes_per_rank"] == 107_709_726_724
    # required 1.1 x 107,709,726,724 + 2^30 = 119,554,441,220.4; headroom 85,899,345,920 - that
    assert row["headroom_bytes"] == pytest.approx(-33_655_095_300.4)
    assert not row["fits"]
    assert row["max_micro_batch"] == 0  # the parameters and gradients alone exceed the memory


def test_largest_micro_batch_is_the_last_that_fits(small):
    row = reports.plan(small, "H100").iloc[0]
    # budget (80 GiB - 1 GiB) / 1.1 = 77,114,185,541.8 bytes of live bytes. It binds at the second weight
    # gradient of the backward: fixed 805,306,368 (parameters and two gradients), growing with the
    # batch 83,886,084: k = (77,114,185,541.8 - 805,306,368) / 83,886,084 = 909.67; x 1024 = 931,504
    assert row["max_micro_batch"] == 931_504
    assert reports.plan(small, "H100", micro_batch=931_504).iloc[0]["fits"]
    assert not reports.plan(small, "H100", micro_batch=931_505).iloc[0]["fits"]


def test_activation_extrapolation_against_a_trace_at_twice_the_batch(tmp_path):
    once, twice = stack(tmp_path / "b1024", 4096), stack(tmp_path / "b2048", 4096, batch=2048)
    predicted = reports.plan(once, "H100", micro_batch=2048).iloc[0]["peak_bytes_per_rank"]
    flat = {"matmul_efficiency": 0.8}  # given: the FLOPs alone set the time (by shape, k = 2048 reaches more)
    traced = reports.peak(twice)["peak_live_bytes"].iloc[0]
    # traced at 2048: parameters and gradients 2 x 4 x 4096^2 x 2 = 268,435,456, x and the last input
    # gradient 2 x 2048 x 4096 x 2 = 33,554,432, the two scalars 4: 301,989,892
    assert traced == 301_989_892
    # predicted: the scalars are counted as growing with the batch (4 bytes become 8)
    assert predicted == 301_989_896
    # and the FLOPs of forward and backward scale with it: twice the compute-bound time
    assert reports.plan(once, "H100", micro_batch=2048, assumptions=flat).iloc[0]["compute_bound_s"] == pytest.approx(
        2 * reports.plan(once, "H100", assumptions=flat).iloc[0]["compute_bound_s"], rel=1e-12
    )


def test_micro_batch_scales_activation_bytes_not_weight_or_gradient_bytes(tmp_path):
    one = stack(tmp_path / "b1", 4096, batch=1, layers=1)  # memory-bound: 2 x 4096^2 FLOPs per 32 MiB weight
    bound = [reports.plan(one, "H100", micro_batch=b).iloc[0]["memory_bound_s"] for b in (1, 8, 64)]
    # fixed: the forward mm reads W (4096^2 x 2 = 33,554,432 B), the weight-gradient mm writes W.grad (as much);
    # growing: x read and x @ W^T written (2 x 8,192), the dW mm's reads of x and the expanded ones (2 x 8,192),
    # sum (8,192 + 2), ones_like (2 + 2): 40,966 B at batch 1
    fixed, grows = 2 * 33_554_432, 40_966
    for b, seconds in zip((1, 8, 64), bound):
        # at 3.35e12 x 0.8 B/s: 25.06, 25.16, 26.02 us (scaling every byte gave 25.06 x 64 = 1,604 us at 64)
        assert seconds == pytest.approx((fixed + b * grows) / (3.35e12 * 0.8), rel=1e-12)


def test_a100_to_h100_scales_a_matmul_bound_trace_by_the_peak_ratio(small):
    flat = {"matmul_efficiency": 0.8}  # given: one efficiency on both (by default each has its own table)
    h100 = reports.plan(small, "H100", assumptions=flat).iloc[0]
    a100 = reports.plan(small, "A100 80GB SXM", assumptions=flat).iloc[0]
    assert a100["compute_bound_s"] / h100["compute_bound_s"] == pytest.approx(989.4 / 312, rel=1e-12)
    assert a100["peak_flops_per_s"] == 312e12 and h100["peak_flops_per_s"] == 989.4e12


@pytest.mark.parametrize("gpu", ["H100 SXM", "H100 PCIe", "H200", "B200", "A100 80GB SXM", "A100 40GB SXM"])
@pytest.mark.parametrize("ideal", [False, True])
def test_mfu_is_never_above_1(small, gpu, ideal):
    ones = {
        "matmul_efficiency": 1,
        "attention_efficiency": 1,
        "vector_efficiency": 1,
        "memory_efficiency": 1,
        "launch_s": 0,
    }
    row = reports.plan(small, gpu, assumptions=ones if ideal else None).iloc[0]
    # model FLOPs: the 11 matmuls and the sum (1024 x 8192 = 8,388,608): 1,511,836,876,800
    assert row["model_flops_per_step"] == 1_511_836_876_800
    assert 0 < row["mfu"] <= 1
    assert row["mfu"] == pytest.approx(row["model_flops_per_step"] / row["step_time_s"] / row["peak_flops_per_s"])


@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_priced_at_its_efficiency_and_causal_at_half(tmp_path, causal):
    class Attention(torch.nn.Module):  # a model on the meta device: the tracer runs the flash kernel CUDA would
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.empty(1, device="meta"))

        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with torch.device("meta"):
        q, k, v = (torch.empty(1, 8, 4096, 128, dtype=torch.bfloat16) for _ in range(3))
    model = Attention()
    with Tracer(tmp_path / "sdpa", model=model, tokens=4096):
        model(q, k, v)
    df = reports.load(tmp_path / "sdpa")
    row = reports.plan(df, "H100", batch=1).iloc[0]
    # 4 x b x h x s^2 x hd = 4 x 8 x 4096^2 x 128 = 68,719,476,736 FLOPs (the whole score matrix, causal or not)
    assert df.loc[df["flop_kind"] == "attention", "flops"].sum() == 68_719_476_736
    # at 989.4e12 x 0.35: 198.4 us; a causal kernel skips the masked half: 99.2 us
    expected = 68_719_476_736 / (989.4e12 * 0.35) / (2 if causal else 1)
    assert row["compute_bound_s"] == pytest.approx(expected, rel=1e-12)
    # at efficiency 0.7: 99.3 us, a causal kernel 49.6 us (the floor at the counted FLOPs over the peak gave 69.5 us)
    fast = reports.plan(df, "H100", batch=1, assumptions={"attention_efficiency": 0.7}).iloc[0]
    assert fast["compute_bound_s"] == pytest.approx(68_719_476_736 / (989.4e12 * 0.7) / (2 if causal else 1), rel=1e-12)
    # never faster than the FLOPs it performs at the peak: 69.5 us, causal 34.7 us
    ideal = reports.plan(df, "H100", batch=1, assumptions={"attention_efficiency": 1, "launch_s": 0}).iloc[0]
    assert ideal["compute_bound_s"] == pytest.approx(68_719_476_736 / 989.4e12 / (2 if causal else 1), rel=1e-12)
    # MFU counts a causal kernel's performed half: 34,359,738,368 model FLOPs, the masked half beside them
    assert ideal["model_flops_per_step"] == (34_359_738_368 if causal else 68_719_476_736)
    assert ideal["causal_masked_flops_per_step"] == (34_359_738_368 if causal else 0)
    assert ideal["mfu"] == pytest.approx(1, rel=1e-12)  # the kernel alone at the peak: MFU 1, never above


LAYER_BYTES = 64 * 64 * 4  # 16,384: one fp32 Linear(64, 64) weight


def fsdp(path, world):
    """One step of rank 0 of a `world`-rank FSDP2 job: 4 fp32 Linear(64, 64) layers, each a unit
    (tests/tracer/distributed/test_job.py's simulate): 8 all-gathers and 4 reduce-scatters of 16,384 bytes per step."""
    simulate(path, world, steps=1)
    return reports.load(path)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return fsdp(tmp_path_factory.mktemp("plan") / "w64", 64)


def test_fsdp_communication_is_the_bytes_over_the_stated_bandwidths(job):
    row = reports.plan(job, "H100").iloc[0]
    assert row["world_size"] == 64
    # 64 ranks, 8 per node: 8 nodes. Each collective sends 16,384 x 63/64 = 16,128 bytes over
    # min(NVLink 450e9, 8 GPUs x 50e9 NIC) x 0.8 = 320e9 B/s, after NCCL's ring latency
    # 8.4 us + (63 - 7) x 3.4 us + 7 x 9.6 us = 266.0 us; 12 collectives per step
    per_collective = 8.4e-6 + 56 * 3.4e-6 + 7 * 9.6e-6 + 16_128 / 320e9
    assert row["comm_s"] == pytest.approx(12 * per_collective, rel=1e-12)  # 3.1926048e-3 s
    # one node of 64: NVLink 450e9 x 0.8 = 360e9 B/s, latency 8.4 + 63 x 3.4 = 222.6 us
    one_node = reports.plan(job, "H100", gpus_per_node=64).iloc[0]
    assert one_node["comm_s"] == pytest.approx(12 * (8.4e-6 + 63 * 3.4e-6 + 16_128 / 360e9), rel=1e-12)
    # an A100's 200 Gb/s ports: min(300e9, 8 x 25e9) x 0.8 = 160e9 B/s
    a100 = reports.plan(job, "A100 80GB SXM").iloc[0]
    assert a100["comm_s"] == pytest.approx(12 * (8.4e-6 + 56 * 3.4e-6 + 7 * 9.6e-6 + 16_128 / 160e9), rel=1e-12)


def test_a_group_without_its_ranks_is_taken_as_consecutive_and_named(job):
    bare = job.copy()  # the runs' metadata without process_groups (as a trace from before they were recorded)
    runs = {run: {k: v for k, v in meta.items() if k != "process_groups"} for run, meta in job.attrs["runs"].items()}
    bare.attrs = {**job.attrs, "runs": runs}
    row = reports.plan(bare, "H100")
    # the world group's 64 ranks taken as 0..63: the same 8 nodes of 8 as from its listed ranks
    assert row.iloc[0]["comm_s"] == reports.plan(job, "H100").iloc[0]["comm_s"]
    notes = row.attrs["plan"][row.iloc[0]["run"]]["notes"]
    assert any(n.startswith("process groups without their ranks in the trace (") for n in notes)
    assert not any(
        "without their ranks" in n for n in reports.plan(job, "H100").attrs["plan"][row.iloc[0]["run"]]["notes"]
    )


def test_overlap_hides_part_of_the_communication(job):
    prefetch = reports.plan(job, "H100").iloc[0]
    serial = reports.plan(job, "H100", overlap="none").iloc[0]
    assert serial["exposed_comm_s"] == pytest.approx(serial["comm_s"], rel=1e-12)
    assert serial["step_time_s"] == pytest.approx(serial["compute_s"] + serial["comm_s"], rel=1e-12)
    assert 0 < prefetch["exposed_comm_s"] < prefetch["comm_s"]
    assert prefetch["step_time_s"] == pytest.approx(prefetch["compute_s"] + prefetch["exposed_comm_s"], rel=1e-12)
    # NCCL buffers for the job's one process group
    assert reports.plan(job, "H100").attrs["plan"][prefetch["run"]]["memory"]["nccl_buffer_bytes"] == 256 * 2**20


def test_calibration_on_the_cpu_the_trace_ran_on(tmp_path):
    """A CPU trace planned on that CPU, its op times replaced by exactly twice each op's roof:
    every efficiency is measured as 0.5, and the plan predicts the traced step with no error."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    with Tracer(tmp_path / "cpu", model=model, tokens=16) as tr:
        model(torch.randn(16, 32)).sum().backward()
        tr.set_bandwidth({"bytes_per_s": 1.0e10, "n": 1, "dtype": "float32"})
    df = reports.load(tmp_path / "cpu")
    meta = df.attrs["runs"][df["run"].iloc[0]]
    peak = cpu_ideal_flops(meta["device"], "float32")[0]
    if peak is None:
        pytest.skip("this CPU's metadata gives no ideal peak")
    nbytes = np.where(df["is_view"], 0, df["bytes_read"] + df["bytes_written"]).astype(float)
    flops = df["flops"].to_numpy(float)
    roof = np.maximum(flops / peak, nbytes / 1.0e10)
    kernel = ~df["is_view"].to_numpy() & ((flops > 0) | (nbytes > 0))
    df["busy_ns"] = np.where(kernel, 2 * roof * 1e9, 0.0)
    df["duration_ns"] = df["busy_ns"]
    frame = reports.plan(df, "cpu")
    row = frame.iloc[0]
    assert row["calibrated"] and row["gpu"] == "cpu"
    listed = {a["name"]: a for a in frame.attrs["plan"][row["run"]]["assumptions"]}
    measured = [
        n
        for n in ("matmul_efficiency", "vector_efficiency", "memory_efficiency")
        if listed[n]["source"].startswith("measured")
    ]
    assert measured and all(listed[n]["value"] == pytest.approx(0.5, rel=1e-9) for n in measured)
    assert listed["launch_s"]["value"] == 0
    assert row["traced_step_s"] == pytest.approx(2 * roof[kernel].sum(), rel=1e-9)
    assert row["error_pct"] == pytest.approx(0, abs=1e-6)
    assert row["fits"] is None and row["max_micro_batch"] is None  # a CPU's memory size is not in the catalogue


def test_a_meta_trace_is_not_calibrated(small):
    row = reports.plan(small, "H100").iloc[0]
    assert not row["calibrated"] and row["error_pct"] is None


def test_cli(tmp_path, capsys):
    stack(tmp_path / "t", 8192)
    assert main(["plan", str(tmp_path / "t"), "--gpu", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    assert "on H100 SXM (8 per node)" in text
    # headroom 83,607,578,210 bytes / 2^30 = 77.87 GiB; required 85,899,345,920 - 83,607,578,210 = 2,291,767,710
    # bytes = 2.13 GiB
    assert "Fits: needs 2.13 GiB of 80.00 GiB per rank, 77.87 GiB spare; micro-batch up to 931504 fits" in text
    assert "mamf-finder" not in text  # the assumptions' sources only with --assumptions
    assert main(["plan", str(tmp_path / "t"), "--gpu", "h100-sxm", "--assumptions"]) == 0
    text = capsys.readouterr().out
    # the sweep's 0.6917 at these shapes x Hopper's matmul_stack 0.673 = 0.4655
    assert "  matmul_efficiency        0.4655\n" in text and "GEMM sweep by (m, n, k)" in text
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--json", "--assume", "matmul_efficiency=0.5"]) == 0
    found = json.loads(capsys.readouterr().out)
    for key in (
        "fits",
        "peak_bytes_per_rank",
        "device_memory_bytes",
        "headroom_bytes",
        "max_micro_batch",
        "compute_s",
        "comm_s",
        "exposed_comm_s",
        "step_time_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "assumptions",
    ):
        assert key in found
    assert found["fits"] is True and found["max_micro_batch"] == 931_504
    # 1,511,828,488,192 / (989.4e12 x 0.5) = 3.056e-3 s
    assert found["compute_bound_s"] == pytest.approx(1_511_828_488_192 / (989.4e12 * 0.5), rel=1e-12)
    listed = {a["name"]: a for a in found["assumptions"]}
    assert listed["matmul_efficiency"] == {
        "name": "matmul_efficiency",
        "value": 0.5,
        "unit": "fraction",
        "source": "given",
    }
    assert all(a["source"] for a in found["assumptions"])
    assert {
        "peak_flops_per_s",
        "hbm_bytes_per_s",
        "intra_node_bytes_per_s",
        "nic_bytes_per_s",
        "overlap",
        "cuda_context_bytes",
        "nccl_buffer_bytes",
        "fragmentation",
        "launch_s",
    } <= set(listed)


def test_cli_bad_gpu_is_one_line(tmp_path, capsys):
    stack(tmp_path / "t", 64)
    assert main(["plan", str(tmp_path / "t"), "--gpu", "X900"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "optrace plan: error: unknown gpu 'X900'; expected one of T4, V100 SXM2 16GB, V100 SXM2 32GB, "
        "V100 PCIe 16GB, V100 PCIe 32GB, A10, A10G, A100 40GB SXM, A100 80GB SXM, A100 40GB PCIe, "
        "A100 80GB PCIe, L4, L40S, H100 SXM, H100 SXM 96GB, H100 PCIe, H100 NVL, H200, B200, RTX 3090, "
        "RTX 4090, TITAN RTX, MI250X, MI300X, cpu"
    )
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--assume", "warp_speed=2"]) == 2
    assert "unknown assumption 'warp_speed'" in capsys.readouterr().err


def test_cpu_target_without_a_measured_bandwidth_is_one_line(tmp_path):
    """A CPU trace without Tracer.set_bandwidth: no datasheet prices its memory-bound ops, so `plan --gpu cpu`
    says what to record (it raised a TypeError dividing by None)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    with Tracer(tmp_path / "cpu", model=model, tokens=4):
        model(torch.randn(4, 8)).sum().backward()
    df = reports.load(tmp_path / "cpu")
    with pytest.raises(reports.ReportError, match=r"gpu 'cpu' needs the CPU's memory bandwidth.*set_bandwidth"):
        reports.plan(df, "cpu")
    assert reports.plan(df, "H100 SXM")["gpu"].tolist() == ["H100 SXM"]  # a GPU target has its datasheet's


def test_bad_arguments_name_the_value(small):
    with pytest.raises(reports.ReportError, match="gpus_per_node must be an int >= 1, got 0"):
        reports.plan(small, "H100", gpus_per_node=0)
    with pytest.raises(reports.ReportError, match="overlap must be one of prefetch, none, got 'some'"):
        reports.plan(small, "H100", overlap="some")
    with pytest.raises(reports.ReportError, match=r"matmul_efficiency must be in \[0.01, 1\], got 1.5"):
        reports.plan(small, "H100", assumptions={"matmul_efficiency": 1.5})
    with pytest.raises(reports.ReportError, match="this trace ran on 'meta'"):
        reports.plan(small, "cpu")


def test_plan_takes_its_options_by_position_and_names_itself_for_a_bad_keyword(small):
    """reports.plan(df, gpu, gpus_per_node, micro_batch, ...) as at 8aabd0a, before reports.plan.options.Options: the
    options in their order may be given by position, and a keyword it does not take is plan()'s TypeError."""
    by_name = reports.plan(small, "H100", gpus_per_node=4, micro_batch=2)
    by_position = reports.plan(small, "H100", 4, 2)  # gpus_per_node=4, micro_batch=2
    assert by_position.equals(by_name)
    assert list(inspect.signature(reports.plan).parameters)[:4] == ["df", "gpu", "gpus_per_node", "micro_batch"]
    with pytest.raises(TypeError, match=r"^plan\(\) got an unexpected keyword argument 'micro_bach'$"):
        reports.plan(small, "H100", micro_bach=2)
    with pytest.raises(TypeError, match=r"^plan\(\) multiple values for argument 'gpus_per_node'$"):
        reports.plan(small, "H100", 4, gpus_per_node=4)


@pytest.mark.parametrize("value", ["1e-320", "0.0099"])
def test_an_efficiency_that_makes_a_time_infinite_is_refused(tmp_path, capsys, value):
    """memory_efficiency=1e-320 was inside (0, 1] and gave an "inf" step time (bytes / (bandwidth x 1e-320)
    overflows); every efficiency's range now starts at 1%, and a value below is one line with the range."""
    stack(tmp_path / "t", 64)
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--assume", f"memory_efficiency={value}"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        f"optrace plan: error: assumption memory_efficiency must be in [0.01, 1], got {float(value)!r}\n",
    )


def test_every_figure_is_finite_at_the_least_efficiencies(small):
    """At the lowest end of every efficiency range (0.01) the plan's times are finite and scale as 0.8 / 0.01."""
    least = {
        name: 0.01
        for name in (
            "matmul_efficiency",
            "attention_efficiency",
            "vector_efficiency",
            "memory_efficiency",
            "link_efficiency",
        )
    }
    row = reports.plan(small, "H100 SXM", assumptions=least).iloc[0]
    # 1,511,828,488,192 FLOPs / (989.4e12 x 0.01) = 0.152802 s, 80x the 1.91003e-3 s at 0.8
    assert row["compute_bound_s"] == pytest.approx(1_511_828_488_192 / (989.4e12 * 0.01), rel=1e-12)
    figures = [v for v in row.to_numpy() if isinstance(v, float)]
    assert figures and all(np.isfinite(v) or np.isnan(v) for v in figures)
    assert np.isfinite(row["step_time_s"]) and np.isfinite(row["mfu"]) and row["step_time_s"] > 0.15


def test_plan_llama_example_on_its_tiny_configuration(tmp_path, capsys):
    import plan_llama

    assert plan_llama.main(["--model", "tiny", "--world", "8", "--json", "--out", str(tmp_path / "tiny")]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["world_size"] == 8 and found["gpu"] == "H100 SXM" and found["fits"] is True
    assert found["batch"] == 1 and found["tokens_per_step"] == 32  # one sequence of 32 tokens per rank
    assert found["comm_s"] > 0 and 0 < found["mfu"] <= 1
    # the tiny Llama's N: embedding and head 2 x 256 x 64, per block 4 attention weights (64x64, 64x32 twice
    # for 2 KV heads of 16, 64x64) and 3 FFN weights (64x128), 2 norms of 64; final norm 64
    params = 2 * 256 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64  # 106,816
    meta = next(iter(reports.load(tmp_path / "tiny").attrs["runs"].values()))
    assert meta["params"]["total"] == params


def test_a_group_is_placed_by_its_ranks():
    from reports.plan.assumptions import DEFAULTS
    from reports.plan.comm import collective_cost, placement
    from reports.plan.devices import GPUS

    assert placement(8, 8, list(range(0, 64, 8))) == (8, 1)  # HSDP's replicate group: one GPU on each of 8 nodes
    assert placement(4, 8, [0, 1, 8, 9]) == (2, 2)
    assert placement(64, 8) == (8, 8) and placement(4, 8) == (1, 4)  # no ranks: consecutive
    h100 = GPUS["H100 SXM"]
    seconds, sent, bandwidth, latency = collective_cost("all_reduce", 2**20, 4, h100, 8, DEFAULTS, [0, 1, 8, 9])
    # 2 nodes, 2 GPUs on each: min(450e9, 2 x 50e9) x 0.8 = 80e9 B/s; 2 x 3 ring steps, 2 x 1 across nodes:
    # 8.4 + 4 x 3.4 + 2 x 9.6 = 41.2 us; 2^20 x 2 x 3 / 4 = 1,572,864 B sent: 19.6608 us
    assert (sent, bandwidth) == (1_572_864, 80e9) and latency == pytest.approx(41.2e-6, rel=1e-12)
    assert seconds == pytest.approx(41.2e-6 + 1_572_864 / 80e9, rel=1e-12)
    # the same 4 ranks taken as consecutive: one node, NVLink 360e9 B/s, 8.4 + 6 x 3.4 = 28.8 us
    assert collective_cost("all_reduce", 2**20, 4, h100, 8, DEFAULTS)[0] == pytest.approx(
        28.8e-6 + 1_572_864 / 360e9, rel=1e-12
    )
    # a broadcast is one pipelined ring step (NCCL tuning.cc): 8.4 + 3.4 = 11.8 us on one node whatever W (it
    # was 8.4 + 7 x 3.4 + 9.6 = 41.8 us for 8 ranks, a network step on no network); 8.4 + 9.6 = 18 us across nodes
    for w, ranks, latency in ((2, None, 11.8e-6), (8, None, 11.8e-6), (4, [0, 1, 8, 9], 18.0e-6)):
        assert collective_cost("broadcast", 2**20, w, h100, 8, DEFAULTS, ranks)[3] == pytest.approx(latency, rel=1e-12)
    # the others: W steps, none across nodes on one node (all-to-all on 4 consecutive ranks: 8.4 + 4 x 3.4 = 22 us)
    assert collective_cost("all_to_all", 2**20, 4, h100, 8, DEFAULTS)[3] == pytest.approx(22.0e-6, rel=1e-12)


def test_plan_micro_batch_keeps_weight_reads_fixed(tmp_path):
    with torch.device("meta"):
        lin = nn.Linear(4096, 4096, bias=False, dtype=torch.bfloat16)
        x = torch.empty(1, 4096, dtype=torch.bfloat16)
    with Tracer(tmp_path / "m", model=lin, tokens=1):
        lin(x)
    df = reports.load(tmp_path / "m")
    for b in (1, 8, 64):
        # (33,554,432 weight bytes + b x 16,384 activation bytes) / (3.35e12 x 0.8): 12.53, 12.57, 12.91 us
        # (scaling the weight too gave 12.53, 100.21, 801.69 us)
        row = reports.plan(df, "H100", micro_batch=b).iloc[0]
        assert row["memory_bound_s"] == pytest.approx((33_554_432 + b * 16_384) / (3.35e12 * 0.8), rel=1e-9)


class Queries(nn.Module):
    """DETR's decoder queries: a learnt [256, 64] fp32 table (65,536 bytes) repeated over the batch, a copy made from
    a parameter alone that grows with the micro-batch (unlike autocast's copy of a weight, which keeps its shape)."""

    def __init__(self):
        super().__init__()
        self.query = nn.Parameter(torch.randn(256, 64))

    def forward(self, x):
        q = self.query.unsqueeze(0).repeat(x.shape[0], 1, 1)  # [B, 256, 64]: B x 65,536 bytes
        return q.sin() + q


def _queries(path, batch):
    torch.manual_seed(0)
    model, x = Queries(), torch.randn(batch, 256, 64)
    with Tracer(path, model=model, tokens=batch * 256), torch.no_grad():
        model(x)
    return reports.load(path)


@pytest.mark.parametrize("traced", [1, 2])
def test_a_parameter_repeated_over_the_batch_grows_with_the_micro_batch(tmp_path, traced):
    at8 = reports.plan(_queries(tmp_path / "b8", 8), "H100").iloc[0]
    planned = reports.plan(_queries(tmp_path / "b", traced), "H100", micro_batch=8).iloc[0]
    assert (planned["batch"], at8["batch"]) == (traced, 8)
    # live after the add: the table 65,536 + repeat, sin and add 3 x 8 x 65,536 = 1,638,400 bytes; planned from
    # batch 2 it was 1,245,184 (the repeat's 131,072 bytes, 8 x the table's numel at 1 byte an item, taken for a
    # copy of a parameter and kept fixed: 65,536 + 131,072 + 4 x 262,144)
    assert at8["peak_bytes_per_rank"] == planned["peak_bytes_per_rank"] == 1_638_400
    # bytes moved: the table read once, the repeat written, sin's read and write, add's two reads and a write:
    # 65,536 + 6 x 524,288 = 3,211,264 at 3.35e12 x 0.8 B/s = 1.198 us; from batch 2 it was 0.758 us
    assert planned["memory_bound_s"] == pytest.approx(3_211_264 / (3.35e12 * 0.8), rel=1e-9)
    assert at8["memory_bound_s"] == pytest.approx(3_211_264 / (3.35e12 * 0.8), rel=1e-9)


def _transposed_autocast(path, batch):
    """8 frozen weights of [32, 64] and [64, 32] in turn, used as `h @ w.t()` under bf16 autocast behind a trainable
    scale: autocast copies each transposed view to bf16 (a [64, 32] copy of a [32, 64] weight: 2,048 x 2 = 4,096 bytes),
    saved for the backward's dL/dh."""
    torch.manual_seed(0)
    model = nn.Module()
    model.w = nn.ParameterList(
        nn.Parameter(torch.randn(*((32, 64) if i % 2 == 0 else (64, 32))), requires_grad=False) for i in range(8)
    )
    model.scale = nn.Parameter(torch.ones(64))
    x = torch.randn(batch, 64)
    with Tracer(path, model=model, tokens=batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x * model.scale
            for w in model.w:
                h = h @ w.t()
            loss = h.float().square().mean()
        loss.backward()
    return reports.load(path)


def test_autocasts_copy_of_a_transposed_weight_stays_fixed_as_the_micro_batch_grows(tmp_path):
    planned = reports.plan(_transposed_autocast(tmp_path / "b4", 4), "H100", micro_batch=8).iloc[0]
    traced = reports.plan(_transposed_autocast(tmp_path / "b8", 8), "H100").iloc[0]
    # the copies keep the weights' numel but not their shapes: taken by shape for growing ones, the plan from batch 4
    # gave 144,656 bytes, the 8 copies' 8 x 4,096 = 32,768 bytes counted twice; now the traced 111,880 and the
    # loss scalar and its gradient (4 bytes each, counted as growing) twice over: + 8
    assert traced["peak_bytes_per_rank"] == 111_880
    assert planned["peak_bytes_per_rank"] == 111_880 + 8


def test_plan_prices_a_strided_group_across_nodes(tmp_path):
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=64)
    try:
        mesh = init_device_mesh("cpu", (8, 8), mesh_dim_names=("replicate", "shard"))
        with FakeTensorMode():
            model = nn.Sequential(nn.Linear(64, 64, bias=False))
            fully_shard(model, mesh=mesh)
            with Tracer(tmp_path / "h", model=model, tokens=8):
                model(torch.randn(8, 64)).sum().backward()
    finally:
        dist.destroy_process_group()
    df = reports.load(tmp_path / "h")
    plan = reports.plan(df, "H100", overlap="none").iloc[0]
    ar = df[df["op"].astype(str).str.contains("allreduce")]
    rs = df[df["op"].astype(str).str.contains("reduce_scatter")]
    ag = df[df["op"].astype(str).str.contains("allgather")]
    assert len(ar) == 1 and len(rs) == 1 and len(ag) == 1
    # the all-reduce's 8 ranks sit on 8 nodes, one GPU each: min(450e9, 1 x 50e9) x 0.8 = 40e9 B/s, 2·7 ring steps
    # all across nodes: 8.4 + 14 x 9.6 = 142.8 us; the shard group (one node): NVLink 360e9 B/s, 8.4 + 7 x 3.4 us
    s = float(ar["comm_bytes"].iloc[0])
    want = 8.4e-6 + 14 * 9.6e-6 + s * 2 * 7 / 8 / 40e9
    for c in (rs, ag):
        want += 8.4e-6 + 7 * 3.4e-6 + float(c["comm_bytes"].iloc[0]) * 7 / 8 / 360e9
    assert plan["comm_s"] == pytest.approx(want, rel=1e-9)  # 207.4 us (120.5 us with the all-reduce inside a node)
