"""Fused optimizer steps (tracer.flops.optimizers) count what the same optimizer's foreach ops count."""

import pytest
import torch

from tests.tracer.flops.test_flops import flops_of, record
from tests.tracer.native.conftest import compiled  # noqa: F401 (the fixture)
from tests.tracer.native.test_collector import _assert_identical

aten = torch.ops.aten
SHAPES = [(3, 4), (5,)]  # 2 parameters, 12 + 5 = 17 elements


def _params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*shape)) for shape in SHAPES]


def _step_flops(cls, kwargs, path, steps=3):
    """FLOPs of each of `steps` optimizer steps, every op counted, with `path` ("fused" or "foreach") set."""
    params = _params()
    opt = cls(params, **kwargs, **{path: True})
    totals = []
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn_like(p)
        totals.append(sum(r[2] for r in record(opt.step)))
    return totals


# Each step: the fused op or the foreach ops, + 2 for the step counters' _foreach_add_ (1 per parameter, both paths).
CASES = [
    # AdamW, weight_decay 0.01: 8 passes (mul_ of the parameter, lerp_, mul_, addcmul_, sqrt, div_, add_, addcdiv_)
    # x 17 elements = 136, + 2 = 138
    (torch.optim.AdamW, {}, [138] * 3),
    (torch.optim.AdamW, {"weight_decay": 0}, [121] * 3),  # 7 x 17 + 2
    (torch.optim.Adam, {}, [121] * 3),  # Adam's weight_decay is 0: 7 x 17 + 2
    (torch.optim.Adam, {"weight_decay": 0.1}, [138] * 3),  # + the gradient's add: 8 x 17 + 2
    (torch.optim.Adam, {"amsgrad": True}, [138] * 3),  # + maximum_: 8 x 17 + 2
    (torch.optim.Adam, {"amsgrad": True, "weight_decay": 0.1, "maximize": True}, [172] * 3),  # + neg: 10 x 17 + 2
    (torch.optim.AdamW, {"amsgrad": True, "maximize": True}, [172] * 3),  # 10 x 17 + 2
    (torch.optim.SGD, {"lr": 0.1}, [17] * 3),  # add_ into the parameter: 1 x 17
    # momentum: the first step copies the gradient into the buffer (1 x 17), later ones mul_ and add_ it (3 x 17)
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, [17, 51, 51]),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}, [34, 68, 68]),  # + nesterov's add_: 2, 4 x 17
    # + neg and the weight decay's add: 4 x 17, 6 x 17
    (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1, "maximize": True},
        [68, 102, 102],
    ),
    # Adagrad: addcmul_, sqrt, add_, mul, addcdiv_: 5 x 17 + 2 = 87
    (torch.optim.Adagrad, {}, [87] * 3),
    (torch.optim.Adagrad, {"weight_decay": 0.1}, [104] * 3),  # 6 x 17 + 2
    (torch.optim.Adagrad, {"maximize": True, "weight_decay": 0.1, "lr_decay": 0.1}, [121] * 3),  # 7 x 17 + 2
]


@pytest.mark.parametrize("cls, kwargs, expected", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_a_fused_step_counts_what_its_foreach_step_counts(cls, kwargs, expected):
    assert _step_flops(cls, kwargs, "fused") == expected
    assert _step_flops(cls, kwargs, "foreach") == expected


def test_the_fused_op_alone_and_its_functional_twin():
    params = _params()
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params, fused=True)
    assert flops_of(opt.step, aten._fused_adamw_) == (8 * 17, {"foreach"})  # 8 passes x 17 elements = 136

    def functional(**flags):
        state = [[torch.zeros(*shape) for shape in SHAPES] for _ in range(2)]  # exp_avgs, exp_avg_sqs
        steps = [torch.ones(()) for _ in SHAPES]
        options = dict(lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        return lambda: aten._fused_adam(params, [p.grad for p in params], *state, [], steps, **{**options, **flags})

    assert flops_of(functional(), aten._fused_adam) == (7 * 17, {"foreach"})  # 119
    # a GradScaler's grad_scale: the fused step unscales the gradients itself, + 1 pass: 8 x 17 = 136
    assert flops_of(functional(grad_scale=torch.tensor(2.0)), aten._fused_adam) == (8 * 17, {"foreach"})


def test_both_collectors_count_a_fused_adamw_step(tmp_path, monkeypatch, compiled):  # noqa: F811
    def make():
        model = torch.nn.Linear(4, 3)  # 12 + 3 = 15 parameter elements
        opt = torch.optim.AdamW(model.parameters(), fused=True)

        def run():
            for _ in range(2):
                model(torch.ones(2, 4)).sum().backward()
                opt.step()

        return model, run

    df = _assert_identical(tmp_path, monkeypatch, make)
    fused = df[df["op"] == "aten._fused_adamw_.default"]
    assert fused["flops"].tolist() == [120, 120]  # 8 passes x 15 elements, each step


def _scaled_step_flops(path, steps=2):
    """FLOPs of each GradScaler.step of AdamW (`path` set), every op counted, gradients finite."""
    params = _params()
    opt = torch.optim.AdamW(params, **{path: True})
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))  # as scaler.scale(loss) would: makes the scale
    totals = []
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn_like(p) * 4
        totals.append(sum(r[2] for r in record(lambda: (scaler.step(opt), scaler.update()))))
    return totals


def test_under_a_grad_scaler_the_fused_step_counts_the_unscaling():
    # foreach: 1/scale 1 + unscaling the 17 gradient elements 17 + step counters 2 + 8 x 17 = 156
    assert _scaled_step_flops("foreach") == [156, 156]
    # fused: GradScaler's check with a scale of 1, 17, + 2 scalar ops + step counters 2 + the fused step, which
    # unscales too, 9 x 17 = 153, + found_inf subtracted from the step counters 2 = 176
    assert _scaled_step_flops("fused") == [176, 176]
