"""reports.plan.pipeline and `optrace plan --pp`: stages, the 1F1B and interleaved schedules' bubble, the
sends between stages and the memory of the micro-batches in flight.

The toy pipeline: 8 bias-free Linear(8192, 8192) bf16 layers in a Sequential on the meta device, x [1024,
8192] requiring its gradient (so every layer computes the same three matmuls: forward, input and weight
gradients), backward from a given gradient (no loss outside the layers), planned on an H100 SXM in 4
stages of 2 layers. A boundary carries one layer's output, [1024, 8192] bf16: 16,777,216 bytes; one send
takes nccl_base_s + one NVLink step + bytes / (0.8 x 450e9) = 8.4e-6 + 3.4e-6 + 16,777,216 / 360e9 s.
"""

import json

import pytest
import torch

import reports
from reports.errors import ReportError
from reports.output.cli import main
from reports.plan.devices import resolve_gpu
from reports.plan.pipeline import blocks_of, in_flight, partition, schedule
from tracer import Tracer

MiB = 2**20
BOUNDARY = 1024 * 8192 * 2  # 16,777,216 bytes: one layer's output
SEND = 8.4e-6 + 3.4e-6 + BOUNDARY / (0.8 * 450e9)  # 5.8403e-05 s


@pytest.fixture(scope="module")
def toy_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipeline") / "toy"
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192, bias=False, dtype=torch.bfloat16) for _ in range(8)])
        x = torch.empty(1024, 8192, dtype=torch.bfloat16, requires_grad=True)
        grad = torch.empty(1024, 8192, dtype=torch.bfloat16)
    with Tracer(path, model=model, tokens=1024):
        model(x).backward(grad)
    return str(path)


@pytest.fixture(scope="module")
def toy(toy_trace):
    return reports.load(toy_trace)


def test_1f1b_bubble_of_four_equal_stages_and_eight_micro_batches_is_3_of_11():
    timed = schedule([1.0, 1.0, 1.0, 1.0], micro_batches=8)
    assert timed["bubble_s"] == 3.0  # (p - 1) t = 3
    assert timed["step_s"] == 11.0  # (m + p - 1) t = (8 + 4 - 1) x 1
    assert timed["bubble_fraction"] == pytest.approx(3 / 11, rel=1e-15)  # (4-1)/(8+4-1)


def test_interleaving_divides_the_bubble_by_the_virtual_stages():
    timed = schedule([1.0] * 4, micro_batches=8, virtual_stages=2)
    assert timed["bubble_s"] == 1.5  # (p - 1) t / v = 3 / 2
    assert timed["bubble_fraction"] == pytest.approx(3 / 19, rel=1e-15)  # (p-1)/(v m + p - 1) = 3/(16+3)


def test_micro_batches_in_flight_per_stage():
    assert in_flight(4, 8) == [4, 3, 2, 1]  # 1F1B: stage i holds p - i
    assert in_flight(4, 2) == [2, 2, 2, 1]  # at most m
    # interleaved, in the rank's micro-batches: (2 (p-i-1) + (v-1) p + 1) / v; the first p + (p-1)/v = 5.5
    assert in_flight(4, 8, "interleaved", 2) == [5.5, 4.5, 3.5, 2.5]  # (6+4+1)/2, (4+4+1)/2, (2+4+1)/2, (0+4+1)/2
    assert in_flight(4, 1, "interleaved", 2) == [1.0, 1.0, 1.0, 1.0]  # at most m v = 2 chunk passes: 2/2


def test_rows_of_no_block_go_by_where_they_run():
    """The root module's rows (FSDP2's hooks, the embeddings' sum) run before, between and after the blocks:
    before the first block of a forward they are the first stage's, after the last the last stage's (the
    head, the loss), between two the block's before them; a backward runs the other way."""
    forward = ["wte", "", "blocks.0.attn", "", "blocks.1", "lm_head", ""]
    backward = ["", "lm_head", "blocks.1", "", "blocks.0.attn", "wte", ""]
    prefix, indices, position = blocks_of(
        forward + backward + ["x"], ["forward"] * 7 + ["backward"] * 7 + ["optimizer"]
    )
    assert (prefix, indices) == ("blocks", [0, 1])
    assert list(position) == [0, 0, 1, 1, 2, 3, 3] + [3, 3, 2, 2, 1, 0, 0] + [-1]


def test_partition_balances_the_slowest_stage():
    assert partition([1] * 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 6)]  # max(5, 5) = 5, not max(6, 4)


def test_the_toy_pipeline_s_stages_sends_and_bubble(toy):
    row = reports.plan(toy, "H100", pp=4, micro_batches=8).iloc[0]
    line = reports.plan(toy, "H100", pp=4, micro_batches=8).attrs["plan"][row["run"]]["pipeline"]
    ranks = line["stages"]
    assert [c["blocks"] for r in ranks for c in r["chunks"]] == ["0-1", "2-3", "4-5", "6-7"]
    assert [r["send_bytes"] for r in ranks] == [BOUNDARY, BOUNDARY, BOUNDARY, 0]
    # rank 0 sends activations forward, rank 3 gradients back, ranks 1 and 2 both
    assert [r["send_s"] for r in ranks] == pytest.approx([SEND, 2 * SEND, 2 * SEND, SEND], rel=1e-12)
    compute = [r["seconds_per_micro_batch"] - r["send_s"] for r in ranks]
    assert compute == pytest.approx([compute[0]] * 4, rel=1e-12)  # four equal stages of two layers
    times = [r["seconds_per_micro_batch"] for r in ranks]
    # step = m x slowest + (sum - slowest): 8 (c + 2s) + 3c + 4s ... with c the compute, s one send
    c, s = compute[0], SEND
    bubble = (4 * c + 6 * s) - (c + 2 * s)  # sum of T - max T = 3c + 4s
    assert row["pipeline_bubble_s"] == pytest.approx(bubble, rel=1e-9)
    assert row["step_time_s"] == pytest.approx(8 * max(times) + bubble + max(r["optimizer_s"] for r in ranks))
    assert row["p2p_s"] == pytest.approx(8 * 2 * SEND, rel=1e-12)  # the busiest rank: 2 sends per micro-batch
    # without the sends, the closed form: 3/11 of the step
    assert schedule(compute, 8)["bubble_fraction"] == pytest.approx(3 / 11, rel=1e-12)
    assert 0.26 < row["bubble_fraction"] < 3 / 11  # the sends lengthen the slowest rank more than the bubble


def test_a_send_between_stages_on_two_nodes_goes_at_one_nic(toy):
    """2 GPUs per node: stages 0 and 1 on node 0, 2 and 3 on node 1; the send from 1 to 2 crosses nodes."""
    frame = reports.plan(toy, "H100", pp=4, micro_batches=8, gpus_per_node=2)
    ranks = frame.attrs["plan"][frame["run"].iloc[0]]["pipeline"]["stages"]
    across = 8.4e-6 + 9.6e-6 + BOUNDARY / (0.8 * resolve_gpu("H100")["nic_bytes_per_s"])  # one step across
    # rank 1: its gradient back to rank 0 on its node, its activations on to rank 2 across; rank 2 the reverse
    assert [r["send_s"] for r in ranks] == pytest.approx([SEND, SEND + across, across + SEND, SEND], rel=1e-12)


def test_sends_hidden_behind_the_compute_leave_the_closed_form_bubble(toy):
    """pipeline_send_overlap=1: four equal stages of compute alone, 8 micro-batches: (4-1)/(8+4-1) = 3/11."""
    frame = reports.plan(toy, "H100", pp=4, micro_batches=8, assumptions={"pipeline_send_overlap": 1})
    row = frame.iloc[0]
    ranks = frame.attrs["plan"][row["run"]]["pipeline"]["stages"]
    t = ranks[0]["seconds_per_micro_batch"]
    assert [r["seconds_per_micro_batch"] for r in ranks] == pytest.approx([t] * 4, rel=1e-12)
    assert row["bubble_fraction"] == pytest.approx(3 / 11, rel=1e-12)  # 3t / (8t + 3t)
    assert row["pipeline_bubble_s"] == pytest.approx(3 * t, rel=1e-12)
    half = reports.plan(toy, "H100", pp=4, micro_batches=8, assumptions={"pipeline_send_overlap": 0.5})
    ranks_half = half.attrs["plan"][row["run"]]["pipeline"]["stages"]
    assert ranks_half[1]["seconds_per_micro_batch"] == pytest.approx(t + 0.5 * 2 * SEND, rel=1e-12)


def test_the_toy_pipeline_s_memory_of_micro_batches_in_flight(toy):
    frame = reports.plan(toy, "H100", pp=4, micro_batches=8)
    ranks = frame.attrs["plan"][frame["run"].iloc[0]]["pipeline"]["stages"]
    assert [r["in_flight"] for r in ranks] == [4, 3, 2, 1]
    # fixed: parameters and gradients at the peak, 2 x 8 x 8192^2 x 2 = 2 GiB, a quarter each
    assert [r["fixed_bytes"] for r in ranks] == [512 * MiB] * 4
    # saved per micro-batch: the rank's input (x, or the received output of the stage before) and its first
    # layer's output, 2 x 16 MiB; the last rank also the model's output, which the test holds: 3 x 16 MiB
    assert [r["saved_activation_bytes"] for r in ranks] == [32 * MiB, 32 * MiB, 32 * MiB, 48 * MiB]
    # peak of one micro-batch while the rank's ops run: the saved 32 MiB and one 16 MiB gradient in the
    # backward; on the last rank its 48 MiB, the given gradient and layer 7's input gradient: 80 MiB
    assert [r["activation_peak_bytes"] for r in ranks] == [48 * MiB, 48 * MiB, 48 * MiB, 80 * MiB]
    # fixed + peak + (in flight - 1) x saved: 512 + 48 + 3 x 32 = 656 MiB on the first rank, then
    # 512 + 48 + 2 x 32 = 624, 512 + 48 + 32 = 592, 512 + 80 + 0 = 592
    assert [r["peak_bytes"] for r in ranks] == [656 * MiB, 624 * MiB, 592 * MiB, 592 * MiB]
    row = frame.iloc[0]
    assert row["peak_bytes_per_rank"] == 656 * MiB  # 687,865,856
    # required: 1.1 x 656 MiB + 1 GiB context + 256 MiB NCCL (the pipeline's group) = 2,098,829,721.6
    assert row["required_bytes"] == pytest.approx(1.1 * 656 * MiB + 2**30 + 256 * MiB)
    assert row["fits"]


def test_interleaved_toy_pipeline(toy):
    frame = reports.plan(toy, "H100", pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    ranks = frame.attrs["plan"][frame["run"].iloc[0]]["pipeline"]["stages"]
    assert [[c["blocks"] for c in r["chunks"]] for r in ranks] == [["0-1", "4-5"], ["2-3", "6-7"]]
    assert [r["in_flight"] for r in ranks] == [2.5, 1.5]  # p + (p-1)/v = 2.5; (0 + 2 + 1) / 2
    times = [r["seconds_per_micro_batch"] for r in ranks]
    row = frame.iloc[0]
    assert row["pipeline_bubble_s"] == pytest.approx((sum(times) - max(times)) / 2, rel=1e-12)
    # chunks 0 and 2 on rank 0, 1 and 3 on rank 1, every boundary between the ranks: rank 0 sends chunk 0's
    # and chunk 2's activations and chunk 2's gradient back to chunk 1; rank 1 chunk 1's activations and
    # gradient and chunk 3's gradient: 3 sends each per micro-batch
    assert [r["send_s"] for r in ranks] == pytest.approx([3 * SEND, 3 * SEND], rel=1e-12)
    assert row["p2p_s"] == pytest.approx(4 * 3 * SEND, rel=1e-12)  # 4 micro-batches x 3 sends


def test_too_many_stages_and_bad_shapes_are_refused(toy):
    with pytest.raises(ReportError, match=r"16 pipeline stages \(8 x 2 virtual\) need at least 16 repeated blocks"):
        reports.plan(toy, "H100", pp=8, micro_batches=8, schedule="interleaved", virtual_stages=2)
    with pytest.raises(ReportError, match="schedule must be one of 1f1b, interleaved, got 'gpipe'"):
        reports.plan(toy, "H100", pp=2, schedule="gpipe")
    with pytest.raises(ReportError, match="virtual_stages 2 needs schedule 'interleaved'"):
        reports.plan(toy, "H100", pp=2, virtual_stages=2)
    with pytest.raises(ReportError, match="micro_batches 4 needs pp > 1"):
        reports.plan(toy, "H100", micro_batches=4)
    with pytest.raises(ReportError, match="pp must be an int >= 1, got 0"):
        reports.plan(toy, "H100", pp=0)


def test_cli_prints_the_bubble_and_each_rank_s_memory(toy_trace, capsys):
    trace = toy_trace
    assert main(["plan", trace, "--gpu", "H100", "--pp", "4", "--micro-batches", "8"]) in (0, None)
    text = capsys.readouterr().out
    assert "8 micro-batches x " in text and "Pipeline          4 ranks over 8 blocks (N), 1f1b" in text
    assert "rank 0   blocks 0-1" in text and "in flight: 4 micro-batches" in text
    main(["plan", trace, "--gpu", "H100", "--pp", "4", "--micro-batches", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["pp"] == 4 and out["micro_batches"] == 8 and out["schedule"] == "1f1b"
    assert out["pipeline"]["stages"][0]["peak_bytes"] == 656 * MiB  # integers in the JSON
