"""Distributed traces: real gloo process groups of 2 ranks on the CPU, started once with
torch.multiprocessing; each test checks one trace the ranks wrote. The CUDA/NCCL
completion path is tested with a mocked torch.cuda."""

import json
import os
import socket
import sys
import time
import types

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import reports
from reports.distributed.collectives import bus_factor, collective_kind, comm_split
from reports.distributed.sql_ranks import collectives, imbalance, ranks
from tracer import TraceError, Tracer, read_metadata
from tracer.recording import collectives as tcoll
from tracer.recording import distributed as tdist
from tracer.store.writer import FIELD, ROW_WIDTH, RowBuffer

WORLD = 2
LATE_S = 0.5  # rank 1 joins the late all-reduce this long after rank 0
# The model of the DDP and FSDP2 runs: N = 16*8 + 4*16 = 192 weights, T = 3 tokens per rank.
N, T_RANK = 192, 3


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 4, bias=False))


def _step(model, opt, x):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def _collectives(root, rank, results):
    import torch.distributed._functional_collectives as fc

    dist.barrier()  # both ranks start together: only the late all-reduce makes one wait long
    with Tracer(os.path.join(root, "coll")):  # the same path on both ranks
        t = torch.full((256,), float(rank + 1))
        dist.all_reduce(t)  # 256 floats: S = 1024 bytes
        gathered = torch.empty(512)
        dist.all_gather_into_tensor(gathered, torch.full((256,), float(rank)))  # S = 2 x 1024
        scattered = torch.empty(128)
        dist.reduce_scatter_tensor(scattered, torch.ones(256))  # S = the 256-float input
        dist.broadcast(t, src=0)  # S = 1024
        parts = [torch.empty(64) for _ in range(WORLD)]
        dist.all_gather(parts, torch.full((64,), float(rank)))  # allgather_: a list of lists out, S = 2 x 256
        dist.barrier()
        if rank == 1:
            time.sleep(LATE_S)
        summed = fc.all_reduce(t, "sum", dist.group.WORLD).sum()  # functional, waited by .sum(): rank 0 waits
        functional = torch.ops._c10d_functional
        raw = functional.all_reduce(torch.ones(4), "sum", dist.group.WORLD.group_name)  # 4 floats: S = 16
        functional.wait_tensor(raw)
        work = dist.all_reduce(torch.ones(16), async_op=True)
        work.wait()
        dist.barrier()
        if rank == 1:
            time.sleep(LATE_S)
        dist.all_reduce(torch.ones(8))  # rank 0 waits LATE_S for rank 1
    results.update(
        t=t.tolist()[:2],
        gathered=[gathered[0].item(), gathered[-1].item()],
        scattered=scattered[0].item(),
        parts=[p[0].item() for p in parts],
        summed=summed.item(),
    )


def _ddp(root, rank, results):
    ddp = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with Tracer(os.path.join(root, "ddp"), model=ddp, tokens=T_RANK):
        _step(ddp, opt, torch.ones(T_RANK, 8))
    warm = torch.nn.parallel.DistributedDataParallel(_model())
    warm_opt = torch.optim.AdamW(warm.parameters(), lr=0.1)
    _step(warm, warm_opt, torch.ones(T_RANK, 8))  # the traced step rebuilds the buckets; AdamW's state exists
    with Tracer(os.path.join(root, "ddp_warm"), model=warm, tokens=T_RANK):
        _step(warm, warm_opt, torch.ones(T_RANK, 8))


def _fsdp(root, rank, results):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode

    def sharded():
        model = _model()
        for layer in model:
            fully_shard(layer)
        return fully_shard(model)

    x = torch.ones(T_RANK, 8) * (rank + 1)
    model = sharded()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
    with Tracer(os.path.join(root, "fsdp"), model=model, tokens=T_RANK):
        _step(model, opt, x)
    reference = _model()  # the same model unsharded, its optimizer on whole parameters
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.1, foreach=True)
    with Tracer(os.path.join(root, "unsharded"), model=reference, tokens=T_RANK):
        _step(reference, ref_opt, x)
    again = sharded()
    again_opt = torch.optim.AdamW(again.parameters(), lr=0.1, foreach=True)
    with Tracer(os.path.join(root, "fsdp3"), model=again, tokens=T_RANK):
        for _ in range(3):
            _step(again, again_opt, x)
    other = sharded()
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1, foreach=True)
    with CommDebugMode() as comm:
        _step(other, other_opt, x)
    results["comm_debug"] = {str(op): n for op, n in comm.get_comm_counts().items()}


def worker(rank, root, store, parts):
    """Each of `parts` (part(root, rank, results)) on this rank of a gloo group of WORLD; the results to
    results{rank}.json."""
    os.environ.update(LOCAL_RANK=str(rank))
    # a file store, not a TCP port: no free port to pick and lose to another process before both ranks bind it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    results = {}
    try:
        for part in parts:
            part(root, rank, results)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(root, f"results{rank}.json"), "w") as f:
        json.dump(results, f)
    # End without interpreter finalisation. The PG's gloo threads outlive destroy_process_group, and
    # the thread that ran the last collective (FSDP2's reduce-scatter, an all-reduce on gloo, made in a
    # backward) may still be freeing its Work, whose thread-local state holds a Python object (the
    # contextvars.Context autograd stashes for the backward): the decref takes the GIL, and a thread
    # that takes it while the interpreter finalises is ended by pthread_exit inside that noexcept
    # destructor: std::terminate, SIGABRT, "terminate called without an active exception" (seen in
    # 5 of 40 runs of these workers; 0 of 40 with this exit). Every file the worker wrote is closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(parts, root):
    """`worker` of `parts` on WORLD processes; (root, {rank: the results{rank}.json it wrote}). Each a fresh process
    forked from multiprocessing's fork server, which imports torch, what the first Tracer imports and this module
    once for the test process (a spawned process imported them each time: about 3 CPU-s per rank)."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed.tensor", __name__])
    mp.start_processes(worker, args=(root, os.path.join(root, "store"), parts), nprocs=WORLD, start_method="forkserver")
    results = {}
    for rank in range(WORLD):
        with open(os.path.join(root, f"results{rank}.json")) as f:
            results[rank] = json.load(f)
    return root, results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return spawn((_collectives, _ddp, _fsdp), str(tmp_path_factory.mktemp("dist")))


def _load(root, name):
    return reports.load(os.path.join(root, name))


def _rows(df, op, rank=0):
    return df[(df["rank"] == rank) & (df["op"].astype(str) == op)]


# --- 1. one trace per rank ---------------------------------------------------------------
def test_same_path_on_every_rank_gives_one_directory_per_rank(runs):
    root, _ = runs
    assert sorted(os.listdir(os.path.join(root, "coll"))) == ["rank=0", "rank=1"]
    for rank in range(WORLD):
        meta = read_metadata(os.path.join(root, "coll", f"rank={rank}"))
        assert meta["complete"] is True
        assert (meta["rank"], meta["world_size"], meta["local_rank"], meta["backend"]) == (rank, 2, rank, "gloo")
        assert meta["process_groups"][0] == {"name": "0", "size": 2, "ranks": [0, 1]}
    df = _load(root, "coll")
    assert sorted(df["rank"].unique()) == [0, 1]
    assert list(df.attrs["runs"]) == ["coll/rank=0", "coll/rank=1"]
    one = reports.load(os.path.join(root, "coll", "rank=1"))  # one rank's directory: its rank from the metadata
    # named as in the whole trace (was "coll", so `compare coll/rank=0 coll/rank=1` printed "coll#2 against coll")
    assert set(one["rank"]) == {1} and list(one.attrs["runs"]) == ["coll/rank=1"]
    plain = pd.read_parquet(os.path.join(root, "coll"))  # hive layout: pyarrow reads rank as a column
    assert sorted(plain["rank"].astype(int).unique()) == [0, 1]
    # start_ns is a clock both ranks share: the late all-reduce starts LATE_S later on rank 1,
    # and ends at the same moment on both ranks (when rank 1 joined)
    late = [_rows(df, "c10d.allreduce_.default", rank).iloc[-1] for rank in range(WORLD)]
    starts = [int(r["start_ns"]) for r in late]
    ends = [int(r["start_ns"] + r["duration_ns"]) for r in late]
    assert starts[1] - starts[0] >= 0.8 * LATE_S * 1e9
    assert abs(ends[1] - ends[0]) < (starts[1] - starts[0]) / 2


def test_the_program_runs_as_untraced(runs):
    _, results = runs
    for rank in range(WORLD):
        r = results[rank]
        assert r["t"] == [3.0, 3.0]  # 1 + 2, then broadcast from rank 0
        assert r["gathered"] == [0.0, 1.0]
        assert r["scattered"] == 2.0  # ones summed over 2 ranks
        assert r["parts"] == [0.0, 1.0]
        assert r["summed"] == 256 * 6.0  # (3 + 3) per element


# --- 2. collective rows -------------------------------------------------------------------
@pytest.mark.parametrize(
    "op, comm_bytes, written",
    [
        ("c10d.allreduce_.default", 1024, 1024),  # 256 floats x 4 bytes
        ("c10d._allgather_base_.default", 2048, 2048),  # 256 floats per rank x 2 ranks x 4 bytes
        ("c10d._reduce_scatter_base_.default", 1024, 512),  # the 256-float input; writes 128 floats
        ("c10d.broadcast_.default", 1024, 1024),
        ("c10d.allgather_.default", 512, 512),  # 64 floats x 2 ranks x 4 bytes
        ("_c10d_functional.all_reduce.default", 1024, 1024),  # a new 256-float tensor
    ],
)
def test_collective_rows(runs, op, comm_bytes, written):
    root, _ = runs
    df = _load(root, "coll")
    for rank in range(WORLD):
        row = _rows(df, op, rank).iloc[0]
        assert row["flop_kind"] == "collective" and row["flops"] == 0
        assert row["comm_bytes"] == comm_bytes
        assert row["group_size"] == 2 and row["process_group"] == "0"
        assert row["bytes_written"] == written
        assert not row["is_view"]
        assert row["inplace"] == (op != "_c10d_functional.all_reduce.default")


def test_allgather_list_outputs_are_recorded(runs):
    root, _ = runs
    row = _rows(_load(root, "coll"), "c10d.allgather_.default").iloc[0]
    assert [list(s) for s in row["output_shapes"]] == [[64], [64]]
    assert row["bytes_read"] == 256  # the 64-float input; the output buffers are written, not read


def test_views_report_lists_no_collective(runs):
    root, _ = runs
    df = _load(root, "coll")
    moved = set(df.loc[df["comm_bytes"].notna(), "op"].astype(str))  # the collectives
    assert len(moved) == 7
    v = reports.views(df)
    assert not v["op"].astype(str).isin(moved).any()  # wait_tensor and the wrapper are views: they alias


# --- 3. collective time -----------------------------------------------------------------------
def test_blocking_collective_lasts_until_the_late_rank_joined(runs):
    root, _ = runs
    df = _load(root, "coll")
    late = _rows(df, "c10d.allreduce_.default", 0).iloc[-1]  # the last all-reduce: rank 1 came LATE_S late
    assert late["input_shapes"][0].tolist() == [8]
    assert late["duration_ns"] >= 0.8 * LATE_S * 1e9
    assert late["busy_ns"] == late["duration_ns"]
    on_time = _rows(df, "c10d.allreduce_.default", 1).iloc[-1]
    assert on_time["duration_ns"] < late["duration_ns"]


def test_wait_tensor_ends_its_collective(runs):
    root, _ = runs
    df = _load(root, "coll")
    for rank in range(WORLD):
        wait = _rows(df, "_c10d_functional.wait_tensor.default", rank).iloc[0]
        assert wait["flop_kind"] == "none" and pd.isna(wait["comm_bytes"])
        launch = _rows(df, "_c10d_functional.all_reduce.default", rank).iloc[-1]
        assert launch["comm_bytes"] == 16
        assert launch["start_ns"] + launch["duration_ns"] == wait["start_ns"] + wait["duration_ns"]


def test_functional_collective_lasts_until_its_wait(runs):
    root, _ = runs
    df = _load(root, "coll")
    row = _rows(df, "_c10d_functional.all_reduce.default", 0).iloc[0]
    # launched at once (async), completed only when rank 1 joined LATE_S later; .sum() waited for it
    assert row["duration_ns"] >= 0.8 * LATE_S * 1e9
    meta = read_metadata(os.path.join(root, "coll", "rank=0"))
    assert meta["collectives_untimed"] == 1  # gloo's reduce-scatter work has no future
    assert meta["record_errors"] == 0


# --- 4. DDP and FSDP2 accounting ---------------------------------------------------------------
def test_ddp_bucket_all_reduce_and_breakdown(runs):
    root, _ = runs
    df = _load(root, "ddp")
    for rank in range(WORLD):
        bucket = _rows(df, "c10d.allreduce_.default", rank)
        assert len(bucket) == 1 and bucket.iloc[0]["phase"] == "backward"
        assert bucket.iloc[0]["comm_bytes"] == N * 4  # one bucket with both gradients, fp32
    assert all(meta["record_errors"] == 0 for meta in df.attrs["runs"].values())
    table = reports.breakdown(df).set_index(["run", "phase"])
    fwd = table.loc[("ddp/rank=0", "forward")]
    assert fwd["n_params"] == N
    assert fwd["weight_matmul_flops"] == 2 * N * T_RANK == 1152
    # backward: dW2 2*4*3*16 + dX2 2*3*4*16 + dW1 2*16*3*8 = 384 + 384 + 768 (x needs no gradient)
    assert table.loc[("ddp/rank=1", "backward"), "weight_matmul_flops"] == 1536


def test_fsdp2_forward_is_2NT_per_rank_and_optimizer_is_sharded(runs):
    root, _ = runs
    loaded = _load(root, "fsdp")
    assert all(meta["record_errors"] == 0 for meta in loaded.attrs["runs"].values())
    fsdp = reports.breakdown(loaded).set_index(["run", "phase"])
    whole = reports.breakdown(_load(root, "unsharded")).set_index(["run", "phase"])
    for rank in range(WORLD):
        row = fsdp.loc[(f"fsdp/rank={rank}", "forward")]
        assert row["n_params"] == N  # the unsharded parameters FSDP2 builds enter the matmuls
        assert row["weight_matmul_flops"] == 2 * N * T_RANK == 1152
        assert row["attention_flops"] == 0
        assert fsdp.loc[(f"fsdp/rank={rank}", "backward"), "weight_matmul_flops"] == 1536
        # AdamW: 8 foreach ops x the elements + 1 per step counter (2 counters, not sharded)
        assert fsdp.loc[(f"fsdp/rank={rank}", "optimizer"), "flops"] == 8 * 96 + 2 == 770
        assert whole.loc[(f"unsharded/rank={rank}", "optimizer"), "flops"] == 8 * 192 + 2 == 1538


def test_fsdp2_three_steps_give_the_figures_of_one(runs):
    root, _ = runs
    columns = ["phase", "flops", "weight_matmul_flops", "attention_flops", "other_flops"]
    one = reports.breakdown(_load(root, "fsdp"))
    three = reports.breakdown(_load(root, "fsdp3"))
    assert set(three["steps"]) == {3}
    for rank in range(WORLD):
        a = one[one["run"] == f"fsdp/rank={rank}"][columns].reset_index(drop=True)
        b = three[three["run"] == f"fsdp3/rank={rank}"][columns].reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)
    rows = _load(root, "fsdp3")
    assert len(_rows(rows, "c10d._allgather_base_.default")) == 3 * 4


def test_fsdp2_collectives_match_comm_debug_mode(runs):
    root, results = runs
    df = _load(root, "fsdp")
    counts = results[0]["comm_debug"]
    gathers = sum(n for op, n in counts.items() if collective_kind(op) == "all_gather")
    scatters = sum(n for op, n in counts.items() if collective_kind(op) == "reduce_scatter")
    assert (gathers, scatters) == (4, 2)  # 2 layers: gathered in forward and again in backward
    assert len(_rows(df, "c10d._allgather_base_.default")) == gathers
    assert len(_rows(df, "c10d._reduce_scatter_base_.default")) == scatters


def test_fsdp2_memory_at_local_sizes(runs):
    root, _ = runs
    df = _load(root, "fsdp")
    meta = df.attrs["runs"]["fsdp/rank=0"]
    assert meta["parameters"]["0.weight"]["shape"] == [8, 8] and meta["parameters"]["0.weight"]["global_shape"] == [
        16,
        8,
    ]
    assert meta["params"]["total"] == N
    assert meta["unsharded_parameters"]["0.weight"]["numel"] == 128
    table = reports.storages(df[df["rank"] == 0])
    by = table.groupby("category")["nbytes"].sum()
    assert by["parameters"] == 96 * 4  # half of the 192 fp32 weights
    assert by["gradients"] == 96 * 4
    assert by["optimizer_state"] == 2 * 96 * 4 + 2 * 4  # exp_avg, exp_avg_sq and two step counters
    # FSDP2 frees its unsharded parameters by resizing their storage to 0 outside the dispatcher;
    # the trace follows, so the sharded rank peaks below the unsharded run
    peak = reports.peak(df).set_index("run")["peak_live_bytes"]
    whole = reports.peak(_load(root, "unsharded")).set_index("run")["peak_live_bytes"]
    assert peak["fsdp/rank=0"] < whole["unsharded/rank=0"]


def test_memory_categories_add_up_under_ddp_and_fsdp2(runs):
    from reports.memory.memory import CATEGORIES

    root, _ = runs
    for name in ("ddp", "ddp_warm", "fsdp", "fsdp3"):
        line = reports.timeline(_load(root, name))
        parts = line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1)
        assert (parts == line["live_bytes"]).all(), name
    warm = reports.timeline(_load(root, "ddp_warm"))
    for rank in range(WORLD):
        mine = warm[warm["run"] == f"ddp_warm/rank={rank}"]
        # entered after a warm-up step: AdamW's exp_avg and exp_avg_sq (2 * 192 * 4) and 2 step counters, from row 0
        assert (mine["optimizer_state_bytes"] == 2 * N * 4 + 2 * 4).all()
        buffers = reports.storages(_load(root, "ddp_warm"))
        buffers = buffers[
            (buffers["run"] == f"ddp_warm/rank={rank}") & (buffers["category"] == "communication_buffers")
        ]
        assert N * 4 in set(
            buffers["nbytes"]
        )  # the rebuilt bucket: both gradients, fp32 (beside the rebuild's small broadcasts)
        # saved for the backward: the hidden [3, 16] (the second Linear's input), the loss and backward()'s seed: 200
        assert mine["activations_bytes"].max() == 3 * 16 * 4 + 4 + 4
    fsdp = reports.by_category(_load(root, "fsdp"), at="max").set_index(["run", "category"])["bytes"]
    for rank in range(WORLD):
        # FSDP2 gathers one layer at a time (the root holds no parameter of its own): layer 0, 16 * 8 fp32
        assert fsdp[(f"fsdp/rank={rank}", "unsharded_parameters")] == 16 * 8 * 4 == 512


# --- 5. reports across ranks -----------------------------------------------------------------------
def test_collectives_report_bandwidth(runs):
    root, _ = runs
    table = collectives(_load(root, "coll"))
    row = table[(table["rank"] == 0) & (table["op"] == "c10d._allgather_base_.default")].iloc[0]
    assert row["collective"] == "all_gather" and row["calls"] == 1 and row["comm_bytes"] == 2048
    assert row["algbw_bytes_per_s"] == pytest.approx(2048 / row["duration_s"])
    assert row["busbw_bytes_per_s"] == pytest.approx(row["algbw_bytes_per_s"] / 2)  # (n-1)/n, n = 2
    ar = table[(table["rank"] == 0) & (table["op"] == "c10d.allreduce_.default")]
    assert sorted(ar["comm_bytes"]) == [32, 64, 1024]  # 8, 16 and 256 floats
    split = comm_split(_load(root, "coll"))
    assert list(split["rank"]) == [0, 1]
    assert (split["comm_bytes"] == 1024 + 2048 + 1024 + 1024 + 512 + 1024 + 16 + 64 + 32).all()  # barrier: 0


def test_the_text_report_gives_no_bandwidth_to_a_barrier(runs, capsys):
    from reports.output.cli import main

    root, _ = runs
    assert main(["report", os.path.join(root, "coll")]) == 0
    lines = [x.strip() for x in capsys.readouterr().out.splitlines()]
    barrier = [x for x in lines if x.startswith("barrier ")]
    assert barrier and all("busbw" not in x for x in barrier)  # 0 bytes: no bandwidth, not "busbw 0 B/s"
    assert any(x.startswith("all_gather ") and "busbw" in x for x in lines)  # 2,048 bytes moved: a bandwidth


def test_ranks_and_imbalance(runs):
    root, _ = runs
    df = _load(root, "coll")
    table = ranks(df)
    assert list(table["rank"]) == [0, 1]
    assert (table["comm_bytes_per_step"] == 6768).all()
    assert table.loc[0, "comm_s_per_step"] > LATE_S * 0.8  # rank 0 waited for rank 1
    imb = imbalance(df).set_index("phase")
    # all of it is "other" (outside any module, building no autograd graph); rank 0 spent LATE_S longer waiting
    assert list(imb.index) == ["other", "step"]
    # the slowest rank is the one with the most "other" op time per step (which one depends on the machine's load)
    other = {r: rows.loc[rows["phase"] == "other", "duration_ns"].sum() for r, rows in df.groupby("rank")}
    assert imb.loc["other", "slowest_rank"] == max(other, key=other.get)
    assert imb.loc["other", "max_s"] >= LATE_S * 0.8  # rank 0's wait alone is this long
    assert imb.loc["other", "imbalance"] == pytest.approx(imb.loc["other", "max_s"] / imb.loc["other", "mean_s"])


def test_cli_report_and_json_on_a_multi_rank_trace(runs, capsys):
    from reports.output.cli import main

    root, _ = runs
    assert main(["report", os.path.join(root, "fsdp")]) == 0
    text = capsys.readouterr().out
    assert "Ranks (2)" in text and "slowest rank" in text
    assert main(["report", os.path.join(root, "fsdp"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["ranks"][1]["flops_per_step"] == summary["ranks"][0]["flops_per_step"]
    assert {row["phase"] for row in summary["imbalance"]} >= {"forward", "backward", "optimizer", "step"}


@pytest.mark.parametrize("name", ["fsdp", "ddp"])
def test_the_sql_engine_reports_the_ranks_as_pandas_does(runs, name, capsys):
    """The memory, job and rank sections from SQL over every rank's files: the same text and --json."""
    from reports.output.cli import main

    root, _ = runs
    outputs = []
    for flags in ([], ["--json"]):
        for engine in ("pandas", "sql"):
            assert main(["report", os.path.join(root, name), "--engine", engine, *flags]) == 0
            outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and "Ranks (2)" in outputs[0] and "Memory: peak" in outputs[0]
    assert outputs[2] == outputs[3] and len(json.loads(outputs[3])["imbalance"]) >= 2


# --- without a process group ------------------------------------------------------------------------
def test_torchrun_environment_without_a_process_group(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with Tracer(tmp_path / "t"):
        torch.ones(2) + 1
    assert os.listdir(tmp_path / "t") == ["rank=3"]
    meta = read_metadata(tmp_path / "t" / "rank=3")
    assert (meta["rank"], meta["world_size"], meta["local_rank"], meta["backend"]) == (3, 4, 3, None)


def test_bad_rank_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(TraceError, match=r"RANK='zero': expected an integer"):
        with Tracer(tmp_path / "t"):
            pass


def test_rank_directory_makes_missing_parents(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with Tracer(tmp_path / "missing" / "t"):
        torch.ones(2)
    assert (tmp_path / "missing" / "t" / "rank=0" / "part-000000.parquet").is_file()


def test_rank_zero_clears_a_stale_trace(tmp_path):
    path = tmp_path / "t"
    with Tracer(path, flush_rows=2):  # a single-process trace: its parts would mix with the ranks'
        torch.ones(2) + 1
    assert tdist.rank_directory(str(path), 0, 2) == str(path / "rank=0")
    assert sorted(os.listdir(path)) == ["_optrace.parquet"]  # its parts removed


def test_rank_zero_refuses_a_directory_holding_files_optrace_did_not_write(tmp_path):
    path = tmp_path / "t"
    (path / "rank=5").mkdir(parents=True)
    (path / "rank=5" / "part-000000.parquet").write_bytes(b"")  # named like parts, without optrace metadata
    (path / "part-000000.parquet").write_bytes(b"")
    (path / "notes.txt").write_text("mine")
    with pytest.raises(TraceError, match=r"it is a directory holding 'notes.txt', which optrace did not write"):
        tdist.rank_directory(str(path), 0, 2)
    assert sorted(os.listdir(path)) == ["notes.txt", "part-000000.parquet", "rank=5"]  # nothing removed
    assert os.listdir(path / "rank=5") == ["part-000000.parquet"]


def test_single_process_trace_has_no_rank_column(tmp_path):
    with Tracer(tmp_path / "t"):
        torch.ones(2) + 1
    assert "rank" not in reports.load(tmp_path / "t").columns


# --- the tables and the NCCL path, without processes ---------------------------------------------------
def test_bus_factors_and_kinds():
    assert bus_factor("all_reduce", 4) == 2 * 3 / 4
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == 3 / 4
    assert bus_factor("broadcast", 4) == 1.0
    assert collective_kind("c10d._reduce_scatter_base_.default") == "reduce_scatter"
    assert collective_kind("_c10d_functional.all_gather_into_tensor.default") == "all_gather"
    assert collective_kind("c10d.broadcast_.default") == "broadcast"


class _FakeCuda:
    """torch.cuda as CudaCompletion uses it: events record the time set for their stream."""

    times = {}  # stream -> the time (ms) an event recorded on it gets; None: not reached yet
    current = "main"

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self, stream):
            self.stream, self.at = stream, _FakeCuda.times[stream]

        def query(self):
            return self.at is not None

        def elapsed_time(self, end):
            return end.at - self.at

    @staticmethod
    def current_stream(device=None):
        return _FakeCuda.current

    @staticmethod
    def Stream(device=None):
        return "side"

    class stream:
        def __init__(self, s):
            self.s = s

        def __enter__(self):
            self.prev, _FakeCuda.current = _FakeCuda.current, self.s

        def __exit__(self, *exc):
            _FakeCuda.current = self.prev


class _FakeWork:
    def get_future(self):
        raise AssertionError("on CUDA completion comes from events, not the future")

    def wait(self):
        self.waited_on = _FakeCuda.current


def _cuda_completions(monkeypatch, side_ms):
    monkeypatch.setattr(torch, "cuda", _FakeCuda)
    monkeypatch.setattr(tcoll.CudaCompletion, "_side", {})
    monkeypatch.setattr(_FakeCuda, "times", {"main": 0.0, "side": side_ms})
    monkeypatch.setattr(tcoll, "_perf_ns", lambda: 1_000)  # the host clock after the launch
    return tcoll.Completions(FIELD["duration_ns"], FIELD["busy_ns"], ROW_WIDTH)


def _row(value):
    rows = RowBuffer()
    rows.ints.extend([value] * ROW_WIDTH)
    return rows


def test_nccl_completion_from_cuda_events(monkeypatch):
    done = _cuda_completions(monkeypatch, side_ms=2.5)  # the work completes 2.5 ms after the start event
    work = _FakeWork()
    op = tcoll.CollectiveOp(torch.ops.c10d.allreduce_.default, tcoll._C10D["allreduce_"])
    done.launched(0, 400, 1_000, op, work, [], torch.device("cuda", 0))
    assert work.waited_on == "side" and _FakeCuda.current == "main"  # the program's stream never waits
    rows = _row(0)
    done.apply(rows)
    # launched by 1,000 ns on the host, then 2.5 ms on the device; the op started at 400 ns
    assert rows.ints[FIELD["duration_ns"]] == 1_000 + 2_500_000 - 400
    assert rows.ints[FIELD["busy_ns"]] == rows.ints[FIELD["duration_ns"]]
    assert done.untimed == 0


def test_nccl_collective_not_finished_at_flush_keeps_launch_time(monkeypatch):
    done = _cuda_completions(monkeypatch, side_ms=None)  # the side stream's event has not completed
    op = tcoll.CollectiveOp(torch.ops.c10d.allreduce_.default, tcoll._C10D["allreduce_"])
    done.launched(0, 0, 10, op, _FakeWork(), [], torch.device("cuda", 0))
    rows = _row(7)
    done.apply(rows)
    assert rows.ints[FIELD["duration_ns"]] == 7 and done.untimed == 1


def test_readme_torchrun_example(examples_dir, tmp_path):
    """examples/distributed.py under torchrun prints the FLOPs and collective sizes docs/distributed.md shows."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run(
        [str(torchrun), "--nproc_per_node=2", "--master_port", str(_free_port()), str(examples_dir / "distributed.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(examples_dir.parent)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    readme = (examples_dir.parent / "docs" / "distributed.md").read_text()
    shown = re.search(r"torchrun --nproc_per_node=2 examples/distributed.py\n```\n```\n(.*?)```", readme, re.S).group(1)
    flops = [line for line in shown.splitlines() if line.startswith("ddp/rank=")]
    assert flops and all(line in done.stdout for line in flops)  # 2·N·T per rank, exactly
    sizes = lambda text: sorted(re.findall(r"^\s+\d (\w+)\s+\d+\s+(\d+)", text, re.M))  # noqa: E731
    assert sizes(done.stdout) == sizes(shown)  # the same collectives and message sizes; times differ
    assert sorted(os.listdir(tmp_path / "runs" / "ddp")) == ["rank=0", "rank=1"]


class _Future:
    def __init__(self, callbacks):
        self._callbacks = callbacks

    def then(self, callback):  # c10d keeps the C++ future, not this wrapper (the callback gets a new one)
        self._callbacks.append(lambda: callback(None))

    def done(self):
        return False


class _GlooWork:
    """A c10d work whose get_future() makes a new wrapper each call, as c10d's does (nothing keeps the tracer's)."""

    def __init__(self):
        self.callbacks = []

    def get_future(self):
        return _Future(self.callbacks)


def test_a_gloo_collective_whose_callback_runs_late_is_timed(monkeypatch):
    """The program waited for the work and went on before the work's Future ran the tracer's callback (it needs the
    GIL); the flush finds no end and no Future to ask: it waits a moment for the callback (tracer's DROPPED_WAIT_S),
    which here runs at the first sleep."""
    work = _GlooWork()
    slept = []

    def sleep(seconds):  # the callback's thread takes the GIL while the flush sleeps
        slept.append(seconds)
        for callback in work.callbacks:
            callback()

    monkeypatch.setattr(tcoll, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    monkeypatch.setattr(tcoll, "_perf_ns", lambda: 5_000)  # when the callback runs
    done = tcoll.Completions(FIELD["duration_ns"], FIELD["busy_ns"], ROW_WIDTH)
    op = tcoll.CollectiveOp(torch.ops.c10d.allreduce_.default, tcoll._C10D["allreduce_"])
    done.launched(0, 100, 200, op, work, [], None)
    rows = _row(7)  # 7: the launch's duration, kept when no end is found
    done.apply(rows)
    assert slept and done.untimed == 0  # before: counted untimed, the row left at its launch's 7 ns
    assert rows.ints[FIELD["duration_ns"]] == rows.ints[FIELD["busy_ns"]] == 5_000 - 100
