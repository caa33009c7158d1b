"""reports.plan.context and `optrace plan --cp`: ring attention's bytes, time and memory per rank.

The model: examples/gpt.py's GPT, 4 layers, d_model 64, 4 heads (head_dim 16), seq 64, fused attention
(sdpa), bf16 on the meta device (the flash kernel stands in), 2 sequences of 64 tokens, one forward and
backward, planned on an H100 SXM. A K/V block at cp c: 2 (K and V) x 2 sequences x 64/c tokens x 4 heads
x 16 x 2 bytes; at c = 2: 2 x 2 x 32 x 4 x 16 x 2 = 16,384 bytes.
"""

import sys

import numpy as np
import pytest
import torch

import reports
from reports.errors import ReportError
from reports.output.cli import main
from reports.plan.context import kv_block_bytes, ring
from reports.plan.devices import resolve_gpu
from tests import helpers
from tracer import Tracer

MiB = 2**20
BLOCK2 = 2 * 2 * 32 * 4 * 16 * 2  # 16,384: the K/V block at cp 2
LINK = 0.8 * 450e9  # link_efficiency x the H100 SXM's NVLink, one way: 360 GB/s
HOP = 8.4e-6 + 3.4e-6  # nccl_base_s + one NVLink step


@pytest.fixture(scope="module")
def gpt_trace(tmp_path_factory):
    sys.path.insert(0, str(helpers.ROOT / "examples"))
    try:
        from gpt import GPT, GPTConfig
    finally:
        sys.path.pop(0)
    cfg = GPTConfig(vocab_size=256, seq_len=64, n_layer=4, n_head=4, d_model=64, bias=False, attention="sdpa")
    path = tmp_path_factory.mktemp("context") / "gpt"
    with torch.device("meta"):
        model = GPT(cfg).to(torch.bfloat16)
        idx = torch.zeros(2, 64, dtype=torch.long)
    with Tracer(path, model=model, tokens=128):
        model(idx, idx).backward()
    return str(path)


@pytest.fixture(scope="module")
def gpt(gpt_trace):
    return reports.load(gpt_trace)


def test_kv_block_bytes_closed_form():
    assert kv_block_bytes(2, 64, 2, 4, 16, 2) == BLOCK2  # 2 x 2 x 64/2 x 4 x 16 x 2
    assert kv_block_bytes(1, 8192, 8, 8, 128, 2) == 2 * 1024 * 8 * 128 * 2  # 4,194,304: Llama-3-8B's GQA at cp 8


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_bytes_and_time_per_step(gpt, cp):
    frame = reports.plan(gpt, "H100", cp=cp)
    context = frame.attrs["plan"][frame["run"].iloc[0]]["context"]
    block = 2 * 2 * (64 // cp) * 4 * 16 * 2  # 16,384 at cp 2, 8,192 at cp 4
    assert context["kv_block_bytes"] == block
    assert (context["seq"], context["heads_kv"], context["head_dim"], context["attention_kernels"]) == (64, 4, 16, 8)
    # per layer forward: 2 x (c-1) x (seq/c) x heads_kv x head_dim x 2 bytes x 2 sequences = (c-1) x block;
    # backward twice that (dK/dV too); 4 layers: 4 x (c-1) x 3 x block (196,608 at cp 2; 294,912 at cp 4)
    assert context["ring_bytes"] == 4 * (cp - 1) * block + 4 * (cp - 1) * 2 * block
    forward, backward = HOP + block / LINK, HOP + 2 * block / LINK
    assert context["ring_s"] == pytest.approx(4 * (cp - 1) * (forward + backward), rel=1e-12)
    row = frame.iloc[0]
    assert row["ring_s"] == context["ring_s"] and row["cp"] == cp
    assert row["tokens_per_step"] == 128 / cp  # a rank's share of the 2 x 64 tokens


def test_ring_memory_is_the_activations_over_cp_plus_the_blocks_in_flight(gpt):
    ringed = reports.plan(gpt, "H100", cp=2).iloc[0]
    half = reports.plan(gpt, "H100", micro_batch=1).iloc[0]  # 1 of the 2 traced sequences: the growing bytes / 2
    # the K/V block and, in the backward, its dK/dV: 2 x 16,384 = 32,768 bytes
    assert ringed["kv_in_flight_bytes"] == 2 * BLOCK2
    assert ringed["peak_bytes_per_rank"] == half["peak_bytes_per_rank"] + 2 * BLOCK2
    # required: 1.1 x the blocks more, and NCCL's buffers for the context-parallel group (256 MiB)
    assert ringed["required_bytes"] == pytest.approx(half["required_bytes"] + 1.1 * 2 * BLOCK2 + 256 * MiB)


def test_the_ring_overlaps_the_attention_of_the_block_before(gpt):
    """Exposed per kernel: (c - 1) x max(0, send - kernel / c)."""
    rows = gpt.sort_values("seq").reset_index(drop=True)
    gpu, a = resolve_gpu("H100"), {"link_efficiency": 0.8, "nccl_base_s": 8.4e-6, "nvlink_step_s": 3.4e-6}
    a |= {"pcie_step_s": 5.7e-6, "net_step_s": 9.6e-6}
    slow = np.full(len(rows), 1.0)  # every kernel 1 s: each send (12 us) hides behind its 0.5 s block
    exposed, figures = ring(rows, {}, slow, 2, 1.0, gpu, 8, a)
    assert exposed.sum() == 0 and figures["ring_exposed_s"] == 0
    exposed, figures = ring(rows, {"dtype_bytes": {"bfloat16": 2}}, np.zeros(len(rows)), 2, 1.0, gpu, 8, a)
    assert figures["ring_exposed_s"] == pytest.approx(figures["ring_s"], rel=1e-12)  # nothing to hide behind


def test_a_ring_crossing_nodes_goes_at_one_nic(gpt):
    within = reports.plan(gpt, "H100", cp=4, gpus_per_node=8).attrs["plan"]
    across = reports.plan(gpt, "H100", cp=4, gpus_per_node=2).attrs["plan"]
    block = 2 * 2 * 16 * 4 * 16 * 2  # 8,192
    nic = 0.8 * resolve_gpu("H100")["nic_bytes_per_s"]
    (w,), (x,) = within.values(), across.values()
    assert w["context"]["ring_s"] == pytest.approx(4 * 3 * (2 * HOP + 3 * block / LINK), rel=1e-12)
    step = 8.4e-6 + 9.6e-6  # nccl_base_s + one step across nodes
    assert x["context"]["ring_s"] == pytest.approx(4 * 3 * (2 * step + 3 * block / nic), rel=1e-12)


def test_bad_cp_is_refused(gpt, tmp_path):
    with pytest.raises(ReportError, match="cp 3 must divide the sequence length, 64 tokens"):
        reports.plan(gpt, "H100", cp=3)
    with pytest.raises(ReportError, match="cp must be an int >= 1, got 0"):
        reports.plan(gpt, "H100", cp=0)
    with torch.device("meta"):
        model = torch.nn.Linear(8, 8)
        x = torch.empty(4, 8)
    with Tracer(tmp_path / "linear", model=model, tokens=4):
        model(x).sum().backward()
    with pytest.raises(ReportError, match="cp needs the trace's attention kernels"):
        reports.plan(reports.load(tmp_path / "linear"), "H100", cp=2)


def test_with_a_pipeline_the_ring_counts_once_in_the_stages(gpt):
    """The stages' time per micro-batch, sends aside, adds up to the step of the rank holding every layer:
    compute + the ring's exposed time (no other collective, no optimizer in this trace)."""
    whole = reports.plan(gpt, "H100", cp=2).iloc[0]
    frame = reports.plan(gpt, "H100", cp=2, pp=2, micro_batches=4)
    ranks = frame.attrs["plan"][frame["run"].iloc[0]]["pipeline"]["stages"]
    assert whole["exposed_comm_s"] > 0
    assert sum(r["seconds_per_micro_batch"] - r["send_s"] for r in ranks) == pytest.approx(
        whole["compute_s"] + whole["exposed_comm_s"], rel=1e-12
    )
    assert frame["kv_in_flight_bytes"].iloc[0] == 2 * BLOCK2  # and the blocks in flight in each rank's memory


def test_cli_prints_the_ring(gpt_trace, capsys):
    assert main(["plan", gpt_trace, "--gpu", "H100", "--cp", "2"]) in (0, None)
    text = capsys.readouterr().out
    # 196,608 bytes per step (4 layers x 3 x 16,384), shown with an SI prefix; 2 x 16,384 bytes in flight
    assert "Context parallel  2 ranks of 32 tokens: ring attention 197 kB per step" in text
    assert "K/V blocks in flight 0.0000305 GiB" in text  # 32,768 / 2^30
    assert main(["plan", gpt_trace, "--gpu", "H100", "--cp", "3"]) == 2  # one line: cp must divide the sequence
    assert "cp 3 must divide the sequence length, 64 tokens" in capsys.readouterr().err
