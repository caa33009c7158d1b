"""Loops from a review of the tracer on the training loops users write: what tests/test_loops.py
and tests/test_steps.py did not cover.

The model: Linear(16, 32) -> ReLU -> Linear(32, 16), no biases: N = 16·32 + 32·16 = 1,024
weights; T = 8 rows. Per iteration: forward weight matmuls 2·N·T = 2·1024·8 = 16,384 FLOPs;
backward dW2 + dH + dW1 = 3 · 2·8·16·32 = 24,576 (the input needs no gradient); plain
SGD(foreach=True): one _foreach_add_ of 1 FLOP per weight element = 1,024.
"""

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import reports
from tracer import Tracer, read_metadata

D, H, T = 16, 32, 8
N = D * H + H * D  # 1,024
FWD = 2 * N * T  # 2·1024·8 = 16,384
BWD = 3 * 2 * T * D * H  # 3 · 2·8·16·32 = 24,576
SGD = N  # 1,024


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, D, bias=False))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)


def detach_logging_loop(iters):
    """The loss logged with `loss.detach()` (no host sync), once between backward() and the
    optimizer step and once after it, as torchtitan logs after optimizers.step()."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    x, y = batch()
    logged = []

    def run():
        for _ in range(iters):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            logged.append(loss.detach())  # between backward() and step(): other
            opt.step()
            opt.zero_grad()
            logged.append(loss.detach())  # after the optimizer: other, in the step it follows
        return logged

    return model, run


def traced(tmp_path, name, loop):
    model, run = loop
    path = tmp_path / name
    with Tracer(path, model=model, tokens=T):
        out = run()
    return reports.load(path), out


def test_logging_a_detached_loss_is_other_and_opens_no_step(tmp_path):
    one, _ = traced(tmp_path, "one", detach_logging_loop(1))
    three, logged = traced(tmp_path, "three", detach_logging_loop(3))
    model, run = detach_logging_loop(3)
    assert all(torch.equal(a, b) for a, b in zip(run(), logged))  # the losses, bitwise, untraced
    assert read_metadata(tmp_path / "three")["complete"] is True
    detach = three[(three["op"] == "aten.detach.default") & (three["module"] == "")]
    assert set(detach["phase"]) == {"other"}
    assert detach.groupby("step").size().tolist() == [2, 2, 2]  # both logs of each iteration, in its step
    for step, rows in three.groupby("step"):  # the second log comes after the step's optimizer, in that step
        assert rows.loc[rows["op"] == "aten.detach.default", "seq"].max() > rows.loc[
            rows["phase"] == "optimizer", "seq"].max()
    # k identical iterations: every step has the ops, FLOPs and bytes of the one-iteration trace
    columns = ["op", "phase", "module", "flops", "bytes_read", "bytes_written", "bytes_allocated"]
    ref = one[columns].astype(str).values.tolist()
    for step, rows in three.groupby("step"):
        assert rows[columns].astype(str).values.tolist() == ref, step
    table = reports.by_step(three)
    assert table["flops_forward"].tolist() == [FWD + 128 + 256] * 3  # + mse_loss 8·16 = 128 + relu 8·32 = 256
    assert table["flops_optimizer"].tolist() == [SGD] * 3
    phase_bytes = three.groupby(["step", "phase"], observed=True)["bytes_read"].sum().unstack()
    # forward reads: fc1 t 2,048 + mm (x 512 + w 2,048) + relu 1,024 + its detach (saved for backward) 1,024
    # + fc2 t 2,048 + mm (h 1,024 + w 2,048) + mse_loss (512 + 512) = 12,800; the ones_like seed of
    # backward() reads the 0-d loss: + 4 = 12,804 (before the fix both detaches were forward work and the one
    # after the optimizer opened the next step: 12,808, 12,812, 12,816 over the three steps)
    assert phase_bytes["forward"].tolist() == [12_804] * 3
    assert phase_bytes["other"].tolist() == [4 + 4] * 3  # two detaches of the 0-d float32 loss
    mm = three[three["op"] == "aten.mm.default"]
    with FlopCounterMode(display=False) as counter:  # one iteration, untraced
        detach_logging_loop(1)[1]()
    assert mm.groupby("step")["flops"].sum().tolist() == [counter.get_total_flops()] * 3 == [FWD + BWD] * 3
