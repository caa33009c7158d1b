"""The Meter inside distributed jobs: one Meter per rank of a real gloo group of 2 CPU processes, under DDP,
FSDP2 (`fully_shard`) and tensor parallelism (ColwiseParallel / RowwiseParallel on a 2-rank DeviceMesh).

Model: Linear(8, 16) and Linear(16, 4), no biases, fp32, SGD: N = 128 + 64 = 192 weights. Each job runs
STEPS = 7 steps of `model(x).pow(2).mean()` on a seeded batch of T rows; T grows by 2 at step NEW_SHAPE_AT = 4,
so the meter meets a new signature there and traces step 5. Under DDP rank 1's batch has one row more
than rank 0's (each rank's own FLOPs); under tensor parallelism both ranks take the same batch.

Per step with T tokens (the ops of a traced step, tests/tracer/distributed/test_parallel_training.py has the same model):
  forward   matmuls 2 * 192 * T = 384T, pow 4T, mean 4T                                  = 392T
  backward  weight gradients 2T * (8 * 16 + 16 * 4) = 384T, the second layer's input
            gradient 2T * 16 * 4 = 128T; pow's backward (pow, mul, mul) 12T, mean's div 4T  = 528T
  DDP       + 192: the gradient bucket scaled by 1 / world size (mul.out) in the backward; FSDP2 averages
            fp32 gradients in its reduce-scatter (ReduceOp.AVG): no op
  TP        each rank holds half of every weight: matmuls 192T forward, 256T backward
  optimizer SGD: one add per local weight, 192 (DDP), 96 (FSDP2, TP: the local half)
"""

import contextlib
import functools
import json
import os
import threading
import warnings

import pytest
import torch

import reports
from tests.tracer.distributed.test_distributed import spawn
from tracer import Meter, Tracer, read_metadata

WORLD = 2
STEPS = 7
NEW_SHAPE_AT = 4
KINDS = ("ddp", "fsdp", "tp")
ONE_STEP = (2, NEW_SHAPE_AT)  # steps also traced alone, by a Tracer around that step of an unmetered run
COLLECTIVES = ("c10d", "_c10d_functional")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 4, bias=False))


def _tokens(kind, rank, i):
    return (3 if i < NEW_SHAPE_AT else 5) + (rank if kind == "ddp" else 0)


def _batch(kind, rank, i):
    torch.manual_seed(100 + 10 * (0 if kind == "tp" else rank) + i)  # tensor parallelism: one batch for both ranks
    return torch.randn(_tokens(kind, rank, i), 8)


def _parallel(kind):
    model = _model()
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (WORLD,))
        model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _local(model):
    return [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in model.parameters()]


class _DispatchCount:
    """Ops, and of them collectives, that reach the tracer's dispatch mode (its per-op work: rows, and for a
    collective its completion callback)."""

    def __init__(self):
        from tracer.recording.dispatch import _TraceMode

        self.ops, self.calls, self._mode, self._original = 0, 0, _TraceMode, _TraceMode.__torch_dispatch__
        count = self

        def counted(mode, func, types, args=(), kwargs=None):
            count.ops += 1
            if getattr(func, "namespace", None) in COLLECTIVES:
                count.calls += 1
            return count._original(mode, func, types, args, kwargs)

        _TraceMode.__torch_dispatch__ = counted

    def remove(self):
        self._mode.__torch_dispatch__ = self._original


def _job(kind, root, rank, results):
    """The job of `kind` on this rank: unmetered, metered, and unmetered with a Tracer around each of ONE_STEP."""
    model, opt = _parallel(kind)
    plain = []
    for i in range(STEPS):
        loss = model(_batch(kind, rank, i)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        plain.append(loss.detach())
    plain += _local(model)

    model, opt = _parallel(kind)
    metered, figures, collectives, ops = [], [], [], []
    count = _DispatchCount()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with Meter(os.path.join(root, kind), model=model, tokens=_tokens(kind, rank, 0)) as meter:
                for i in range(STEPS):
                    before, ops_before = count.calls, count.ops
                    x = _batch(kind, rank, i)
                    loss = model(x).pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    metered.append(loss.detach())
                    collectives.append(count.calls - before)
                    ops.append(count.ops - ops_before)
                    figures.append(meter.step(tokens=x.shape[0]))
        finally:
            count.remove()
    metered += _local(model)

    for traced_at in ONE_STEP:  # the same job unmetered, a Tracer around one step
        model, opt = _parallel(kind)
        for i in range(traced_at + 1):
            x = _batch(kind, rank, i)
            path = os.path.join(root, f"{kind}_step{i}")
            with Tracer(path, model=model, tokens=x.shape[0]) if i == traced_at else contextlib.nullcontext():
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
    results[kind] = {
        "bitwise": [torch.equal(a, b) for a, b in zip(plain, metered)],
        "errors": meter.errors,
        "warnings": [str(w.message) for w in caught],
        "collectives": collectives,
        "ops": ops,
        "figures": [{k: f[k] for k in ("step", "traced", "model_flops", "hardware_flops")} for f in figures],
    }


def _rank_one_fails(root, rank, results):
    """3 plain steps metered on each rank; on rank 1 one step() comes from another thread: a meter error there."""
    model = _model()
    with Meter(os.path.join(root, "fails"), model=model, tokens=3) as meter:
        for i in range(3):
            model(_batch("plain", rank, i)).sum().backward()
            if rank == 1 and i == 2:
                worker = threading.Thread(target=meter.step)
                worker.start()
                worker.join()
            meter.step()
    results["fails_errors"] = meter.errors


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    parts = (*(functools.partial(_job, kind) for kind in KINDS), _rank_one_fails)
    return spawn(parts, str(tmp_path_factory.mktemp("meter_dist")))


def _one_step_flops(root, kind, step, rank):
    """(model, hardware) FLOPs of a Tracer around `step` alone on `rank`: forward + backward, and every FLOP."""
    table = reports.breakdown(reports.load(os.path.join(root, f"{kind}_step{step}", f"rank={rank}")))
    flops = table.set_index("phase")["flops"]
    return int(flops["forward"] + flops["backward"]), int(flops["total"])


def _table(root, kind, rank):
    table = reports.meter(os.path.join(root, kind))
    return table[table["run"] == f"{kind}/rank={rank}"].reset_index(drop=True)


# --- the program --------------------------------------------------------------------------------------
def test_metered_jobs_compute_what_they_compute_unmetered(runs):
    _, results = runs
    for kind in KINDS:
        for rank in range(WORLD):
            r = results[rank][kind]
            assert r["bitwise"] == [True] * (STEPS + 2)  # 7 losses, 2 local weights (or shards), bit for bit
            assert r["errors"] == 0 and r["warnings"] == []


# --- where the tables go ---------------------------------------------------------------------------------
def test_each_rank_writes_its_table_into_its_own_directory(runs, capsys):
    from reports.output.cli import main

    root, _ = runs
    for kind in KINDS:
        assert sorted(os.listdir(os.path.join(root, kind))) == ["rank=0", "rank=1"]  # no file of the job's own
        for rank in range(WORLD):
            meta = read_metadata(os.path.join(root, kind, f"rank={rank}"))
            assert meta["rank"] == rank and meta["complete"] is True and meta["meter"]["errors"] == 0
            assert meta["meter"]["steps"]["step"] == list(range(STEPS))
        table = reports.meter(os.path.join(root, kind))  # the job directory: one run per rank
        assert list(table["run"].unique()) == [f"{kind}/rank=0", f"{kind}/rank=1"]
        assert list(table["step"]) == list(range(STEPS)) * WORLD
    assert main(["report", os.path.join(root, "ddp")]) == 0  # the job's report is rank 0's, its Meter section too
    text = capsys.readouterr().out
    assert "Meter (rank 0): 7 steps, 4 metered untraced (medians over them), traced: step 0, 1, 5" in text


@pytest.mark.parametrize("engine", ["pandas", "sql"])
def test_the_job_report_names_a_meter_error_of_another_rank(runs, engine, capsys):
    from reports.output.cli import main

    root, results = runs
    assert (results[0]["fails_errors"], results[1]["fails_errors"]) == (0, 1)
    job = os.path.join(root, "fails")
    assert main(["report", job, "--engine", engine]) == 0
    text = capsys.readouterr().out  # the Meter section is rank 0's, as the report; rank 1's error gets a line
    assert "Meter (rank 0): 3 steps, 1 metered untraced" in text
    assert "  rank 1: 1 meter bookkeeping error(s) (its metadata `meter.errors`)" in text
    assert main(["report", job, "--engine", engine, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["meter"]["errors"] == 0  # rank 0's section
    assert [(r["rank"], r["meter_errors"]) for r in found["ranks"]] == [(0, 0), (1, 1)]


# --- FLOPs per step, per rank ---------------------------------------------------------------------------
TRACED = [True, True, False, False, False, True, False]  # the first two, and the step after the new shape
FROM_STEP = [0, 1, 1, 1, 5, 5, 5]  # step 4's FLOPs come from step 5's trace (the stored table)


def _check_flops(root, results, kind, rank, model, hardware):
    table = _table(root, kind, rank)
    assert list(table["traced"]) == TRACED and list(table["flops_from_step"]) == FROM_STEP
    assert list(table["model_flops"]) == model and list(table["hardware_flops"]) == hardware
    live = [f["model_flops"] for f in results[rank][kind]["figures"]]  # what step() returned
    assert live == model[:NEW_SHAPE_AT] + [None] + model[NEW_SHAPE_AT + 1 :]  # a new signature: unknown until traced
    for step in ONE_STEP:  # each the FLOPs of a Tracer around that step alone
        assert _one_step_flops(root, kind, step, rank) == (model[step], hardware[step])
    metered = table[~table["traced"]]
    assert (metered["mfu"] == metered["model_flops"] / metered["step_time_s"] / metered["peak_flops_per_s"]).all()
    assert table["mfu"][table["traced"]].isna().all()


def test_ddp_meter_flops_are_each_ranks_full_model_on_its_batch(runs):
    root, results = runs
    for rank in range(WORLD):
        # 392T + 528T + 192 (the bucket's 1 / world size) = 920T + 192; SGD + 192
        # rank 0: T = 3 then 5: 2952, 4792; rank 1: T = 4 then 6: 3872, 5712
        small, large = 920 * (3 + rank) + 192, 920 * (5 + rank) + 192
        assert (small, large) == ((2952, 4792), (3872, 5712))[rank]
        model = [small] * NEW_SHAPE_AT + [large] * (STEPS - NEW_SHAPE_AT)
        _check_flops(root, results, "ddp", rank, model, [f + 192 for f in model])


def test_fsdp2_meter_flops_are_ddps_matmuls_with_a_sharded_optimizer(runs):
    root, results = runs
    for rank in range(WORLD):
        # 920T: fp32 gradients are averaged by the reduce-scatter itself (ReduceOp.AVG), no op of their own;
        # T = 3: 2760, T = 5: 4600; SGD on the 96 local weights: + 96
        model = [2760] * NEW_SHAPE_AT + [4600] * (STEPS - NEW_SHAPE_AT)
        _check_flops(root, results, "fsdp", rank, model, [f + 96 for f in model])


def test_tensor_parallel_meter_flops_are_half_the_matmuls(runs):
    root, results = runs
    for rank in range(WORLD):
        # matmuls halved: 192T + 8T forward, 256T + 16T backward = 472T: T = 3: 1416, T = 5: 2360; SGD + 96
        model = [1416] * NEW_SHAPE_AT + [2360] * (STEPS - NEW_SHAPE_AT)
        _check_flops(root, results, "tp", rank, model, [f + 96 for f in model])


# --- the meter's pauses ------------------------------------------------------------------------------------
def test_untraced_steps_send_no_op_or_collective_through_the_tracer(runs):
    root, results = runs
    # per traced step: DDP one bucket all-reduce (and 2 broadcasts in step 1, where DDP rebuilds its buckets);
    # FSDP2 2 all-gathers in the forward, 2 again in the backward, 2 reduce-scatters; TP the row-parallel all-reduce
    # and its wait_tensor (a row without comm_bytes)
    expected = {"ddp": [1, 3, 0, 0, 0, 1, 0], "fsdp": [6, 6, 0, 0, 0, 6, 0], "tp": [2, 2, 0, 0, 0, 2, 0]}
    moved = {"ddp": 5, "fsdp": 18, "tp": 3}  # collective rows with comm_bytes: every collective of the traced steps
    for kind in KINDS:
        for rank in range(WORLD):
            assert results[rank][kind]["collectives"] == expected[kind]
            ops = results[rank][kind]["ops"]  # nor any other op: the untraced steps run without the tracer's mode
            assert [n > 0 for n in ops] == TRACED
            df = reports.load(os.path.join(root, kind, f"rank={rank}"))
            assert int(df["comm_bytes"].notna().sum()) == moved[kind]


def test_fsdp2_retraced_step_memory_adds_up(runs):
    root, _ = runs
    for rank in range(WORLD):
        path = os.path.join(root, "fsdp", f"rank={rank}")
        meta = read_metadata(path)
        first, last = meta["meter"]["traces"][-1]["trace_steps"]
        df = reports.load(path)
        assert (df["live_bytes"] >= 0).all()
        retraced = df[(df["step"] >= first) & (df["step"] <= last)]
        peak = retraced.loc[retraced["live_bytes"].idxmax()]
        at = reports.by_category(df, at=int(peak["seq"])).set_index("category")["bytes"]
        assert (at >= 0).all() and at.sum() == peak["live_bytes"]
        # the sharded weights 96 * 4 = 384 B, their gradients as much; Linear(8, 16) unsharded 128 * 4 = 512 B,
        # as a Tracer around that step alone finds them. Each category at its own highest: which row is the peak
        # moves with the moment gloo frees its buffers on a loaded machine (the gradients may not exist yet there)
        most = reports.by_category(df, at="max").set_index("category")["bytes"]
        alone = reports.by_category(
            reports.load(os.path.join(root, f"fsdp_step{NEW_SHAPE_AT}", f"rank={rank}")), at="max"
        ).set_index("category")["bytes"]
        for category, expected in (("parameters", 384), ("gradients", 384), ("unsharded_parameters", 512)):
            assert most[category] == alone[category] == expected, (rank, category)
