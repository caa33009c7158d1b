"""Distributed training styles traced on real gloo process groups of 2 CPU ranks: DDP over k steps,
gradient accumulation under no_sync, tensor parallelism, a rank that raises, a forked child.

Model: Linear(8, 16) and Linear(16, 4), no biases, fp32: N = 128 + 64 = 192 weights, 768 bytes
of gradients. Each rank runs T = 3 tokens of its own (x scaled by rank + 1)."""

import contextlib
import io
import json
import os

import pandas as pd
import pytest
import torch
import torch.distributed as dist

import reports
from reports.distributed.sql_ranks import ranks
from reports.output.cli import main
from tests.tracer.distributed.test_distributed import _load, _rows, spawn
from tracer import Tracer, read_metadata

WORLD = 2
T = 3
N = 16 * 8 + 4 * 16  # 192
GRAD_BYTES = N * 4  # 768


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 4, bias=False))


def _batch(rank, i=0):
    torch.manual_seed(100 + 10 * rank + i)
    return torch.randn(T, 8)


def _ddp_steps(model, opt, rank, steps, first=0):
    losses = []
    for i in range(steps):
        loss = model(_batch(rank, first + i)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _warm_ddp():
    ddp = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.1)
    return ddp, opt


def _ddp(root, rank, results):
    # k identical steps: after 2 untraced steps (the first builds the buckets, the second rebuilds
    # them with 2 broadcasts; AdamW's state exists) every step is the same work
    for name, steps in (("ddp1", 1), ("ddp3", 3)):
        ddp, opt = _warm_ddp()
        _ddp_steps(ddp, opt, rank, 2)
        with Tracer(os.path.join(root, name), model=ddp, tokens=T):
            for _ in range(steps):
                _ddp_steps(ddp, opt, rank, 1, first=2)  # the same batch each step
    # traced and untraced from the first step on: the same losses and parameters, bit for bit
    outcome = {}
    for traced in (False, True):
        ddp, opt = _warm_ddp()
        if traced:
            with Tracer(os.path.join(root, "ddp_same"), model=ddp, tokens=T):
                losses = _ddp_steps(ddp, opt, rank, 3)
        else:
            losses = _ddp_steps(ddp, opt, rank, 3)
        outcome[traced] = [*losses, *(p.detach().clone() for p in ddp.parameters())]
    results["bitwise"] = [torch.equal(a, b) for a, b in zip(outcome[False], outcome[True])]


def _no_sync(root, rank, results):
    ddp, opt = _warm_ddp()
    _ddp_steps(ddp, opt, rank, 2)
    with Tracer(os.path.join(root, "nosync"), model=ddp, tokens=2 * T):
        with ddp.no_sync():  # the accumulation micro-batch: gradients stay local
            ddp(_batch(rank, 2)).pow(2).mean().backward()
        ddp(_batch(rank, 3)).pow(2).mean().backward()  # the synchronising micro-batch
        opt.step()
        opt.zero_grad()


def _tp(root, rank, results):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (WORLD,))
    x = _batch(0)  # the same input on both ranks, as tensor parallelism expects
    outcome = {}
    for traced in (False, True):
        model = parallelize_module(_model(), mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Tracer(os.path.join(root, "tp"), model=model, tokens=T) if traced else contextlib.nullcontext():
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        outcome[traced] = [loss.detach(), *(p.to_local().detach().clone() for p in model.parameters())]
    results["tp_bitwise"] = [torch.equal(a, b) for a, b in zip(outcome[False], outcome[True])]


def _fsdp(root, rank, results):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 15, bias=False), torch.nn.Linear(15, 4, bias=False))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(os.path.join(root, "fsdp"), model=model, tokens=T):
        for i in range(2):
            model(_batch(rank)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()


def _raises(root, rank, results):
    t = torch.ones(4)
    try:
        with Tracer(os.path.join(root, "raise")):
            dist.all_reduce(t)
            if rank == 1:
                raise RuntimeError("rank 1 failed")
            t.mul_(2)
    except RuntimeError as exc:
        results["raised"] = str(exc)
    dist.barrier()  # rank 0 is not held back: both ranks come here
    results["after_raise"] = t.tolist()


def _fork(root, rank, results):
    with Tracer(os.path.join(root, "fork")):
        y = torch.ones(4) * 2
        pid = os.fork()
        if pid == 0:  # the child computes and leaves without writing
            torch.ones(8).add_(1)
            os._exit(0)
        os.waitpid(pid, 0)
        dist.all_reduce(y)
    results["fork_y"] = y.tolist()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return spawn((_ddp, _no_sync, _tp, _fsdp, _raises, _fork), str(tmp_path_factory.mktemp("dist_review")))


ALL_REDUCE = "c10d.allreduce_.default"
FLOP_COLUMNS = ["phase", "flops", "weight_matmul_flops", "other_flops"]


# --- DDP ------------------------------------------------------------------------------------------
def test_ddp_k_steps_are_k_times_one_step_on_every_rank(runs):
    root, _ = runs
    one, three = _load(root, "ddp1"), _load(root, "ddp3")
    for rank in range(WORLD):
        for df, k in ((one, 1), (three, 3)):
            moved = df[(df["rank"] == rank) & df["comm_bytes"].notna()]
            assert list(moved["op"].astype(str)) == [ALL_REDUCE] * k  # no rebuild broadcast once warm
            assert list(moved["step"]) == list(range(k)) and set(moved["phase"]) == {"backward"}
            assert (moved["comm_bytes"] == GRAD_BYTES).all()  # one bucket: (16 * 8 + 4 * 16) * 4 = 768
        a = reports.breakdown(one).query(f"run == 'ddp1/rank={rank}'")[FLOP_COLUMNS].reset_index(drop=True)
        b = reports.breakdown(three).query(f"run == 'ddp3/rank={rank}'")[FLOP_COLUMNS].reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)  # figures per step
        # forward 2 * 192 * 3 = 1152 matmul + pow 12 + mean 12; 1 step of it in one, 3 in three
        assert a.set_index("phase").loc["forward", "flops"] == 1176
        per_rank = three[three["rank"] == rank]
        assert per_rank.loc[per_rank["phase"] == "forward", "flops"].sum() == 3 * 1176
    table = ranks(three)
    assert list(table["rank"]) == [0, 1] and (table["comm_bytes_per_step"] == GRAD_BYTES).all()


def test_traced_ddp_and_tp_compute_what_they_compute_untraced(runs):
    _, results = runs
    for rank in range(WORLD):
        assert results[rank]["bitwise"] == [True] * 5  # 3 losses, 2 weights
        assert results[rank]["tp_bitwise"] == [True] * 3  # the loss, 2 local weight shards


def test_no_sync_accumulation_all_reduces_only_the_last_micro_batch(runs):
    root, _ = runs
    df = _load(root, "nosync")
    for rank in range(WORLD):
        moved = df[(df["rank"] == rank) & df["comm_bytes"].notna()]
        assert list(moved["op"].astype(str)) == [ALL_REDUCE] and moved.iloc[0]["comm_bytes"] == GRAD_BYTES
        forward_mm = _rows(df, "aten.mm.default", rank).query("phase == 'forward'")["seq"]
        assert len(forward_mm) == 4 and moved.iloc[0]["seq"] > forward_mm.iloc[-1]  # in the second backward
    table = reports.breakdown(df).set_index(["run", "phase"])
    # two micro-batches of T = 3 tokens: 2 * 192 * 6 = 2304 forward, 2 * 1536 = 3072 backward
    assert table.loc[("nosync/rank=1", "forward"), "weight_matmul_flops"] == 2304
    assert table.loc[("nosync/rank=1", "backward"), "weight_matmul_flops"] == 3072


# --- tensor parallelism and FSDP2 ------------------------------------------------------------------
def test_tensor_parallel_mlp_halves_the_flops_and_all_reduces_the_row_parallel_output(runs):
    root, _ = runs
    df = _load(root, "tp")
    table = reports.breakdown(df).set_index(["run", "phase"])
    for rank in range(WORLD):
        moved = df[(df["rank"] == rank) & df["comm_bytes"].notna()]
        assert list(moved["op"].astype(str)) == ["_c10d_functional.all_reduce.default"]
        assert moved.iloc[0]["comm_bytes"] == T * 4 * 4 == 48  # the [3, 4] fp32 output of the row-parallel layer
        assert moved.iloc[0]["phase"] == "forward" and moved.iloc[0]["group_size"] == 2
        run = f"tp/rank={rank}"
        assert table.loc[(run, "forward"), "weight_matmul_flops"] == 2 * N * T // 2 == 576  # half of 1152
        assert table.loc[(run, "backward"), "weight_matmul_flops"] == 1536 // 2 == 768
        assert table.loc[(run, "forward"), "n_rank"] == N // 2 == 96
        # dense: a token uses all of this rank's shards; the report printed "N_active = 96 used per token" of N 192
        assert table.loc[(run, "forward"), "n_active"] == 96
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["report", os.path.join(root, "tp", f"rank={rank}")])
        assert "this rank multiplies N = 96 (its tensor-parallel shards)" in out.getvalue()
        text = out.getvalue()
        assert "N_active" not in text[text.index("\nFLOPs per step against") : text.index("\nMFU (")]
        # the loss's pow and mean on the all-reduced output are forward work, as under DDP: 576 + 12 + 12
        assert table.loc[(run, "forward"), "flops"] == 600
        assert set(df.loc[df["rank"] == rank, "phase"].astype(str)) == {"forward", "backward", "optimizer"}


def test_fsdp2_gathers_and_scatters_the_padded_shards(runs):
    root, _ = runs
    df = _load(root, "fsdp")
    for rank in range(WORLD):
        moved = df[(df["rank"] == rank) & df["comm_bytes"].notna()]
        assert len(moved) == 2 * 6  # per step: 2 layers gathered in the forward and again in the backward, 2 scattered
        gather = moved[moved["op"].astype(str) == "c10d._allgather_base_.default"]
        scatter = moved[moved["op"].astype(str) == "c10d._reduce_scatter_base_.default"]
        # Linear(8, 15): 15 rows sharded 8 + 7, padded to 8 per rank: 2 * 8 * 8 * 4 = 512;
        # Linear(15, 4): 2 rows per rank: 2 * 2 * 15 * 4 = 240
        assert sorted(gather["comm_bytes"]) == [240] * 4 + [512] * 4
        assert sorted(scatter["comm_bytes"]) == [240] * 2 + [512] * 2
    table = ranks(df)
    assert (table["comm_bytes_per_step"] == 2 * (512 + 240) + (512 + 240)).all()  # 2256
    optimizer = reports.breakdown(df).set_index(["run", "phase"])["flops"]
    assert optimizer[("fsdp/rank=0", "optimizer")] == 8 * 8 + 2 * 15 == 94  # SGD: one add per local element
    assert optimizer[("fsdp/rank=1", "optimizer")] == 7 * 8 + 2 * 15 == 86


# --- harm -----------------------------------------------------------------------------------------
def test_a_rank_that_raises_is_incomplete_and_holds_no_one_back(runs, capsys):
    from reports.output.cli import main

    root, results = runs
    assert results[1]["raised"] == "rank 1 failed" and "raised" not in results[0]
    assert (
        results[0]["after_raise"] == [4.0] * 4 and results[1]["after_raise"] == [2.0] * 4
    )  # 1 + 1, then x 2 on rank 0
    meta = [read_metadata(os.path.join(root, "raise", f"rank={r}")) for r in range(WORLD)]
    assert meta[0]["complete"] is True and meta[1]["complete"] is False
    assert meta[1]["error"] == "RuntimeError: rank 1 failed"
    assert read_metadata(os.path.join(root, "raise"))["complete"] is False
    # the report of the job names both ranks and says which one is incomplete, and why
    assert main(["report", os.path.join(root, "raise")]) == 0
    text = capsys.readouterr().out
    assert main(["report", os.path.join(root, "raise"), "--engine", "sql"]) == 0
    assert capsys.readouterr().out == text
    assert "Ranks (2)" in text
    assert "rank 1: INCOMPLETE: the traced code raised RuntimeError: rank 1 failed" in text
    assert main(["report", os.path.join(root, "raise"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["complete"], r["error"]) for r in summary["ranks"]] == [
        (0, True, None),
        (1, False, "RuntimeError: rank 1 failed"),
    ]


def test_a_forked_child_of_a_rank_writes_nothing(runs):
    root, results = runs
    df = _load(root, "fork")
    for rank in range(WORLD):
        assert results[rank]["fork_y"] == [4.0] * 4  # 2 + 2
        mine = df[df["rank"] == rank]
        assert list(mine["op"].astype(str)) == [
            "aten.ones.default",
            "aten.mul.Tensor",
            ALL_REDUCE,
        ]  # the child's add_ is not here
        assert sorted(os.listdir(os.path.join(root, "fork", f"rank={rank}"))) == [
            "_optrace.parquet",
            "part-000000.parquet",
        ]
