"""Reproductions from the review of the meter, plan and marker work (each xfail until fixed; reasons in the marks).

Model FLOPs per step of Net at batch B (x needs no gradient, loss = fc(x).sum()):
  forward 2·B·8·8 + sum B·8, backward dW 2·B·8·8  ->  B = 2: 528, B = 16: 4,224
"""

import os

import pytest
import torch
from torch import nn

import reports
from tracer import Tracer
from tracer.metering.meter import Meter


class DictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)

    def forward(self, batch):
        return self.fc(batch["x"]).sum()


class LoopNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)

    def forward(self, x, depth=1):
        for _ in range(depth):
            x = self.fc(x)
        return x.sum()


def _metered(path, net, calls):
    m = Meter(path, model=net, peak_flops=1e9)
    out = []
    for call in calls:
        call().backward()
        net.zero_grad(set_to_none=True)
        out.append(m.step()["model_flops"])
    m.close()
    return out


def test_meter_sees_a_shape_change_inside_a_dict_batch(tmp_path):
    torch.manual_seed(0)
    net = DictNet()
    xs = {2: torch.randn(2, 8), 16: torch.randn(16, 8)}
    got = _metered(tmp_path / "d", net, [lambda b=b: net({"x": xs[b]}) for b in (2, 2, 16, 16)])
    assert got[3] == 4224  # 2·16·64·2 + 16·8; the meter returns 528 (B = 2's)


def test_meter_sees_a_module_called_more_times(tmp_path):
    torch.manual_seed(0)
    net = LoopNet()
    x = torch.randn(2, 8)
    got = _metered(tmp_path / "l", net, [lambda k=k: net(x, depth=k) for k in (1, 1, 4, 4)])
    # depth 4: forward 4·(2·2·8·8) + sum 2·8, backward dW 4·256, dx 3·256 (x needs none) and the 4 dW summed
    # into one gradient, 3·8·8: 1024 + 16 + 1024 + 768 + 192
    assert got == [528, 528, None, 3024]  # the meter reused depth 1's 528


def test_meter_survives_a_step_boundary_before_any_work(tmp_path):
    torch.manual_seed(0)
    net = nn.Linear(8, 8, bias=False)
    m = Meter(tmp_path / "e", model=net, peak_flops=1e9)
    figures = []
    for _ in range(4):
        figures.append(m.step())  # the loop marks the boundary at the top of each iteration
        net(torch.randn(2, 8)).sum().backward()
        net.zero_grad(set_to_none=True)  # else each step's dW adds into the last: 8·8 more FLOPs
    m.close()
    assert m.errors == 0
    assert [f["traced"] for f in figures] == [True, True, False, False]  # 0: empty; 1: the second step, traced too
    assert [f["model_flops"] for f in figures] == [0, 528, 528, 528]  # 2·2·64·2 + 2·8; got None


def test_meter_mfu_of_a_conv_net_is_reports_mfu(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    m = Meter(tmp_path / "c", model=net)
    for _ in range(3):  # steps 0 and 1 traced, step 2 metered
        net(torch.randn(1, 3, 8, 8)).sum().backward()
        net.zero_grad(set_to_none=True)  # else steps 1 on add into the gradients: 4·3·3·3 + 4 = 112 FLOPs more
        f = m.step()
    m.close()
    ref = reports.mfu(reports.load(tmp_path / "c"), step_time_s=f["step_time_s"]).iloc[0]
    # out [1, 4, 6, 6]: conv 2·144·(3·3·3) = 7,776, relu, sum and relu's backward 144 each, conv dW 7,776
    assert f["model_flops"] == ref["model_flops_per_step"] == 7776 + 3 * 144 + 7776 == 15984
    assert reports.meter(tmp_path / "c")["dtype"].iloc[2] == ref["dtype"] == "float32"  # no matmul: the conv's dtype
    assert ref["mfu"] > 0 and f["mfu"] == ref["mfu"]  # the meter gave None


def test_plan_micro_batch_keeps_weight_reads_fixed(tmp_path):
    with torch.device("meta"):
        lin = nn.Linear(4096, 4096, bias=False, dtype=torch.bfloat16)
        x = torch.empty(1, 4096, dtype=torch.bfloat16)
    with Tracer(tmp_path / "m", model=lin, tokens=1):
        lin(x)
    df = reports.load(tmp_path / "m")
    for b in (1, 8, 64):
        # (33,554,432 weight bytes + b x 16,384 activation bytes) / (3.35e12 x 0.8): 12.53, 12.57, 12.91 us
        # (scaling the weight too gave 12.53, 100.21, 801.69 us)
        row = reports.plan(df, "H100", micro_batch=b).iloc[0]
        assert row["memory_bound_s"] == pytest.approx((33_554_432 + b * 16_384) / (3.35e12 * 0.8), rel=1e-9)


def test_plan_prices_a_strided_group_across_nodes(tmp_path):
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=64)
    try:
        mesh = init_device_mesh("cpu", (8, 8), mesh_dim_names=("replicate", "shard"))
        with FakeTensorMode():
            model = nn.Sequential(nn.Linear(64, 64, bias=False))
            fully_shard(model, mesh=mesh)
            with Tracer(tmp_path / "h", model=model, tokens=8):
                model(torch.randn(8, 64)).sum().backward()
    finally:
        dist.destroy_process_group()
    df = reports.load(tmp_path / "h")
    plan = reports.plan(df, "H100", overlap="none").iloc[0]
    ar = df[df["op"].astype(str).str.contains("allreduce")]
    rs = df[df["op"].astype(str).str.contains("reduce_scatter")]
    ag = df[df["op"].astype(str).str.contains("allgather")]
    assert len(ar) == 1 and len(rs) == 1 and len(ag) == 1
    # the all-reduce's 8 ranks sit on 8 nodes, one GPU each: min(450e9, 1 x 50e9) x 0.8 = 40e9 B/s, 2·7 ring steps
    # all across nodes: 8.4 + 14 x 9.6 = 142.8 us; the shard group (one node): NVLink 360e9 B/s, 8.4 + 7 x 3.4 us
    s = float(ar["comm_bytes"].iloc[0])
    want = 8.4e-6 + 14 * 9.6e-6 + s * 2 * 7 / 8 / 40e9
    for c in (rs, ag):
        want += 8.4e-6 + 7 * 3.4e-6 + float(c["comm_bytes"].iloc[0]) * 7 / 8 / 360e9
    assert plan["comm_s"] == pytest.approx(want, rel=1e-9)  # 207.4 us (120.5 us with the all-reduce inside a node)


def test_an_interrupted_marker_write_leaves_no_empty_marker(tmp_path, monkeypatch):
    """The first marker is written to a temporary renamed into place: an interrupt leaves no 0-byte
    _optrace.parquet (DuckDB refuses one) and no temporary."""
    import tracer.store.directory as directory

    def interrupted(text):
        raise KeyboardInterrupt

    monkeypatch.setattr(directory, "marker_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with Tracer(tmp_path / "t"):
            pass
    marker = tmp_path / "t" / "_optrace.parquet"
    assert not marker.exists() or os.path.getsize(marker) > 0
    assert not (tmp_path / "t" / "._optrace.parquet.tmp").exists()


def test_a_marker_temporary_left_by_a_kill_is_optraces(tmp_path):
    # a kill between writing the temporary and renaming it leaves `._optrace.parquet.tmp`: the path is
    # still optrace's to replace, and the new trace leaves no temporary behind
    path = tmp_path / "t"
    path.mkdir()
    (path / "._optrace.parquet.tmp").write_bytes(b"PAR1 cut")
    with Tracer(path):
        torch.ones(2) + 1
    assert sorted(os.listdir(path)) == ["_optrace.parquet", "part-000000.parquet"]  # the lock goes at close
    assert reports.load(path)["op"].tolist() == ["aten.ones.default", "aten.add.Tensor"]
