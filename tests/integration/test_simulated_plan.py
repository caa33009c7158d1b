"""`optrace plan` on rank 0 of a simulated 256-GPU FSDP2 job (examples/simulate.py: torch's fake process group, fake
tensors), against closed forms: the collectives' sizes with FSDP2's padding, their cost on 32 nodes of 8 H100s by
NCCL's ring, and the model FLOPs the MFU divides.

The GPT: d = 64, 4 heads, 2 layers, sequence S = 128, vocabulary 1,024, no biases, one sequence per rank (T = 128);
each block and the root one FSDP2 unit, bf16 parameters for the compute, fp32 gradient reduction. FSDP2 pads each
parameter's rows to a multiple of the 256 ranks: a block's qkv 192·64, attention projection 64·64, fc 256·64 take
256·64 = 16,384 each, its MLP projection 64·256 takes 256·256 = 65,536, its two norms 256 each: 115,200 elements;
the root's embedding 1,024·64 = 65,536, positions 128·64 -> 256·64 = 16,384, final norm 256, head 65,536: 147,712."""

import sys

import pytest

import reports
from reports.plan.devices import resolve_gpu
from tests import helpers

BLOCK, ROOT, WORLD = 115_200, 147_712, 256


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    sys.path.insert(0, str(helpers.EXAMPLES))
    from gpt import GPTConfig
    from simulate import simulate

    cfg = GPTConfig(vocab_size=1024, seq_len=128, n_layer=2, n_head=4, d_model=64, bias=False, attention="sdpa")
    return reports.load(simulate(str(tmp_path_factory.mktemp("w256") / "w256"), WORLD, cfg, 1, steps=1))


def test_the_collectives_are_the_padded_shards(job):
    rows = job[job["flop_kind"] == "collective"]
    gathers = rows[rows["op"].astype(str) == "c10d._allgather_base_.default"]
    scatters = rows[rows["op"].astype(str) == "c10d._reduce_scatter_base_.default"]
    # all-gathers of bf16 parameters: the root and both blocks forward, both blocks again backward
    assert gathers["comm_bytes"].tolist() == [2 * ROOT] + [2 * BLOCK] * 4  # 295,424 and 230,400
    # reduce-scatters of fp32 gradients: the blocks, then the root
    assert scatters["comm_bytes"].tolist() == [4 * BLOCK] * 2 + [4 * ROOT]  # 460,800 and 590,848
    assert set(rows["group_size"]) == {WORLD}


def test_the_plan_prices_the_ring_over_32_nodes_and_the_model_flops(job):
    frame = reports.plan(job, "H100")
    row = frame.iloc[0]
    # one ring of 256 ranks on 32 nodes of 8: 255 steps, 31 of them across nodes; a step's latency NCCL's ring
    # Simple figures (8.4 us base, 3.4 us NVLink, 9.6 us network): 8.4 + 224·3.4 + 31·9.6 = 1,067.6 us a collective.
    # Bandwidth: min(NVLink 450 GB/s, 8 NICs x 50 GB/s) x 0.8 = 320 GB/s; a rank sends 255/256 of each message
    latency = 8.4e-6 + 224 * 3.4e-6 + 31 * 9.6e-6
    bandwidth = 0.8 * min(resolve_gpu("H100")["intra_bytes_per_s"], 8 * resolve_gpu("H100")["nic_bytes_per_s"])
    sent = (2 * ROOT + 4 * 2 * BLOCK + 2 * 4 * BLOCK + 4 * ROOT) * 255 / 256  # 2,728,472 bytes of messages
    assert row["comm_s"] == pytest.approx(8 * latency + sent / bandwidth, rel=1e-9)  # 8.549 ms
    # model FLOPs: weight matmuls 6·N·T = 6·163,840·128 = 125,829,120 (N = 2·12·64² + the head 65,536), attention
    # forward 4·T·L·S·d = 4·128·2·128·64 = 8,388,608 and twice that backward (the flash backward's 2.5x less its
    # score recompute 0.5x), other ops 2,146,560; the causal mask's half of the attention, 12,582,912, apart
    assert row["model_flops_per_step"] == 125_829_120 + 3 * 8_388_608 + 2_146_560 - 12_582_912 == 140_558_592
    assert row["causal_masked_flops_per_step"] == 12_582_912 and row["tokens_per_step"] == 128
    assert (row["world_size"], row["gpus_per_node"], row["micro_batch"]) == (WORLD, 8, 1)
    # AdamW on this rank's shards only: (2·115,200 + 147,712) / 256 = 1,477 elements
    b = reports.breakdown(job).set_index("phase")
    assert b.loc["optimizer", "flops"] == 8 * (2 * BLOCK + ROOT) // WORLD + 16  # 8 a element + 16 tensors' steps
