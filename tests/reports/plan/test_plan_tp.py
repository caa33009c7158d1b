"""Tensor parallelism in a plan: FSDP2 + TP jobs traced by examples/simulate.py (`tp=`: a 2-D mesh of
data- by tensor-parallel ranks, Megatron-LM's column- and row-parallel linears in each block, under
FakeTensorMode with a fake process group).

The memory case: rank 0 of a 4-rank job, TP 2 (so 2 data-parallel ranks), examples/gpt.py at d 64, 4 heads,
2 blocks, sequences of 32, vocabulary 256, batch 2, bf16 compute, fp32 parameters and reduction, two AdamW
steps. Its parameters per rank (fp32 shards of 1 / 2 of the data-parallel rows of the TP-local weights):
  root unit   wte [256, 64] -> 128 x 64 = 8,192; wpe [32, 64] -> 1,024; ln_f 64 -> 32; lm_head 8,192: 17,440
  each block  ln1, ln2 64 -> 32 each; qkv [192, 64] -> TP [96, 64] -> 48 x 64 = 3,072; attn proj [64, 64] ->
              TP [64, 32] -> 1,024; fc [256, 64] -> TP [128, 64] -> 4,096; mlp proj [64, 256] -> TP [64, 128]
              -> 4,096: 12,352
  17,440 + 2 x 12,352 = 42,144 elements x 4 bytes = P = 168,576 bytes
FSDP2's unsharded parameters (bf16, TP-local): root 16,384 + 2,048 + 64 + 16,384 = 34,880 elements = 69,760
bytes; a block 64 + 6,144 + 2,048 + 64 + 8,192 + 8,192 = 24,704 elements = 49,408 bytes.
"""

import sys

import numpy as np
import pytest

import reports
from tests import helpers

P = 42_144 * 4  # 168,576 bytes: the rank's fp32 parameter shards (module docstring)
ROOT_UNSHARDED = 34_880 * 2  # 69,760
BLOCK_UNSHARDED = 24_704 * 2  # 49,408


def _trace(path, world, tp, seq, batch, steps, d=64, heads=4, vocab=256, layers=2, sp=False, checkpoint=False):
    """simulate's trace of examples/gpt.py; `sp`: with sequence parallelism and vocabulary-parallel ends (this
    module's closed forms are of the layout without: `sp` False)."""
    sys.path.insert(0, str(helpers.EXAMPLES))
    from gpt import GPTConfig
    from simulate import simulate

    fields = dict(vocab_size=vocab, seq_len=seq, n_layer=layers, n_head=heads, d_model=d)
    cfg = GPTConfig(**fields, bias=False, attention="sdpa")
    return reports.load(simulate(str(path), world, cfg, batch, checkpoint, steps=steps, tp=tp, sequence_parallel=sp))


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    return _trace(tmp_path_factory.mktemp("tp") / "tp2", world=4, tp=2, seq=32, batch=2, steps=2)


def test_tokens_per_gpu_divide_by_the_tp_degree(tmp_path):
    df = _trace(tmp_path / "tp8", world=16, tp=8, seq=512, batch=8, steps=1, heads=8)
    row = reports.plan(df, "H100").iloc[0]
    assert (row["world_size"], row["tp"], row["tokens_per_step"]) == (16, 8, 4096)  # 8 sequences x 512
    # the 8 ranks of a TP group read the same 4,096 tokens: 4,096 / 8 = 512 per GPU per step (not 4,096)
    assert row["tokens_per_s_per_gpu"] * row["step_time_s"] == pytest.approx(512, rel=1e-12)
    notes = reports.plan(df, "H100").attrs["plan"][row["run"]]["notes"]
    assert any(n.startswith("tensor parallelism of degree 8 (process group ") for n in notes)


def test_a_pipeline_of_tp_groups_divides_tokens_by_pp_and_tp(tp2):
    row = reports.plan(tp2, "H100", pp=2, micro_batches=4).iloc[0]
    # tp2's 2 sequences x 32 tokens per micro-batch, 4 micro-batches: 256 tokens per step through 2 stages of
    # a TP group of 2: 256 / (2 x 2) = 64 per GPU per step
    assert (row["tp"], row["pp"], row["tokens_per_step"]) == (2, 2, 256)
    assert row["tokens_per_s_per_gpu"] * row["step_time_s"] == pytest.approx(64, rel=1e-12)


def test_without_tensor_parallelism_tokens_per_gpu_are_the_ranks(tmp_path):
    df = _trace(tmp_path / "tp1", world=4, tp=1, seq=32, batch=2, steps=1)
    row = reports.plan(df, "H100").iloc[0]
    assert row["tp"] == 1 and row["tokens_per_s_per_gpu"] * row["step_time_s"] == pytest.approx(64, rel=1e-12)


def test_fsdp2_tp_unsharded_parameters_are_freed_each_step(tp2):
    """Live memory at the end of each step (AdamW's last op) is the closed form, step after step: P of
    parameters, P of fp32 gradient shards, 2P + 16 x 4 bytes of optimizer state (exp_avg, exp_avg_sq and a
    float32 step per parameter), P of AdamW's foreach temporaries and the 2 x 32 int64 token ids (512):
    5P + 64 + 512 = 843,456 bytes. Before, FSDP2's TP-local unsharded weights (DTensors) were never seen
    freed: 2 blocks x 49,152 bytes of qkv, proj, fc and proj stayed live as activations (941,760)."""
    t = reports.timeline(tp2)
    ends = t.groupby("step").tail(1).set_index("step")
    assert ends["live_bytes"].tolist() == [5 * P + 64 + 512] * 2 == [843_456] * 2
    assert ends["unsharded_parameters_bytes"].tolist() == [0, 0] and ends["activations_bytes"].tolist() == [0, 0]
    unsharded = next(iter(tp2.attrs["runs"].values()))["unsharded_parameters"]
    assert unsharded["blocks.0.attn.qkv.weight"]["shape"] == [96, 64]  # TP-local: 192 / 2 rows, bf16
    assert sum(p["numel"] for p in unsharded.values()) * 2 == ROOT_UNSHARDED + 2 * BLOCK_UNSHARDED  # 168,576


def test_fsdp2_tp_peak_is_the_closed_form(tp2):
    """The peak (step 2's backward, in the last block) holds P of parameters, 2P + 64 of optimizer state and
    the unsharded parameters of the root unit and of one block (69,760 + 49,408 = 119,168 bytes); the rest
    (gradients, communication buffers, activations, inputs, temporaries) are the trace's own figures at that op.
    Before, the peak held both blocks' TP-local weights besides (1,015,236 bytes, at another op)."""
    peak = reports.peak(tp2).iloc[0]
    t = reports.timeline(tp2)
    at = t[t["seq"] == peak["seq"]].iloc[0]
    assert (peak["step"], peak["phase"], peak["module"]) == (1, "backward", "blocks.1")
    assert at["unsharded_parameters_bytes"] == ROOT_UNSHARDED + BLOCK_UNSHARDED == 119_168
    rest = ("gradients", "communication_buffers", "activations", "inputs", "temporaries")
    closed = P + (2 * P + 64) + ROOT_UNSHARDED + BLOCK_UNSHARDED + sum(at[f"{c}_bytes"] for c in rest)
    assert at["parameters_bytes"] == P and at["optimizer_state_bytes"] == 2 * P + 64
    assert peak["peak_live_bytes"] == closed == 963_780
    plan = reports.plan(tp2, "H100").iloc[0]
    assert plan["peak_bytes_per_rank"] == 963_780 and plan["tp"] == 2
    assert np.isfinite(plan["tokens_per_s_per_gpu"])


def test_a_pipeline_s_tokens_per_gpu_divide_by_the_tp_degree_too(tp2):
    """pp 2 over the TP 2 trace, 4 micro-batches: one model replica is pp x tp = 4 GPUs, which read the 4 x 64 =
    256 tokens of a step once; 256 / 4 = 64 tokens per GPU per step (it printed 128: 256 / pp, the TP degree
    left out where the pipeline reworked tokens/s)."""
    row = reports.plan(tp2, "H100", pp=2, micro_batches=4).iloc[0]
    assert (row["tp"], row["tokens_per_step"]) == (2, 256)  # 4 micro-batches x 2 sequences x 32 tokens
    assert row["tokens_per_s_per_gpu"] * row["step_time_s"] == pytest.approx(64, rel=1e-12)  # 256 / (2 x 2)


def _forward_end_activations(df):
    """Activation bytes live at the last op of step 0's forward (reports.timeline)."""
    t = reports.timeline(df)
    return int(t[(t["step"] == 0) & (t["phase"] == "forward")]["activations_bytes"].iloc[-1])


def test_sequence_parallelism_keeps_a_tp_share_of_each_checkpointed_block_input(tmp_path):
    # every block checkpointed: a block keeps its input alone, [batch 2, seq 32, d 64] bf16 = 2 x 32 x 64 x 2 =
    # 8,192 bytes without sequence parallelism; with it each of the TP 2 ranks keeps its half of the sequence:
    # 8,192 / 2 = 4,096. One block more (3 against 2) adds exactly that at the forward's end.
    two, three = (
        _forward_end_activations(
            _trace(tmp_path / f"sp{n}", world=4, tp=2, seq=32, batch=2, steps=1, layers=n, sp=True, checkpoint=True)
        )
        for n in (2, 3)
    )
    assert three - two == 2 * 32 * 64 * 2 // 2 == 4_096
