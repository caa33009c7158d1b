"""One rank stands for its job: a rank of a simulated FSDP2 job (torch's fake process group and
FakeTensorMode) reports its world size, the ranks present and what its collectives send and receive.

Model: 4 bias-free Linear(64, 64) layers, fp32, each its own FSDP2 unit: 64 * 64 * 4 = 16,384 bytes
of parameters per layer, 65,536 in all. Per step, FSDP2 all-gathers each layer in the forward and
again in the backward (8 all-gathers of 16,384 bytes: the message S is the full array) and
reduce-scatters each layer's gradient once (4 of 16,384 bytes)."""

import json

import pytest
import torch
import torch.distributed as dist

import reports
from reports.distributed.collectives import per_step_traffic, traffic
from reports.loading.load import ranks_present
from reports.output.cli import main
from tracer import Tracer

LAYER_BYTES = 64 * 64 * 4  # 16,384


def simulate(path, world, steps=2):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        with FakeTensorMode():
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(4)])
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            x = torch.randn(8, 64)
            with Tracer(path, model=model, tokens=8):
                for _ in range(steps):
                    model(x).sum().backward()
                    opt.step()
                    opt.zero_grad()
    finally:
        dist.destroy_process_group()
    return str(path)


@pytest.mark.parametrize("world", [8, 64])
def test_one_rank_gives_per_step_traffic_by_algorithm(tmp_path, world):
    path = simulate(tmp_path / "job", world)
    table = per_step_traffic(reports.load(path)).set_index("collective")
    ag, rs = table.loc["all_gather"], table.loc["reduce_scatter"]
    assert (ag["group_size"], rs["group_size"]) == (world, world)
    assert (ag["calls_per_step"], rs["calls_per_step"]) == (8, 4)
    assert ag["message_bytes_per_step"] == 8 * LAYER_BYTES  # 131,072
    assert rs["message_bytes_per_step"] == 4 * LAYER_BYTES  # 65,536
    # a ring all-gather or reduce-scatter moves (W - 1) / W of the message each way
    assert (
        ag["sent_bytes_per_step"] == ag["received_bytes_per_step"] == 8 * LAYER_BYTES * (world - 1) / world
    )  # W=8: 114,688
    assert (
        rs["sent_bytes_per_step"] == rs["received_bytes_per_step"] == 4 * LAYER_BYTES * (world - 1) / world
    )  # W=8: 57,344


def test_report_text_and_json_of_a_single_simulated_rank(tmp_path, capsys):
    path = simulate(tmp_path / "job", 8)
    assert ranks_present(path) == 1 and ranks_present(tmp_path / "job" / "rank=0") == 1
    assert main(["report", path]) == 0
    text = capsys.readouterr().out
    assert "Distributed: rank 0 of world size 8 (backend fake; 1 of 8 ranks present in the trace)" in text
    assert "all_gather 0 (8)     8 128 KiB 112 KiB  112 KiB" in text
    assert "a fake process group moves no data" in text and "busbw" not in text
    assert main(["report", path, "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["distributed"]
    assert (job["world_size"], job["ranks_present"], job["fake_process_group"]) == (8, 1, True)
    by_kind = {c["collective"]: c for c in job["collectives"]}
    assert by_kind["reduce_scatter"]["sent_bytes_per_step"] == 57344  # 4 * 16,384 * 7 / 8


def test_a_trace_of_no_process_group_has_no_distributed_section(tmp_path, capsys):
    model = torch.nn.Linear(4, 4)
    with Tracer(tmp_path / "t", model=model, tokens=2):
        model(torch.randn(2, 4)).sum().backward()
    assert main(["report", str(tmp_path / "t"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["distributed"] is None
    assert ranks_present(tmp_path / "t") == 0


@pytest.mark.parametrize(
    "kind, n, expected",
    [
        ("all_reduce", 4, (1.5, 1.5)),  # 2 * 3 / 4
        ("all_gather", 4, (0.75, 0.75)),  # 3 / 4
        ("broadcast", 4, (1.0, 1.0)),
        ("broadcast", 1, (0.0, 0.0)),  # alone: nothing moves
        ("send", 2, (1.0, 0.0)),
        ("recv", 2, (0.0, 1.0)),
        ("barrier", 8, (0.0, 0.0)),
    ],
)
def test_traffic_factors(kind, n, expected):
    assert traffic(kind, n) == expected


def test_fsdp2_rank_n_is_the_whole_model_and_its_optimizer_updates_its_shard(tmp_path):
    path = simulate(tmp_path / "job", 8)
    df = reports.load(path)
    t = reports.breakdown(df).set_index("phase")
    # N = 4 layers of 64 * 64 = 16,384 whole parameters: FSDP2 gathers them for the forward, so this rank multiplies all
    assert (t.loc["total", "n_params"], t.loc["total", "n_rank"]) == (16384, 16384)
    assert t.loc["forward", "weight_matmul_flops"] == 2 * 16384 * 8  # 262,144
    # the rank holds 16,384 / 8 = 2,048 parameters; AdamW's foreach ops count 8 FLOPs per element, plus 4 step counters
    assert t.loc["optimizer", "flops"] == 8 * 2048 + 4 == 16388
    line = next(x for x in reports.explain(df) if x.startswith("Optimizer"))
    assert "8.0 per parameter over the 2,048 parameters its steps updated" in line
    meta = df.attrs["runs"][next(iter(df.attrs["runs"]))]
    assert meta["device"] == {"type": "cpu", "name": "cpu (FakeTensorMode: no device ran the ops)", "fake": True}


def test_tensor_parallel_rank_n_is_the_whole_model_with_its_shard_beside_it(tmp_path, capsys):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = torch.nn.Linear(64, 256, bias=False), torch.nn.Linear(256, 64, bias=False)

        def forward(self, x):
            return self.proj(torch.relu(self.fc(x)))

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        with FakeTensorMode():
            model = MLP()
            parallelize_module(model, mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
            x = torch.randn(8, 64)
            with Tracer(tmp_path / "tp", model=model, tokens=8):
                model(x).sum().backward()
                opt.step()
    finally:
        dist.destroy_process_group()
    df = reports.load(tmp_path / "tp")
    t = reports.breakdown(df).set_index("phase")
    # whole model: fc 256 * 64 + proj 64 * 256 = 32,768; each of 4 ranks multiplies its quarter: 8,192
    assert (t.loc["total", "n_params"], t.loc["total", "n_rank"]) == (32768, 8192)
    assert t.loc["forward", "expected_flops"] == t.loc["forward", "weight_matmul_flops"] == 2 * 8192 * 8  # 131,072
    text = reports.explain(df)
    assert any(
        "Tensor parallelism: the model has N = 32,768 parameters" in x and "N = 8,192 (0.25 of the model)" in x
        for x in text
    )
    assert main(["report", str(tmp_path / "tp"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["params"], summary["n_rank"]) == (32768, 8192)


def test_a_late_metadata_update_keeps_the_count_of_untimed_collectives(tmp_path, capsys):
    import os
    import warnings

    from tracer import read_metadata

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with Tracer(str(tmp_path / "t")) as tracer:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # reduce_scatter_tensor's deprecation
                dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4))  # gloo: a work of no future, untimed
    finally:
        dist.destroy_process_group()
    rank = os.path.join(tmp_path, "t", "rank=0")
    assert read_metadata(rank)["collectives_untimed"] == 1  # the one reduce-scatter
    tracer.set_step_time(0.5)  # one more part, the newest, carrying the updated metadata
    assert read_metadata(rank)["collectives_untimed"] == 1
    assert main(["report", str(tmp_path / "t"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["distributed"]["collectives_untimed"] == 1
