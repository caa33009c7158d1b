"""Distributed training loops as users write them, on 2 gloo ranks, traced end to end: the program computes what it
computes untraced, k identical steps give k times one step's figures, and the FLOPs and collective bytes are the
closed forms.

DDP (nanoGPT's loop): Linear(8, 16) -> GELU -> Linear(16, 4), no biases, fp32 weights: N = 128 + 64 = 192, 768
bytes of gradients; 2 micro-batches of T = 3 rows per optimizer step (the first under `no_sync()`), bf16 autocast,
GradScaler, unscale, clip_grad_norm_, loss.item(); tokens per step 2·3 = 6.

FSDP2: two blocks x + Linear(16, 8)(gelu(Linear(8, 16)(x))), no biases: N = 2·(128 + 128) = 512, each block its own
unit (fully_shard, MixedPrecisionPolicy: bf16 parameters for the compute, fp32 gradient reduction), each block
checkpointed (non-reentrant), AdamW; T = 3 rows per rank."""

import contextlib
import io
import json
import os

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import reports
from reports.output.cli import main
from tests.helpers import traced_loop
from tests.tracer.distributed.test_distributed import spawn
from tracer import read_metadata

T, ACC, WORLD = 3, 2, 2


# ------------------------------------------------------------------ the loops, run on each rank
def _ddp_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.GELU(), torch.nn.Linear(16, 4, bias=False))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=0.1), torch.amp.GradScaler("cpu", init_scale=16.0)


def _batch(rank, i):
    torch.manual_seed(100 + 10 * rank + i)
    return torch.randn(T, 8), torch.randint(0, 4, (T,))


def _ddp_steps(ddp, opt, scaler, rank, steps, same):
    """nanoGPT's loop: ACC micro-batches (all but the last under no_sync), the same batches each step if `same`."""
    losses = []
    for s in range(steps):
        for micro in range(ACC):
            x, y = _batch(rank, micro if same else ACC * s + micro)
            with ddp.no_sync() if micro < ACC - 1 else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(ddp(x), y) / ACC
                scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _ddp(root, rank, results):
    # traced after 2 untraced steps (buckets rebuilt, AdamW's state made)
    results["ddp_bitwise"] = traced_loop(
        root, "ddp", _ddp_model, lambda s, n, same: _ddp_steps(*s, rank, n, same), 2, ACC * T, 3
    )


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16, bias=False)
        self.b = torch.nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(x)))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def _fsdp_model():
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = _Net()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _fsdp_steps(model, opt, rank, steps, same):
    losses = []
    for s in range(steps):
        loss = model(_batch(rank, 0 if same else s)[0]).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _fsdp(root, rank, results):
    # traced after 1 untraced step (AdamW's state made)
    results["fsdp_bitwise"] = traced_loop(
        root, "fsdp", _fsdp_model, lambda s, n, same: _fsdp_steps(*s, rank, n, same), 1, T, 2, lambda p: p.to_local()
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return spawn((_ddp, _fsdp), str(tmp_path_factory.mktemp("loops")))


def _per_step(df, rank):
    mine = df[df["rank"] == rank]
    collectives = mine[mine["flop_kind"] == "collective"]
    return (
        reports.by_step(mine)["flops"].tolist(),
        collectives.groupby(["step", "op"], observed=True)["comm_bytes"].agg(["count", "sum"]).reset_index(),
    )


def _cli(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(list(argv))
    return out.getvalue()


# ------------------------------------------------------------------ DDP
def test_ddp_accumulation_autocast_scaler_runs_bit_for_bit_as_untraced(runs):
    _, results = runs
    for rank in range(WORLD):
        assert results[rank]["ddp_bitwise"] == [True, True, True]  # the 3 losses, then both weights


def test_ddp_k_steps_are_k_times_one_and_all_reduce_the_gradients_once_per_step(runs):
    root, _ = runs
    one, three = reports.load(os.path.join(root, "ddp1")), reports.load(os.path.join(root, "ddp3"))
    for rank in range(WORLD):
        flops1, comm1 = _per_step(one, rank)
        flops3, comm3 = _per_step(three, rank)
        assert flops3 == flops1 * 3 and len(flops1) == 1
        # one bucket of the 768 gradient bytes (192 fp32) per optimizer step: none for the no_sync micro-batch
        assert comm3["op"].tolist() == ["c10d.allreduce_.default"] * 3
        assert comm3["count"].tolist() == [1, 1, 1] and comm3["sum"].tolist() == [768, 768, 768]
    b = reports.breakdown(three).set_index(["run", "phase"])
    for rank in range(WORLD):
        row = b.loc[(f"ddp3/rank={rank}", "forward")]
        assert row["weight_matmul_flops"] == 2304  # 2·N·T = 2·192·6: both micro-batches, in bf16
        row = b.loc[(f"ddp3/rank={rank}", "backward")]
        # dL/dW of both layers 2·192·6 = 2,304 + dL/dx of the second 2·64·6 = 768 (x needs no gradient)
        assert row["weight_matmul_flops"] == 3072
    job = json.loads(_cli("report", os.path.join(root, "ddp3"), "--json"))["distributed"]
    assert [(c["collective"], c["calls_per_step"], c["message_bytes_per_step"]) for c in job["collectives"]] == [
        ("all_reduce", 1.0, 768.0)
    ]
    assert job["collectives"][0]["sent_bytes_per_step"] == 768.0  # ring all-reduce: 2·(2 - 1)/2 of 768
    # the metadata's count of collectives timed to their launch only, in --json (gloo's all-reduce reports its
    # completion; 1 of 6 seen untimed in one run of 3: the count is what the tracer found, not always 0)
    assert job["collectives_untimed"] == read_metadata(os.path.join(root, "ddp3", "rank=0"))["collectives_untimed"]


# ------------------------------------------------------------------ FSDP2
def test_fsdp2_mixed_precision_checkpointed_runs_bit_for_bit_as_untraced(runs):
    _, results = runs
    for rank in range(WORLD):
        assert results[rank]["fsdp_bitwise"] == [True, True, True, True, True]  # 2 losses, 4 weight shards


def test_fsdp2_k_steps_recompute_and_collectives_are_the_closed_forms(runs):
    root, _ = runs
    one, three = reports.load(os.path.join(root, "fsdp1")), reports.load(os.path.join(root, "fsdp3"))
    for rank in range(WORLD):
        flops1, comm1 = _per_step(one, rank)
        flops3, comm3 = _per_step(three, rank)
        assert flops3 == flops1 * 3
        per_step = comm3.groupby("op")[["count", "sum"]].sum() / 3
        # all-gathers: each block's 256 parameters in bf16, 512 bytes, in the forward and again in the backward
        assert per_step.loc["c10d._allgather_base_.default"].tolist() == [4, 4 * 512]
        # reduce-scatters: each block's 256 gradients in fp32 (reduce_dtype), 1,024 bytes
        assert per_step.loc["c10d._reduce_scatter_base_.default"].tolist() == [2, 2 * 1024]
        mine = three[three["rank"] == rank]
        recompute = mine[mine["recompute"].astype(bool)]
        # the early-stopping checkpoint re-runs each block up to its gelu: Linear(8, 16) 2·3·8·16 = 768 and gelu
        # 3·16 = 48, twice: 1,632 per step, phase backward
        assert recompute.groupby("step")["flops"].sum().tolist() == [1632, 1632, 1632]
        assert set(recompute["phase"]) == {"backward"}
    b = reports.breakdown(three).set_index(["run", "phase"])
    row = b.loc[("fsdp3/rank=0", "forward")]
    assert (row["weight_matmul_flops"], row["n_params"], row["n_rank"]) == (3072, 512, 512)  # 2·512·3 = 3,072
    # backward: dW 3,072 + dL/dx of 3 of the 4 layers 3·768 = 2,304 + the recomputed Linear(8, 16)s 2·768 = 1,536
    assert b.loc[("fsdp3/rank=0", "backward")]["weight_matmul_flops"] == 6912
    report = json.loads(_cli("report", os.path.join(root, "fsdp3"), "--json"))
    # the rank's shards at the peak: 256 fp32 parameters = 1,024 bytes, AdamW's 2 states 2,048 + 2 step counters
    assert report["memory"]["categories"]["parameters"] == 1024
    assert report["memory"]["categories"]["optimizer_state"] == 2048 + 2 * 8
    # gloo's reduce-scatter reports no completion: 2 per step, 3 steps, at least 6 timed to their launch, in --json
    untimed = read_metadata(os.path.join(root, "fsdp3", "rank=0"))["collectives_untimed"]
    assert untimed >= 6 and report["distributed"]["collectives_untimed"] == untimed


def test_the_report_names_collectives_timed_to_their_launch_only(runs):
    root, _ = runs
    text = _cli("report", os.path.join(root, "fsdp3"))
    assert "reduce_scatter" in text  # the Collectives (rank 0) line: 6 x 1 KiB: ... ms each, busbw ...
    # >= 6 reduce-scatters a rank, counted over both (the Ranks section reads both ranks' times)
    untimed = sum(read_metadata(os.path.join(root, "fsdp3", f"rank={r}"))["collectives_untimed"] for r in (0, 1))
    assert f"- collectives_untimed: {untimed:,} collectives of the 2 ranks timed to their launch only" in text
    report = json.loads(_cli("report", os.path.join(root, "fsdp3"), "--json"))
    assert "collectives_untimed" in {c["code"] for c in report["caveats"]}


def test_the_library_on_one_rank_of_a_distributed_frame_reports_that_rank_only(runs):
    root, _ = runs
    df = reports.load(os.path.join(root, "ddp3"))
    one = df[df["rank"] == 1]
    # rank 0 was reported too, every FLOP 0, n_params 0, MFU 0.0 and "N = 0 parameters" in explain
    alone = reports.load(os.path.join(root, "ddp3", "rank=1"))
    assert reports.breakdown(one).equals(reports.breakdown(alone))  # one run: no run column
    assert set(reports.mfu(one, step_time_s=0.01, peak_flops=1e12)["run"]) == {"ddp3/rank=1"}
    assert not any(line.startswith("ddp3/rank=0") for line in reports.explain(one))
    roofs = {"peak_flops": 1e11, "bandwidth": 1e10}
    split = reports.roofline_split(one, **roofs)  # rank 0 was in it too, its rows NaN
    assert split.equals(reports.roofline_split(alone, **roofs)) and not split["time_s"].isna().any()


def test_the_roofline_does_not_call_a_collective_memory_bound(runs):
    root, _ = runs
    df = reports.load(os.path.join(root, "ddp3"))
    roof = reports.roofline(df, peak_flops=1e11, bandwidth=1e10)
    all_reduce = roof[roof["op"] == "c10d.allreduce_.default"]
    assert len(all_reduce) == 2  # one per rank
    # 0 FLOPs and 1,536 bytes read and written were "memory": fusing cannot buy back a collective's time
    assert set(all_reduce["bound"]) == {"other"} and (all_reduce["bytes_per_step"] == 0).all()
