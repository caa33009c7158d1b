"""The planning path (reports.plan on meta, fake and simulated FSDP2 traces): figures
checked against closed forms, defects pinned by their exact bytes.

The job: tests/tracer/distributed/test_job.py's simulate, rank 0 of a W = 8 FSDP2 job of 4 bias-free fp32
Linear(64, 64) units, x [8, 64], AdamW (foreach), one step per loop iteration. Per rank: each
weight's shard is 64 / 8 = 8 rows, 512 values, 2,048 bytes."""

import pytest

import reports
from tests.tracer.distributed.test_job import simulate

SHARD = 64 * 64 // 8  # 512 values of each weight on rank 0
# AdamW keeps exp_avg and exp_avg_sq (fp32) of the shard and a 0-d fp32 step per tensor:
STATE = 4 * (2 * SHARD * 4 + 4)  # 4 x (2 x 512 x 4 + 4) = 16,400


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("review")
    return {steps: reports.load(simulate(root / f"s{steps}", 8, steps=steps)) for steps in (1, 2)}


def test_a_first_step_trace_plans_the_optimizer_state_a_steady_step_holds(jobs):
    """AdamW makes its state in the first opt.step(), after that step's backward: a trace of one
    step from a fresh optimizer peaks without it, while every later step runs its forward and
    backward with the state live (it stays from step to step). The plan is for the job's steps."""
    one, two = jobs[1], jobs[2]
    # the traced peak of step 0, in the backward: parameters 4 x 2,048 = 8,192, one unit's unsharded
    # weight 16,384, one reduced gradient shard 2,048, no optimizer state, two 16,384-byte communication
    # buffers 32,768, activations 2 x 2,048 + 2 x 4 = 4,104, input x 2,048, temporaries (a unit's
    # unsharded gradient 16,384 + 2 x 2,048) 20,480: 86,024
    assert reports.peak(one)["peak_live_bytes"].iloc[0] == 86_024
    # step 1 of the two-step trace: the same op with the state live, 86,024 + 16,400 = 102,424
    assert reports.peak(two)["peak_live_bytes"].iloc[0] == 86_024 + STATE == 102_424
    for df in (one, two):
        row = reports.plan(df, "H100").iloc[0]
        assert row["peak_bytes_per_rank"] == 102_424
        # required: 1.1 x 102,424 + 2^30 (CUDA context) + 2^28 (NCCL, one process group) = 1,342,290,230.4
        assert row["required_bytes"] == pytest.approx(1.1 * 102_424 + 2**30 + 2**28, rel=1e-12)
    notes = reports.plan(one, "H100").attrs["plan"][one["run"].iloc[0]]["notes"]
    assert any("optimizer state made during the trace (16,400 bytes at the peak)" in n for n in notes)


@pytest.mark.parametrize("world", [3, 48])  # 64 rows do not divide by 3 or 48: shards of 22 and 2 rows
def test_the_traced_batch_of_an_fsdp2_job_is_its_input_not_the_all_gather_buffer(tmp_path, world):
    """Without a mixed-precision cast, the first 2-d tensor a forward op reads that is not a parameter
    was FSDP2's all-gather output viewed as [W, rows x 64] (split_with_sizes_copy): the plan took W
    for the batch, so max_micro_batch and any planned micro-batch were off by 8 / W (at W = 8, by luck,
    none). The batch is x's leading size, 8 sequences (the Linear's rows)."""
    df = reports.load(simulate(tmp_path / "job", world, steps=1))
    row = reports.plan(df, "H100").iloc[0]
    assert row["batch"] == 8 and row["tokens_per_step"] == 8
    # twice the traced batch: 16 sequences, 2 x 8 = 16 tokens per step
    assert reports.plan(df, "H100", micro_batch=16).iloc[0]["tokens_per_step"] == 16
