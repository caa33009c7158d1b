"""Sharded training loops on 2 gloo ranks, traced end to end: ZeroRedundancyOptimizer over DDP and tensor
parallelism with DTensor. The program computes what it computes untraced, k identical steps give k times one step's
figures, and the per-rank FLOPs and the collectives' bytes are the closed forms.

ZeRO: Linear(8, 16) -> GELU -> Linear(16, 4), no biases, fp32: N = 128 + 64 = 192; DDP all-reduces the 768 gradient
bytes; ZeroRedundancyOptimizer(AdamW) gives each rank a shard (the largest tensor first: rank 0 the 128 weights of
the first layer, rank 1 the 64 of the second) and broadcasts each shard from its owner after the step. T = 4 rows.

Tensor parallelism: Linear(8, 16) ColwiseParallel then Linear(16, 8) RowwiseParallel, no biases, on a 2-rank CPU
mesh: each rank holds 8·8 + 8·8 = 128 of the N = 256 weights; T = 4 rows, the same on both ranks."""

import contextlib
import io
import json
import os

import pytest
import torch

import reports
from reports.output.cli import main
from tests.helpers import traced_loop
from tests.tracer.distributed.test_distributed import spawn

T, WORLD = 4, 2


def _zero_model():
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.GELU(), torch.nn.Linear(16, 4, bias=False))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=0.1)


def _batch(rank, i):
    torch.manual_seed(100 + 10 * rank + i)
    return torch.randn(T, 8), torch.randint(0, 4, (T,))


def _zero_steps(ddp, opt, rank, steps, same):
    losses = []
    for s in range(steps):
        x, y = _batch(rank, 0 if same else s)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _zero(root, rank, results):
    # traced after 2 untraced steps (buckets rebuilt, AdamW's state made)
    results["zero_bitwise"] = traced_loop(
        root, "zero", _zero_model, lambda s, n, same: _zero_steps(*s, rank, n, same), 2, T, 3
    )


def _tp_model():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.GELU(), torch.nn.Linear(16, 8, bias=False))
    mesh = init_device_mesh("cpu", (WORLD,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _tp_steps(model, opt, steps, same):
    losses = []
    for s in range(steps):
        torch.manual_seed(200 + (0 if same else s))  # the same batch on both ranks
        x = torch.randn(T, 8)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _tp(root, rank, results):
    results["tp_bitwise"] = traced_loop(
        root, "tp", _tp_model, lambda s, n, same: _tp_steps(*s, n, same), 0, T, 3, lambda p: p.to_local()
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return spawn((_zero, _tp), str(tmp_path_factory.mktemp("sharded")))


def _cli_json(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(list(argv) + ["--json"])
    return json.loads(out.getvalue())


def _cli_text(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(list(argv))
    return out.getvalue()


def _per_step(df, rank):
    mine = df[df["rank"] == rank]
    comm = mine[mine["flop_kind"] == "collective"]
    comm = comm.groupby(["step", "phase", "op"], observed=True)["comm_bytes"].agg(["count", "sum"]).reset_index()
    return reports.by_step(mine)["flops"].tolist(), comm


# ------------------------------------------------------------------ ZeroRedundancyOptimizer over DDP
def test_zero_over_ddp_runs_bit_for_bit_as_untraced(runs):
    _, results = runs
    for rank in range(WORLD):
        assert results[rank]["zero_bitwise"] == [True, True, True]  # the 3 losses, then both weights


def test_zero_optimizer_flops_are_the_rank_shard_and_collectives_the_closed_forms(runs):
    root, _ = runs
    one, three = reports.load(os.path.join(root, "zero1")), reports.load(os.path.join(root, "zero3"))
    b = reports.breakdown(three).set_index(["run", "phase"])
    # AdamW, 8 FLOPs per element of its shard + 1 for the step count of its one tensor: rank 0 owns the first
    # layer's 128 weights (8·128 + 1 = 1,025), rank 1 the second's 64 (8·64 + 1 = 513)
    assert [b.loc[(f"zero3/rank={r}", "optimizer"), "flops"] for r in range(WORLD)] == [1025, 513]
    for rank in range(WORLD):
        flops1, comm1 = _per_step(one, rank)
        flops3, comm3 = _per_step(three, rank)
        assert flops3 == flops1 * 3 and len(flops1) == 1
        # each step: DDP's all-reduce of the 768 gradient bytes (192 fp32) in the backward, then the optimizer's
        # 2 broadcasts of the shards from their owners: 128·4 = 512 + 64·4 = 256 = 768 bytes
        assert comm3[["step", "phase", "count", "sum"]].values.tolist() == [
            [s, phase, n, 768] for s in range(3) for phase, n in (("backward", 1), ("optimizer", 2))
        ]
        assert b.loc[(f"zero3/rank={rank}", "forward"), "weight_matmul_flops"] == 1536  # 2·N·T = 2·192·4
        assert b.loc[(f"zero3/rank={rank}", "forward"), "n_rank"] == 192  # DDP: every rank holds all weights
    job = _cli_json("report", os.path.join(root, "zero3"))["distributed"]
    assert [(c["collective"], c["calls_per_step"], c["message_bytes_per_step"]) for c in job["collectives"]] == [
        ("all_reduce", 1.0, 768.0),
        ("broadcast", 2.0, 768.0),
    ]


# ------------------------------------------------------------------ tensor parallelism (DTensor)
def test_tensor_parallel_runs_bit_for_bit_as_untraced(runs):
    _, results = runs
    for rank in range(WORLD):
        assert results[rank]["tp_bitwise"] == [True, True, True]  # the 3 losses, then the two local shards


def test_tensor_parallel_matmul_flops_are_half_and_the_all_reduce_the_output(runs):
    root, _ = runs
    one, three = reports.load(os.path.join(root, "tp1")), reports.load(os.path.join(root, "tp3"))
    b = reports.breakdown(three).set_index(["run", "phase"])
    for rank in range(WORLD):
        flops1, comm1 = _per_step(one, rank)
        flops3, comm3 = _per_step(three, rank)
        assert flops3 == flops1 * 3 and len(flops1) == 1
        # the row-parallel layer's partial outputs all-reduced in the forward: T·8 fp32 = 4·8·4 = 128 bytes; none in
        # the backward (x needs no gradient, so the column-parallel layer's input gradient is never made)
        assert comm3[["step", "phase", "op", "count", "sum"]].values.tolist() == [
            [s, "forward", "_c10d_functional.all_reduce.default", 1, 128] for s in range(3)
        ]
        row = b.loc[(f"tp3/rank={rank}", "forward")]
        # this rank's shards: 8·8 + 8·8 = 128 of N = 256; forward 2·128·4 = 1,024, half of the model's 2·256·4
        assert (row["n_params"], row["n_rank"], row["weight_matmul_flops"], row["expected_flops"]) == (
            256,
            128,
            1024,
            1024,
        )
        # backward: dL/dW 2·128·4 = 1,024 + dL/dx of the row-parallel layer 2·64·4 = 512
        assert b.loc[(f"tp3/rank={rank}", "backward"), "weight_matmul_flops"] == 1536
        assert b.loc[(f"tp3/rank={rank}", "optimizer"), "flops"] == 128  # SGD: 1 per local weight


def test_tensor_parallel_headline_names_the_n_its_six_n_t_uses(runs):
    root, _ = runs
    flops = _cli_json("report", os.path.join(root, "tp3", "rank=0"))["headline"]["flops"]
    assert flops["expected"] == 3072 == 6 * flops["n"] * flops["tokens"]  # 6·128·4


def test_the_distributed_section_names_a_broadcasts_traffic_a_bound(runs):
    root, _ = runs
    text = _cli_text("report", os.path.join(root, "zero3"), "--sections", "distributed")
    section = text[text.index("Collectives per step of rank 0") :]
    # rank 0, the root of its 512-byte shard, sends 512 B and receives rank 1's 256 B; the table says 768 B each way
    assert "broadcast: sent and received are the most any rank moves (the trace records no root)" in section
    job = _cli_json("report", os.path.join(root, "zero3"))["distributed"]
    bounds = {c["collective"]: c["traffic_bound"] for c in job["collectives"]}
    assert bounds == {"all_reduce": False, "broadcast": True}


def test_a_rank_directory_given_alone_keeps_its_rank_in_the_run_name(runs):
    root, _ = runs
    both = reports.load([os.path.join(root, "zero3", "rank=0"), os.path.join(root, "zero3", "rank=1")])
    assert list(both["run"].unique()) == ["zero3/rank=0", "zero3/rank=1"]
