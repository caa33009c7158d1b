"""Memory categories of one rank of a simulated FSDP2 job (torch's fake process group and
FakeTensorMode) at world sizes 8, 64 and 256: closed forms per rank, categories adding up
to live_bytes at every row, and a trace entered after a warm-up step.

The model: examples/gpt.py's GPT, Llama-shaped (no biases, fused attention), d = 256, 2 layers,
vocab V = 512, S = 256; one FSDP2 unit per block and the root unit (embeddings, final norm,
output head); bf16 parameters for compute, fp32 gradient reduction, AdamW (fp32 state).
  block: qkv 3d² + proj d² + fc 4d² + proj 4d² + 2 norms 2d = 12·65,536 + 512 = 786,944
  root:  wte V·d + wpe S·d + ln_f d + lm_head V·d = 131,072 + 65,536 + 256 + 131,072 = 327,936
  N = 2·786,944 + 327,936 = 1,901,824 in 16 tensors (6 per block, 4 in the root)
Every dim 0 is a multiple of 256, so each rank holds exactly N/W of every parameter."""

import sys

import pytest
import torch
import torch.distributed as dist

import reports
from reports.memory.memory import CATEGORIES, by_category, timeline
from tests import helpers
from tracer import Tracer, read_metadata

sys.path.insert(0, str(helpers.EXAMPLES))
from gpt import GPT, GPTConfig  # noqa: E402

CFG = GPTConfig(vocab_size=512, seq_len=256, n_layer=2, n_head=4, d_model=256, bias=False, attention="sdpa")
BLOCK = 12 * 256 * 256 + 2 * 256  # 786,944
ROOT = 2 * 512 * 256 + 256 * 256 + 256  # 327,936
N = 2 * BLOCK + ROOT  # 1,901,824
TENSORS = 16


def simulate(path, world, warmup=0, checkpoint=False):
    """Trace one AdamW step of rank 0 of a `world`-rank FSDP2 job, after `warmup` untraced steps."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils.checkpoint import checkpoint as ckpt

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))  # outside FakeTensorMode: the mesh reads real rank lists
        with FakeTensorMode():
            model = GPT(CFG)
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model.blocks:
                if checkpoint:
                    block.forward = (lambda f: lambda x: ckpt(f, x, use_reentrant=False))(block.forward)
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
            idx = torch.zeros(1, CFG.seq_len, dtype=torch.long)
            for _ in range(warmup + 1):
                if _ == warmup:
                    tracer = Tracer(path, model=model, tokens=CFG.seq_len).__enter__()
                model(idx, idx).backward()
                opt.step()
                opt.zero_grad()
            tracer.__exit__(None, None, None)
    finally:
        dist.destroy_process_group()
    return reports.load(path)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    return {world: simulate(root / f"w{world}", world) for world in (8, 64, 256)}


def _adds_up(df):
    line = timeline(df)
    parts = line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1).to_numpy()
    assert len(line) == len(df) and (parts == line["live_bytes"].to_numpy()).all()
    return line


@pytest.mark.parametrize("world", [8, 64, 256])
def test_per_rank_bytes_are_the_totals_over_the_world_size(jobs, world):
    df = jobs[world]
    most = by_category(df, "max").set_index("category")["bytes"]
    # fp32 shards, W = 8: 4 * 1,901,824 / 8 = 950,912; W = 64: 118,864; W = 256: 29,716
    assert most["parameters"] == 4 * N // world
    assert most["gradients"] == 4 * N // world  # reduce-scattered in fp32
    # AdamW: exp_avg and exp_avg_sq of the shard + a 4-byte step per tensor: W = 8: 1,901,888; W = 256: 59,496
    assert most["optimizer_state"] == 8 * N // world + 4 * TENSORS
    assert abs(most["optimizer_state"] / (8 * N / world) - 1) < 0.01
    # bf16 unsharded parameters: FSDP2 keeps the root unit unsharded through the step and
    # gathers one block at a time: 2 * (327,936 + 786,944) = 2,229,760 bytes at any world size
    assert most["unsharded_parameters"] == 2 * (ROOT + BLOCK) == 2_229_760
    line = _adds_up(df)
    # before the first all-gather nothing is unsharded; after the step everything is resharded
    assert line["unsharded_parameters_bytes"].iloc[0] == 0 and line["unsharded_parameters_bytes"].iloc[-1] == 0
    # the 16 unsharded storages are made one by one in the first step, so partial units show in between
    assert len(next(iter(df.attrs["runs"].values()))["unsharded_parameters"]) == TENSORS


def test_gradient_reduction_buffers_are_communication_buffers(jobs):
    most = by_category(jobs[8], "max").set_index("category")["bytes"]
    # a block's fp32 reduce-scatter input (4 * 786,944) beside the next block's bf16 all-gather output (2 * 786,944)
    assert most["communication_buffers"] == 6 * BLOCK == 4_721_664


def test_a_trace_entered_after_a_warm_up_step_counts_the_optimizer_state_from_row_0(tmp_path):
    df = simulate(tmp_path / "warm", 8, warmup=1)
    line = _adds_up(df)
    first = line.iloc[0]
    assert first["optimizer_state_bytes"] == 8 * N // 8 + 4 * TENSORS == 1_901_888
    assert first["parameters_bytes"] == 4 * N // 8 == 950_912
    assert first["unsharded_parameters_bytes"] == 0  # resharded after the warm-up's backward
    assert (line["optimizer_state_bytes"] == 1_901_888).all()  # AdamW updates its state in place
    meta = read_metadata(tmp_path / "warm" / "rank=0")
    assert len(meta["storage_roles"]["optimizer_state"]) == 3 * TENSORS  # exp_avg, exp_avg_sq, step
    # the unsharded parameters FSDP2 made in the warm-up were found at entry, at 0 bytes
    entry = dict(map(tuple, meta["storage_roles"]["at_entry"]))
    unsharded = [p["storage_id"] for p in meta["unsharded_parameters"].values()]
    assert len(unsharded) == TENSORS and all(entry[sid] == 0 for sid in unsharded)


def test_checkpointed_job_adds_up(tmp_path):
    df = simulate(tmp_path / "ckpt", 64, checkpoint=True)
    line = _adds_up(df)
    assert line["unsharded_parameters_bytes"].max() == 2 * (ROOT + BLOCK)
    assert bool(df["recompute"].any())
