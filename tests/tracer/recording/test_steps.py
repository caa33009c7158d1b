"""A step is one iteration of the training loop, whatever the optimizer machinery does inside it.

Each loop below runs for several iterations under the Tracer and must give exactly as
many steps, with the per-step figures of one iteration (reports.per_step, breakdown):
a GradScaler that skips an overflowed step, an optimizer that steps another (a
wrapper, ZeroRedundancyOptimizer), a Lookahead-style wrapper updating slow weights
after its inner step, an optimizer step compiled before the trace, `model.compile()`,
a hand-written SGD update, and a loop no rule can split (the report says so).

The model: Linear(16, 32) -> ReLU -> Linear(32, 16), no biases: N = 16·32 + 32·16 =
1,024 weights; T = 8 rows. Per iteration: forward 2·N·T = 2·1024·8 = 16,384 FLOPs of
weight matmuls; backward dW2 + dH + dW1 = 3 · 2·8·16·32 = 24,576 (the input needs no
gradient: no dX for the first layer); SGD(foreach=True): one _foreach_add_ of 1 FLOP
per weight element = 1,024.
"""

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer
from torch.utils._python_dispatch import _disable_current_modes

import reports
from reports.output.cli import main
from reports.steps import count_steps
from tests.helpers import unwrapped
from tracer import Tracer, read_metadata
from tracer.recording.steps import Steps

D, H, T = 16, 32, 8
N = D * H + H * D  # 1,024
FWD = 2 * N * T  # 2·1024·8 = 16,384
BWD = 3 * 2 * T * D * H  # 3 · 2·8·16·32 = 24,576
SGD = N  # one _foreach_add_ (or sub_) of 1 FLOP per weight element = 1,024
MATMULS = ("aten.mm.default", "aten.addmm.default")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, D, bias=False))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, foreach=True)


def trace(tmp_path, name, run, model, iters):
    path = tmp_path / name
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # optrace warns about nothing here
        with Tracer(path, model=model, tokens=T) as tr:
            for i in range(iters):
                run(i, tr)
    df = reports.load(path)
    return df, read_metadata(path)


def by_step(df, mask, steps):
    """Per step: the FLOPs of the rows in `mask`."""
    return df[mask].groupby("step")["flops"].sum().reindex(range(steps), fill_value=0).tolist()


def figures(df, steps):
    """(forward weight matmuls, backward matmuls, optimizer) FLOPs per step."""
    mm, phase = df["op"].isin(MATMULS), df["phase"]
    assert sorted(df["step"].unique()) == list(range(steps)) and count_steps(df) == steps
    return (
        by_step(df, mm & (phase == "forward"), steps),
        by_step(df, mm & (phase == "backward"), steps),
        by_step(df, phase == "optimizer", steps),
    )


# the loops -------------------------------------------------------------------------------
class Wrap(Optimizer):
    """An optimizer whose step() steps another."""

    def __init__(self, inner):
        super().__init__(inner.param_groups[0]["params"], {})
        self.inner = inner

    def step(self, closure=None):
        self.inner.step()


class Lookahead(Optimizer):
    """Lookahead-style: after the inner step, slow weights move towards the fast ones and the
    fast ones are reset to them: _foreach_lerp_ 1 FLOP per element (1,024), _foreach_copy_ 0."""

    def __init__(self, inner):
        params = inner.param_groups[0]["params"]
        super().__init__(params, {})
        self.inner = inner
        self.slow = [p.detach().clone() for p in params]

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        params = self.param_groups[0]["params"]
        torch._foreach_lerp_(self.slow, params, 0.5)
        torch._foreach_copy_(params, self.slow)


class PlainLookahead:
    """The same, as a plain class (like an Optimizer subclass that never calls Optimizer.__init__):
    no step hooks of its own, so only its inner step is seen."""

    def __init__(self, inner):
        self.inner = inner
        self.params = inner.param_groups[0]["params"]
        self.slow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def step(self):
        self.inner.step()
        torch._foreach_lerp_(self.slow, self.params, 0.5)
        torch._foreach_copy_(self.params, self.slow)

    def zero_grad(self):
        self.inner.zero_grad()


class UninitLookahead(Optimizer):
    """Lookahead as timm.optim.Lookahead writes it: an Optimizer subclass that never calls Optimizer.__init__
    (its step gets the step hooks only when the inherited zero_grad patches the class), the inner step first,
    then the slow weights every k steps: slow += (fast - slow) * alpha (sub 1 + add_ 1 FLOP per element,
    2 * 1,024 = 2,048) and fast <- slow (copy_, 0)."""

    def __init__(self, inner, alpha=0.5, k=1):
        self._base_optimizer = inner
        self.param_groups = inner.param_groups
        self.defaults = inner.defaults
        self.state = {}
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}
        for group in self.param_groups:
            group.setdefault("lookahead_alpha", alpha)
            group.setdefault("lookahead_k", k)
            group.setdefault("lookahead_step", 0)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._base_optimizer.step(closure)
        for group in self.param_groups:
            group["lookahead_step"] += 1
            if group["lookahead_step"] % group["lookahead_k"] == 0:
                for fast in group["params"]:
                    state = self._base_optimizer.state[fast]
                    if "slow" not in state:
                        state["slow"] = torch.empty_like(fast)
                        state["slow"].copy_(fast)
                    state["slow"].add_(fast - state["slow"], alpha=group["lookahead_alpha"])
                    fast.copy_(state["slow"])
        return loss


def scaler_loop(skip_at):
    """torch.amp.GradScaler on the CPU; the loss of iteration `skip_at` is scaled to inf, so
    scaler.step skips optimizer.step() there (only scaler.update's _amp_update_scale_ runs)."""
    model = mlp()
    opt = sgd(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = batch()

    def run(i, tr):
        factor = torch.tensor(math.inf if i == skip_at else 1.0)
        scaler.scale(F.mse_loss(model(x), y) * factor).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    return model, run


def wrapped_loop(wrapper):
    model = mlp()
    opt = wrapper(sgd(model.parameters()))
    x, y = batch()

    def run(i, tr):
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return model, run


def manual_sgd_loop():
    """No optimizer: p -= lr * p.grad under no_grad, then p.grad = None."""
    model = mlp()
    x, y = batch()

    def run(i, tr):
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None

    return model, run


def rebinding_loop():
    """No optimizer and no in-place write: the update rebinds p.data, so no rule sees an iteration end."""
    model = mlp()
    x, y = batch()

    def run(i, tr):
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            p.data = p.data - 0.01 * p.grad
            p.grad = None

    return model, run


def compiled_model_loop():
    model = mlp()
    model.compile(backend="eager")
    opt = sgd(model.parameters())
    x, y = batch()

    def run(i, tr):
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return model, run


# the tests -------------------------------------------------------------------------------
def test_a_skipped_grad_scaler_step_is_still_a_step(tmp_path):
    model, run = scaler_loop(skip_at=2)
    df, meta = trace(tmp_path, "scaler", run, model, 4)
    fwd, bwd, opt = figures(df, 4)  # 4 iterations, 4 steps (they were 3)
    assert fwd == [FWD] * 4 and bwd == [BWD] * 4
    assert opt == [SGD, SGD, 0, SGD]  # the overflowed iteration ran no optimizer step
    update = df[df["op"] == "aten._amp_update_scale_.default"]
    assert update.groupby("step").size().tolist() == [1] * 4 and set(update["phase"]) == {"other"}
    assert meta["cycles_without_step"] == 0 and meta["untraced_optimizer_steps"] == 0


@pytest.mark.parametrize("wrapper", [Wrap, Lookahead])
def test_an_optimizer_stepping_another_is_one_step(tmp_path, wrapper):
    model, run = wrapped_loop(wrapper)
    df, meta = trace(tmp_path, wrapper.__name__, run, model, 3)
    fwd, bwd, opt = figures(df, 3)  # 3 iterations, 3 steps (they were 5)
    assert fwd == [FWD] * 3 and bwd == [BWD] * 3
    # Wrap: the inner _foreach_add_, 1,024. Lookahead: + its _foreach_lerp_ after the inner step,
    # 1,024 more = 2,048 (that work was phase other)
    assert opt == ([SGD] * 3 if wrapper is Wrap else [2 * SGD] * 3)
    names = {"aten._foreach_add_.List", "aten._foreach_lerp_.Scalar", "aten._foreach_copy_.default"}
    assert set(df.loc[df["op"].isin(names), "phase"]) == {"optimizer"}
    assert meta["untraced_optimizer_steps"] == 0


ZERO_GRAD = {  # where the loop zeroes the gradients
    "after": lambda opt: opt.zero_grad(),
    "after_set_to_none": lambda opt: opt.zero_grad(set_to_none=True),
    "after_keep": lambda opt: opt.zero_grad(set_to_none=False),
}


@pytest.mark.parametrize("zero", ["before", *ZERO_GRAD])
def test_a_lookahead_that_never_called_optimizer_init_counts_every_iteration(tmp_path, zero):
    """4 iterations are 4 steps (they were 3 with zero_grad after the step: the wrapper's step is hooked from
    the second iteration on, and the wrapper, never seen in the first step, joined it as a GAN's second
    optimizer would), each with the same figures. Per step: forward 16,768 + backward 24,960 + SGD 1,024 + slow
    weights 2,048 = 44,800."""
    model = mlp()
    fresh = type("UninitLookahead", (UninitLookahead,), {})  # zero_grad patches the class: a new one per test
    opt = fresh(sgd(model.parameters()))
    x, y = batch()

    def run(i, tr):
        if zero == "before":
            opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if zero != "before":
            ZERO_GRAD[zero](opt)

    df, meta = trace(tmp_path, zero, run, model, 4)
    fwd, bwd, opt_flops = figures(df, 4)
    assert fwd == [FWD] * 4 and bwd == [BWD] * 4
    # zero_grad(set_to_none=False) keeps the gradients: from the second backward on, AccumulateGrad adds into them
    # (add_, 1 FLOP per weight: 1,024 more, phase backward), as it does untraced
    accumulate = [0] + [N] * 3 if zero == "after_keep" else [0] * 4
    totals = [44_800 + extra for extra in accumulate]  # 16,768 + 24,960 + 1,024 + 2,048 = 44,800
    assert df.groupby("step")["flops"].sum().tolist() == totals
    # the wrapper's slow-weight arithmetic is optimizer work: 1,024 + 2,048 = 3,072, also in the first step, before
    # zero_grad patched the wrapper's step (its step() is found as the caller of the inner one; it was other: 1,024)
    assert opt_flops == [3 * SGD] * 4
    phases = df.groupby(["step", "phase"], observed=True)["flops"].sum()
    for step in range(4):  # forward 16,384 + ReLU 256 + mse_loss 128; backward 24,576 + 128 + 256 (+ accumulation)
        figures_of = {phase: int(flops) for phase, flops in phases[step].items() if flops}  # zero_grad's: 0
        assert figures_of == {"forward": 16_768, "backward": 24_960 + accumulate[step], "optimizer": 3_072}
    assert meta["untraced_optimizer_steps"] == 0


class RaisesOnce(Wrap):
    """A wrapper whose first step raises after its inner step: no post hook runs for it, nor for its caller."""

    raised = False

    def step(self, closure=None):
        self.inner.step()
        if not self.raised:
            self.raised = True
            raise ValueError("bad step")


def test_a_step_that_raised_is_over_and_nested_steps_still_nest(tmp_path):
    model, run = wrapped_loop(lambda opt: Wrap(RaisesOnce(opt)))  # three steps, one inside another

    def guarded(i, tr):
        try:
            run(i, tr)
        except ValueError:
            pass  # the first iteration's step raised: its gradients stay and accumulate

    df, _ = trace(tmp_path, "raised", guarded, model, 3)
    # the raised steps are over: iterations 2 and 3 begin steps of their own, with the inner SGD step in each
    fwd, bwd, opt_flops = figures(df, 3)
    assert fwd == [FWD] * 3 and bwd == [BWD] * 3 and opt_flops == [SGD] * 3


def test_a_plain_wrapper_is_seen_through_its_inner_step_and_its_parameter_writes(tmp_path):
    model, run = wrapped_loop(PlainLookahead)
    df, _ = trace(tmp_path, "plain", run, model, 3)
    fwd, bwd, opt = figures(df, 3)
    assert fwd == [FWD] * 3 and bwd == [BWD] * 3 and opt == [SGD] * 3  # the inner _foreach_add_; the copy counts 0
    assert set(df.loc[df["op"] == "aten._foreach_copy_.default", "phase"]) == {"optimizer"}  # writes the weights
    lerp = df[df["op"] == "aten._foreach_lerp_.Scalar"]  # writes the slow weights only: the documented limit
    assert set(lerp["phase"]) == {"other"} and lerp.groupby("step")["flops"].sum().tolist() == [N] * 3


def test_zero_redundancy_optimizer_is_one_step(tmp_path):
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = mlp()
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.01, foreach=True)
        x, y = batch()

        def run(i, tr):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()

        df, _ = trace(tmp_path, "zero", run, model, 3)
    finally:
        dist.destroy_process_group()
    fwd, bwd, opt_flops = figures(df, 3)  # 3 iterations, 3 steps (they were 5)
    assert fwd == [FWD] * 3 and bwd == [BWD] * 3 and opt_flops == [SGD] * 3
    # after the inner step, ZeRO broadcasts each rank's parameters (one broadcast_ per weight, of a
    # detach()ed parameter: that detach, a graph-building op, began a new step before)
    after = df[df["op"] == "c10d.broadcast_.default"]
    assert after.groupby("step").size().tolist() == [2] * 3 and set(after["phase"]) == {"optimizer"}


def test_hand_written_sgd_steps_and_its_update_is_optimizer_work(tmp_path):
    model, run = manual_sgd_loop()
    df, meta = trace(tmp_path, "manual", run, model, 4)
    fwd, bwd, opt = figures(df, 4)  # 4 iterations, 4 steps (they were 1 step at 4 x 2·N·T)
    assert fwd == [FWD] * 4 and bwd == [BWD] * 4
    assert opt == [SGD] * 4  # the sub_ writing each weight: 512 + 512 = 1,024; the lr * grad mul stays other
    assert set(df.loc[df["phase"] == "optimizer", "op"]) == {"aten.sub_.Tensor"}
    assert by_step(df, (df["phase"] == "other") & (df["op"] == "aten.mul.Tensor"), 4) == [N] * 4
    assert reports.per_step(df, mask=df["phase"] == "forward") == FWD + T * H + T * D  # + ReLU 256 + mse_loss 128
    lines = reports.explain(df)
    assert not any("Above 2·N·T" in line for line in lines)
    assert meta["cycles_without_step"] == 0


def test_an_ema_copy_that_requires_grad_is_not_optimizer_work(tmp_path):
    """An EMA made with copy.deepcopy(model) keeps requires_grad on its weights; updated in place after
    opt.step() it is not a hand-written optimizer step: an optimizer is known, so only the parameters
    it (and model=) hold are."""
    import copy

    model = mlp()
    ema = copy.deepcopy(model)
    opt = sgd(model.parameters())
    x, y = batch()

    def run(i, tr):
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.99).add_(p, alpha=0.01)

    df, _ = trace(tmp_path, "ema", run, model, 3)
    fwd, bwd, opt_flops = figures(df, 3)
    assert fwd == [FWD] * 3 and bwd == [BWD] * 3 and opt_flops == [SGD] * 3  # was 3 · 1,024 = 3,072 with the EMA's
    ema_rows = df["op"].isin(["aten.mul_.Tensor", "aten.mul_.Scalar", "aten.add_.Tensor"])
    assert by_step(df, ema_rows & (df["phase"] == "other"), 3) == [2 * N] * 3  # mul_ + add_: 2 · 1,024 = 2,048


def test_cycles_no_rule_can_split_are_said_not_explained(tmp_path, capsys):
    model, run = rebinding_loop()
    df, meta = trace(tmp_path, "rebinding", run, model, 4)
    assert set(df["step"]) == {0} and meta["cycles_without_step"] == 4
    mm = df["op"].isin(MATMULS) & (df["phase"] == "forward")
    assert reports.per_step(df, mask=mm) == 4 * FWD  # 65,536: four iterations in the one step
    lines = reports.explain(df)
    said = "4 forward/backward cycles were seen with no optimizer step: call tr.step() once per iteration"
    assert any(said in line for line in lines)
    assert not any(line.startswith(("Forward weight matmuls", "Backward weight matmuls")) for line in lines)
    main(["report", str(tmp_path / "rebinding"), "--sections", "caveats,explain"])
    text = unwrapped(capsys.readouterr().out)  # wrapped to the width
    # a caveat, and explain's line in place of its terms
    assert f"- cycles_without_step: {said}" in text and f" - {said}" in text
    assert "Above 2·N·T" not in text
    main(["report", str(tmp_path / "rebinding"), "--json"])
    assert json.loads(capsys.readouterr().out)["cycles_without_step"] == 4


def test_without_tokens_the_report_still_says_the_cycles(tmp_path, capsys):
    model, run = rebinding_loop()
    with Tracer(tmp_path / "t") as tr:  # no model=, no tokens=: no breakdown, no explain
        for i in range(3):
            run(i, tr)
    main(["report", str(tmp_path / "t")])
    said = "- cycles_without_step: 3 forward/backward cycles were seen with no optimizer step"
    assert said in unwrapped(capsys.readouterr().out)


def _untraced_backend(gm, example_inputs):
    """A backend whose code bypasses the dispatcher, as compiled kernels do; counts its runs."""

    def run(*args):
        _untraced_backend.runs += 1
        with _disable_current_modes():
            return gm(*args)

    return run


def test_an_optimizer_step_compiled_before_the_trace_runs_eagerly_and_is_counted(tmp_path):
    """Compiled and run before the trace, the step used to run its compiled code under the tracer: 0 optimizer
    FLOPs, counted in `untraced_optimizer_steps`. torch.compile's stance is force_eager while tracing
    (tracer.recording.compiled EagerCompiled): the step's eager ops are traced, and it is named as a compiled region."""
    model = mlp()
    opt = sgd(model.parameters())
    x, y = batch()
    torch._dynamo.reset()
    _untraced_backend.runs = 0
    opt.step = torch.compile(opt.step, backend=_untraced_backend)
    F.mse_loss(model(x), y).backward()
    opt.step()  # compiled here, before the trace
    opt.zero_grad()
    compiled_runs = _untraced_backend.runs

    def run(i, tr):
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Dynamo: the profiler's record_function is ignored
        df, meta = trace(tmp_path, "compiled_step", run, model, 3)
    fwd, bwd, opt_flops = figures(df, 3)
    assert fwd == [FWD] * 3 and bwd == [BWD] * 3 and opt_flops == [SGD] * 3  # SGD: 1,024 per step
    assert meta["untraced_optimizer_steps"] == 0 and _untraced_backend.runs == compiled_runs
    assert meta["compiled_regions_eager"] == {"calls": 3, "names": {"SGD.step": 3}, "other_calls": 0}
    assert meta["compiled_ran_eagerly"] is True
    F.mse_loss(model(x), y).backward()
    opt.step()  # after the trace: the compiled code again
    assert _untraced_backend.runs > compiled_runs


class Untraced(torch.optim.SGD):
    """An optimizer whose update bypasses the dispatcher, as a compiled step's kernels do (no Dynamo: cheap)."""

    def step(self, closure=None):
        with _disable_current_modes():
            return super().step(closure)


def test_the_report_says_how_many_optimizer_steps_ran_untraced(tmp_path, capsys):
    model, run = wrapped_loop(lambda opt: Untraced(opt.param_groups[0]["params"], lr=0.01, foreach=True))
    df, meta = trace(tmp_path, "untraced", run, model, 2)
    assert figures(df, 2) == ([FWD] * 2, [BWD] * 2, [0] * 2) and meta["untraced_optimizer_steps"] == 2
    main(["report", str(tmp_path / "untraced")])
    assert "- untraced_optimizer_steps: 2 optimizer steps ran untraced" in unwrapped(capsys.readouterr().out)
    main(["report", str(tmp_path / "untraced"), "--json"])
    assert json.loads(capsys.readouterr().out)["untraced_optimizer_steps"] == 2


def test_an_optimizer_step_with_no_gradients_is_not_untraced(tmp_path):
    model = mlp()
    opt = sgd(model.parameters())
    with Tracer(tmp_path / "t", model=model):
        opt.step()  # no parameter has a gradient: SGD runs no op, and none was missed
    assert read_metadata(tmp_path / "t")["untraced_optimizer_steps"] == 0


def test_model_compile_in_place_runs_eagerly_and_is_said(tmp_path):
    torch._dynamo.reset()
    model, run = compiled_model_loop()
    df, meta = trace(tmp_path, "compiled_model", run, model, 3)
    eager_model, eager_run = wrapped_loop(lambda opt: opt)
    eager, eager_meta = trace(tmp_path, "eager", eager_run, eager_model, 3)
    assert figures(df, 3) == ([FWD] * 3, [BWD] * 3, [SGD] * 3)
    assert meta["compiled_ran_eagerly"] is True and "compiled_ran_eagerly" not in eager_meta
    assert df["op"].tolist() == eager["op"].tolist() and df["module"].tolist() == eager["module"].tolist()


LOOPS = {
    "wrap": lambda: wrapped_loop(Wrap),
    "lookahead": lambda: wrapped_loop(Lookahead),
    "manual_sgd": manual_sgd_loop,
    "compiled_model": compiled_model_loop,
}
FORWARD = FWD + T * H + T * D  # + ReLU 8·32 = 256 + mse_loss 8·16 = 128: 16,768
BACKWARD = BWD + T * D + T * H  # + mse_loss_backward 128 + threshold_backward 256: 24,960
BREAKDOWN = {  # breakdown's per-step FLOPs by phase
    "wrap": {"forward": FORWARD, "backward": BACKWARD, "optimizer": SGD, "total": 42_752},  # 16,768 + 24,960 + 1,024
    "lookahead": {"forward": FORWARD, "backward": BACKWARD, "optimizer": 2 * SGD, "total": 43_776},  # + lerp 1,024
    # the sub_ writing the weights is optimizer, the lr * grad mul before it other: 1,024 each
    "manual_sgd": {"forward": FORWARD, "backward": BACKWARD, "optimizer": SGD, "other": N, "total": 43_776},
    "compiled_model": {"forward": FORWARD, "backward": BACKWARD, "optimizer": SGD, "total": 42_752},
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_k_identical_iterations_give_the_per_step_figures_of_one(tmp_path, name):
    torch._dynamo.reset()
    model, run = LOOPS[name]()
    one, _ = trace(tmp_path, "one", run, model, 1)
    model, run = LOOPS[name]()
    three, _ = trace(tmp_path, "three", run, model, 3)
    assert count_steps(one) == 1 and count_steps(three) == 3
    table_one = reports.breakdown(one).set_index("phase")["flops"].to_dict()
    table_three = reports.breakdown(three).set_index("phase")["flops"].to_dict()
    assert table_one == BREAKDOWN[name] and table_three == BREAKDOWN[name]
    for phase in ("forward", "backward", "optimizer", "other"):
        mask_one, mask_three = one["phase"] == phase, three["phase"] == phase
        assert reports.per_step(three, mask=mask_three) == reports.per_step(one, mask=mask_one), phase


def test_the_matmul_figures_agree_with_flop_counter_mode():
    from torch.utils.flop_counter import FlopCounterMode

    model = mlp()
    x, y = batch()
    with FlopCounterMode(display=False) as counter:
        F.mse_loss(model(x), y).backward()
    assert counter.get_total_flops() == FWD + BWD  # 16,384 + 24,576 = 40,960: it counts the matmuls only


def test_step_counter_iteration_end_and_cycles():
    rows = []
    steps = Steps(lambda: len(rows), lambda first, step: None)
    assert steps.forward_work()  # step 0 begins
    steps.backward_began()
    steps.optimizer_start(object())
    steps.optimizer_end()
    assert not steps.iteration_end()  # the optimizer already ended the step: a no-op
    assert steps.forward_work() and steps.step == 1
    steps.backward_began()
    assert steps.iteration_end()  # no optimizer in this iteration: it ends here
    assert steps.forward_work() and steps.step == 2
    assert steps.cycles == 2 and steps.cycles_without_step() == 0
    lone = Steps(lambda: 0, lambda first, step: None)
    for _ in range(3):
        lone.forward_work()
        lone.backward_began()
        lone.backward_began()  # a second engine run with no forward work between: the same cycle
    assert lone.step == 0 and lone.cycles_without_step() == 3


def test_a_closure_s_own_work_is_other_and_its_result_passes_through(tmp_path):
    """Lightning's closure: forward, backward, then the loss copied for logging and the gradients clipped, all inside
    Optimizer.step. The closure goes to the optimizer wrapped (to tell its work from the update) and returns the
    closure's own result. Per step: clipping _foreach_norm N = 1,024 + the norm of the 2 norms 2 + add, reciprocal,
    mul, clamp 4 + _foreach_mul_ N = 1,024: 2,054 FLOPs of `other`; the update alone is `optimizer` (N = 1,024)."""
    model, (x, y) = mlp(), batch()
    opt, returned = sgd(model.parameters()), []

    def run(i, tr):
        def closure():
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            closure.logged = loss.detach().clone()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            closure.made = loss
            return loss

        returned.append(opt.step(closure) if i % 2 else opt.step(closure=closure))
        assert returned[-1] is closure.made  # the closure's own tensor, through the wrapper

    df, _ = trace(tmp_path, "closure", run, model, 3)
    forward, backward, update = figures(df, 3)
    assert forward == [FWD] * 3 and backward == [BWD] * 3 and update == [N] * 3  # 16,384; 24,576; 1,024
    assert by_step(df, df["phase"] == "other", 3) == [2054] * 3
    assert (df[df["op"] == "aten.clone.default"]["phase"] == "other").all()
    assert (df[df["phase"] == "optimizer"]["op"] == "aten._foreach_add_.List").all()
