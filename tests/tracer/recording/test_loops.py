"""The loops people write: steps, phases, modules and per-step FLOPs, traced for several iterations.

Each pattern in PATTERNS runs a real training loop for >= 3 iterations under the
Tracer and is checked, step by step, against closed-form numbers:

  forward weight-matmul FLOPs  mm/addmm rows in phase forward with a model parameter
                               as an operand: 2·N·T per micro-batch
  backward matmul FLOPs        mm rows in phase backward, recompute excluded:
                               4·N·T, less 2·N1·T when the first layer's input needs
                               no gradient (only its dW is computed)
  recompute FLOPs              rows flagged recompute (activation checkpointing)
  optimizer FLOPs              SGD(foreach=True): one _foreach_add_ of 1 FLOP per
                               parameter element
  steps                        = iterations

The models: MLP = Linear(16, 32) -> ReLU -> Linear(32, 16), no biases:
N = 16·32 + 32·16 = 1,024 weights; T = 8 rows per micro-batch. Per micro-batch:
forward 2·N·T = 2·1024·8 = 16,384; backward dW2 + dH + dW1 = 3 · 2·8·16·32 =
24,576 = 4·N·T - 2·512·8 (x needs no gradient: no dX for fc1).
"""

import threading
import time
import warnings

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from tests import helpers
from tests.helpers import forked, unwrapped
from tracer import Tracer, read_metadata
from tracer.recording.steps import Steps

D, H, T = 16, 32, 8
FWD_MB = 2 * (D * H + H * D) * T  # 2·N·T = 2·1024·8 = 16,384 per micro-batch
BWD_MB = 3 * 2 * T * D * H  # dW2, dH, dW1: 3 · 2·8·16·32 = 24,576 per micro-batch
SGD_FLOPS = D * H + H * D  # one _foreach_add_: 1 FLOP per weight element = 1,024
MATMULS = ("aten.mm.default", "aten.addmm.default")


class MLP(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(D, H, bias=False)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(H, D, bias=False)
        self.fail = False

    def forward(self, x):
        h = self.act(self.fc1(x))
        if self.fail:
            raise ValueError("bad batch")  # after fc1 has run: fc1 and MLP are on the forward stack
        return self.fc2(h)


def batch(rows=T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, D, generator=g), torch.randn(rows, D, generator=g)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)


# the loops ---------------------------------------------------------------------------
def nanogpt_loop(iters, accum=3):
    """Gradient accumulation, a hand-made GradScaler on the CPU, clip_grad_norm_, StepLR, loss.item()."""
    model = MLP()
    opt = sgd(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    micro = [batch(seed=s) for s in range(accum)]
    scale = torch.tensor(1024.0)

    def run(tr):
        losses = []
        for _ in range(iters):
            for x, y in micro:
                loss = F.mse_loss(model(x), y) / accum
                (loss * scale).backward()
                losses.append(loss.detach())
            inv = scale.reciprocal()  # unscale the gradients
            for p in model.parameters():
                p.grad.mul_(inv)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            scale.mul_(2.0)  # the scaler's growth step
            opt.zero_grad(set_to_none=True)
            torch.stack(losses).mean().item()  # logging, after the last optimizer step too
            losses.clear()

    return model, run


class GAN(nn.Module):
    """G: Linear(8, 16), N_G = 128; D: Linear(16, 4), N_D = 64; batch 8."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.G = nn.Sequential(nn.Linear(8, 16, bias=False))
        self.D = nn.Sequential(nn.Linear(16, 4, bias=False))


def gan_loop(iters, d_first=True):
    gan = GAN()
    opt_g = torch.optim.SGD(gan.G.parameters(), lr=0.01, foreach=True)
    opt_d = torch.optim.SGD(gan.D.parameters(), lr=0.01, foreach=True)
    z, real = torch.randn(8, 8), torch.randn(8, 16)

    def d_step(fake):
        d_loss = gan.D(fake.detach()).mean() - gan.D(real).mean()
        d_loss.backward()
        opt_d.step()
        opt_d.zero_grad(set_to_none=False)  # _foreach_zero_: phase other

    def g_step(fake):
        g_loss = -gan.D(fake).mean()
        g_loss.backward()
        opt_g.step()
        opt_g.zero_grad()

    def run(tr):
        for _ in range(iters):
            fake = gan.G(z)
            if d_first:  # the DCGAN order
                d_step(fake)
                g_step(fake)
            else:
                g_step(fake)
                d_step(fake)
            opt_d.zero_grad()

    return gan, run


def distill_loop(iters):
    student, teacher = MLP(seed=0), MLP(seed=1)  # the same class
    teacher.requires_grad_(False)
    criterion = nn.MSELoss()  # an external loss module
    opt = sgd(student)
    x, _ = batch()

    def run(tr):
        for _ in range(iters):
            with torch.no_grad():
                target = teacher(x)
            criterion(student(x), target).backward()
            opt.step()
            opt.zero_grad()

    return student, run


class Checkpointed(nn.Module):
    """pre: Linear(16, 16); block: Linear(16, 32) -> ReLU -> Linear(32, 16), checkpointed.

    N = 256 + 512 + 512 = 1,280; forward 2·N·T = 20,480; backward: pre's dW only
    (2·8·16·16 = 4,096) + dW and dX of both block layers (4 · 8,192) = 36,864."""

    def __init__(self, reentrant):
        super().__init__()
        torch.manual_seed(0)
        self.pre = nn.Linear(D, D, bias=False)
        self.block = nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, D, bias=False))
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(self.block, self.pre(x), use_reentrant=self.reentrant)


def checkpoint_loop(iters, reentrant, early_stop=True):
    model = Checkpointed(reentrant)
    opt = sgd(model)
    x, y = batch()

    def run(tr):
        with set_checkpoint_early_stop(early_stop):
            for _ in range(iters):
                F.mse_loss(model(x), y).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()

    return model, run


def caught_exception_loop(iters):
    model = MLP()
    opt = sgd(model)
    x, y = batch()

    def run(tr):
        for _ in range(iters):
            model.fail = True
            try:
                model(x)  # raises after fc1: 2·8·16·32 = 8,192 forward FLOPs
            except ValueError:
                pass
            model.fail = False
            F.mse_loss(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()

    return model, run


def eval_loop(iters):
    """An evaluation pass (no_grad, 4 rows) after the first and after the last iteration."""
    model = MLP()
    opt = sgd(model)
    x, y = batch()
    x_eval, _ = batch(rows=4, seed=7)

    def evaluate():
        with torch.no_grad():
            model(x_eval).sum().item()

    def run(tr):
        for i in range(iters):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            if i in (0, iters - 1):
                evaluate()

    return model, run


def second_thread_loop(iters):
    """Another thread trains another MLP all along; it must not count."""
    model = MLP()
    opt = sgd(model)
    x, y = batch()
    stop, done = threading.Event(), []

    def other():
        m = MLP(seed=3)
        o = sgd(m)
        while not stop.is_set():
            F.mse_loss(m(x), y).backward()
            o.step()
            o.zero_grad()
            done.append(1)

    def run(tr):
        worker = threading.Thread(target=other)
        worker.start()
        try:
            for _ in range(iters):
                seen = len(done)
                F.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                while len(done) < seen + 2 and worker.is_alive():  # its hooks fired while we traced
                    time.sleep(0.001)
        finally:
            stop.set()
            worker.join()
        assert len(done) >= 2 * iters

    return model, run


def compiled_loop(iters):
    model = MLP()
    opt = sgd(model)
    x, y = batch()
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)

    def run(tr):
        with warnings.catch_warnings():  # torch warns that the global hooks also fire for the OptimizedModule
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(iters):
                F.mse_loss(compiled(x), y).backward()
                opt.step()
                opt.zero_grad()
        assert compiles == []  # Dynamo skipped every frame: a dispatch mode was active

    return model, run


def manual_step_loop(iters):
    """No optimizer: a manual update under no_grad and Tracer.step() at the end of each iteration."""
    model = MLP()
    x, y = batch()

    def run(tr):
        for _ in range(iters):
            F.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.01 * p.grad)
                    p.grad = None
            tr.step()

    return model, run


def closure_loop(iters):
    """Lightning's automatic optimisation: forward and backward in a closure that Optimizer.step calls."""
    model = MLP()
    opt = sgd(model)
    x, y = batch()

    def run(tr):
        for i in range(iters):

            def closure():
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss

            if i % 2:
                opt.step(closure)  # as LBFGS examples do
            else:
                opt.step(closure=closure)  # as Lightning does

    return model, run


def grad_scaler_loop(iters):
    """torch.amp.GradScaler on the CPU, an EMA copy of the weights updated after each step."""
    model = MLP()
    ema = [p.detach().clone() for p in model.parameters()]
    opt = sgd(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = batch()

    def run(tr):
        for _ in range(iters):
            scaler.scale(F.mse_loss(model(x), y)).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            with torch.no_grad():
                torch._foreach_lerp_(ema, list(model.parameters()), 0.01)
            opt.zero_grad()

    return model, run


# the table -----------------------------------------------------------------------------
# name: (loop, iterations, forward weight-matmul, backward matmul, recompute, optimizer) per step
GAN_FWD = 2 * 8 * 8 * 16 + 3 * 2 * 8 * 16 * 4  # G once + D three times: 2,048 + 3 · 1,024 = 5,120
# D step: dW_D for D(fake.detach()) and D(real); G step: dW_D and dX through D, dW_G: 4 · 1,024 + 2,048
GAN_BWD = 4 * 2 * 8 * 16 * 4 + 2 * 8 * 8 * 16  # 6,144
CKPT_FWD = 2 * (D * D + D * H + H * D) * T  # 2·1280·8 = 20,480
CKPT_BWD = 2 * T * D * D + 4 * 2 * T * D * H  # 4,096 + 32,768 = 36,864
CKPT_BLOCK = 2 * (2 * T * D * H) + T * H  # the block's forward: two mm of 8,192 and a ReLU of 256 = 16,640
EVAL_FWD = 2 * (D * H + H * D) * 4  # 2·N·4 rows = 8,192

PATTERNS = {
    "nanogpt": (lambda: nanogpt_loop(3), 3, [3 * FWD_MB] * 3, [3 * BWD_MB] * 3, [0] * 3, [SGD_FLOPS] * 3),
    "gan_d_first": (lambda: gan_loop(4), 4, [GAN_FWD] * 4, [GAN_BWD] * 4, [0] * 4, [128 + 64] * 4),
    "gan_g_first": (lambda: gan_loop(4, d_first=False), 4, [GAN_FWD] * 4, [GAN_BWD] * 4, [0] * 4, [192] * 4),
    "distill": (lambda: distill_loop(3), 3, [FWD_MB] * 3, [BWD_MB] * 3, [0] * 3, [SGD_FLOPS] * 3),
    "checkpoint_reentrant": (
        lambda: checkpoint_loop(3, True),
        3,
        [CKPT_FWD] * 3,
        [CKPT_BWD] * 3,
        [CKPT_BLOCK] * 3,
        [1280] * 3,
    ),
    "checkpoint_non_reentrant_full": (
        lambda: checkpoint_loop(3, False, early_stop=False),
        3,
        [CKPT_FWD] * 3,
        [CKPT_BWD] * 3,
        [CKPT_BLOCK] * 3,
        [1280] * 3,
    ),
    # early stop: the recompute ends once the last saved tensor (the ReLU output) is back: 8,192 + 256
    "checkpoint_non_reentrant": (
        lambda: checkpoint_loop(3, False),
        3,
        [CKPT_FWD] * 3,
        [CKPT_BWD] * 3,
        [2 * T * D * H + T * H] * 3,
        [1280] * 3,
    ),
    # the failed forward ran fc1: + 2·8·16·32 = 8,192 forward FLOPs per step
    "caught_exception": (
        lambda: caught_exception_loop(3),
        3,
        [FWD_MB + 2 * T * D * H] * 3,
        [BWD_MB] * 3,
        [0] * 3,
        [SGD_FLOPS] * 3,
    ),
    # documented exception: an evaluation pass is forward work of the step it runs in; the first
    # opens step 1, the last joins step 2 (no backward, no optimizer after it)
    "eval_midway": (
        lambda: eval_loop(3),
        3,
        [FWD_MB, FWD_MB + EVAL_FWD, FWD_MB + EVAL_FWD],
        [BWD_MB] * 3,
        [0] * 3,
        [SGD_FLOPS] * 3,
    ),
    "second_thread": (lambda: second_thread_loop(3), 3, [FWD_MB] * 3, [BWD_MB] * 3, [0] * 3, [SGD_FLOPS] * 3),
    "compiled": (lambda: compiled_loop(3), 3, [FWD_MB] * 3, [BWD_MB] * 3, [0] * 3, [SGD_FLOPS] * 3),
    # the manual update's sub_ writes each weight after the backward: phase optimizer, 1 FLOP per element
    "manual_step": (lambda: manual_step_loop(3), 3, [FWD_MB] * 3, [BWD_MB] * 3, [0] * 3, [SGD_FLOPS] * 3),
    "closure": (lambda: closure_loop(3), 3, [FWD_MB] * 3, [BWD_MB] * 3, [0] * 3, [SGD_FLOPS] * 3),
    "grad_scaler": (lambda: grad_scaler_loop(3), 3, [FWD_MB] * 3, [BWD_MB] * 3, [0] * 3, [SGD_FLOPS] * 3),
}


def run_pattern(tmp_path, name, **tracer_kwargs):
    make, *_ = PATTERNS[name]
    model, run = make()
    path = tmp_path / f"{name}.parquet"
    with Tracer(path, model=model, **tracer_kwargs) as tr:
        run(tr)
    return pd.read_parquet(path), read_metadata(path)


def per_step(df, mask, steps):
    return df[mask].groupby("step")["flops"].sum().reindex(range(steps), fill_value=0).tolist()


def weight_operand(df, meta):
    params = {p["storage_id"] for p in meta["parameters"].values()}
    return df["input_storage_ids"].map(lambda ids: bool(params.intersection(ids)))


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loops")
    return {name: run_pattern(tmp, name) for name in PATTERNS}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_per_step_closed_form(traces, name):
    _, steps, fwd, bwd, recompute, opt = PATTERNS[name]
    df, meta = traces[name]
    assert sorted(df["step"].unique()) == list(range(steps))
    phase, rec = df["phase"], df["recompute"]
    matmul = df["op"].isin(MATMULS)
    assert per_step(df, (phase == "forward") & matmul & weight_operand(df, meta), steps) == fwd
    assert per_step(df, (phase == "backward") & matmul & ~rec, steps) == bwd
    assert per_step(df, rec, steps) == recompute
    assert per_step(df, phase == "optimizer", steps) == opt
    assert (phase[rec] == "backward").all()
    assert not (df["phase"] == "optimizer").any() or set(df.loc[phase == "optimizer", "module"]) == {""}


LOSS_OPS = {  # per step: the loss ops outside any module, all forward (defect 2: micro-batches 2..k)
    "nanogpt": {"aten.mse_loss.default": 3, "aten.div.Tensor": 3},
    "gan_d_first": {"aten.mean.default": 3, "aten.sub.Tensor": 1, "aten.neg.default": 1},
    "checkpoint_reentrant": {"aten.mse_loss.default": 1},
    "manual_step": {"aten.mse_loss.default": 1},
    "closure": {"aten.mse_loss.default": 1},
}


@pytest.mark.parametrize("name", list(LOSS_OPS))
def test_loss_ops_of_every_micro_batch_are_forward(traces, name):
    df, _ = traces[name]
    steps = PATTERNS[name][1]
    for op, count in LOSS_OPS[name].items():
        rows = df[(df["op"] == op) & (df["module"] == "") & (df["phase"] != "backward")]
        assert set(rows["phase"]) == {"forward"}, op
        assert rows.groupby("step").size().tolist() == [count] * steps, op


def test_after_the_optimizer_is_other_in_the_step_it_follows(traces):
    df, _ = traces["nanogpt"]
    # per step: the unscale (reciprocal, 2 mul_), clip_grad_norm_ (its own reciprocal and stack), the
    # scaler's growth after the optimizer (1 mul_) and logging (stack, .item())
    for op, count in [
        ("aten.reciprocal.default", 2),
        ("aten.mul_.Tensor", 3),
        ("aten.stack.default", 2),
        ("aten._local_scalar_dense.default", 1),
    ]:
        rows = df[df["op"] == op]
        assert set(rows["phase"]) == {"other"}, op
        assert rows.groupby("step").size().tolist() == [count] * 3, op
    scaled = df[(df["op"] == "aten.mul.Tensor") & (df["phase"] == "forward")]  # loss * scale, per micro-batch
    assert scaled.groupby("step").size().tolist() == [3] * 3 and set(scaled["module"]) == {""}
    for step, rows in df.groupby("step"):  # the growth comes after the step's optimizer, in that step
        last_mul = rows.loc[rows["op"] == "aten.mul_.Tensor", "seq"].max()
        assert last_mul > rows.loc[rows["phase"] == "optimizer", "seq"].max()
    # the logging after the last optimizer step opened no step: the trace ends with it, in step 2
    assert df.iloc[-1]["op"] == "aten._local_scalar_dense.default" and df.iloc[-1]["step"] == 2
    gan, _ = traces["gan_d_first"]  # zero_grad(set_to_none=False) after opt_d.step()
    zero = gan[gan["op"] == "aten._foreach_zero_.default"]
    assert set(zero["phase"]) == {"other"} and zero.groupby("step").size().tolist() == [1] * 4


def test_grad_scaler_and_ema_are_other_in_the_step_they_follow(traces):
    df, _ = traces["grad_scaler"]
    for op in (
        "aten._amp_foreach_non_finite_check_and_unscale_.default",
        "aten._amp_update_scale_.default",
        "aten._foreach_lerp_.Scalar",
    ):
        rows = df[df["op"] == op]
        assert set(rows["phase"]) == {"other"} and rows.groupby("step").size().tolist() == [1] * 3, op


def test_readme_loop_logging_the_loss_is_one_step(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(256, 64, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(1024, 256)
    with Tracer(tmp_path / "lin.parquet", model=model, tokens=1024):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        loss.item()  # how most loops log the loss
    df = pd.read_parquet(tmp_path / "lin.parquet")
    assert set(df["step"]) == {0}
    fwd = df[(df["phase"] == "forward") & (df["op"] == "aten.mm.default")]["flops"].sum()
    assert fwd == 2 * 256 * 64 * 1024  # 2·N·T = 33,554,432


IDENTICAL = {
    "nanogpt": nanogpt_loop,
    "gan_d_first": gan_loop,
    "distill": distill_loop,
    "checkpoint_reentrant": lambda iters: checkpoint_loop(iters, True),
    "checkpoint_non_reentrant": lambda iters: checkpoint_loop(iters, False),
    "closure": closure_loop,
}  # not grad_scaler: GradScaler allocates its scale and growth tracker (2 x 4 bytes) at its first use


@pytest.mark.parametrize("name", list(IDENTICAL))
def test_k_identical_steps_are_k_times_one_step(tmp_path, name):
    one, _ = run_named(tmp_path, "one", IDENTICAL[name](1))
    three, _ = run_named(tmp_path, "three", IDENTICAL[name](3))
    for column in ("flops", "bytes_allocated", "bytes_read", "bytes_written"):
        base = one.groupby(["phase", "recompute"], observed=True)[column].sum()
        table = three.groupby(["step", "phase", "recompute"], observed=True)[column].sum()
        for step in range(3):
            assert table.loc[step].to_dict() == base.to_dict(), (column, step)
        total = three.groupby(["phase", "recompute"], observed=True)[column].sum()
        assert total.to_dict() == (3 * base).to_dict(), column
    assert len(three) == 3 * len(one)


def run_named(tmp_path, name, loop, **kwargs):
    model, run = loop
    with Tracer(tmp_path / name, model=model, **kwargs) as tr:
        run(tr)
    return pd.read_parquet(tmp_path / name), read_metadata(tmp_path / name)


def test_two_optimizers_are_one_step_also_across_flushes(tmp_path):
    # parts of 16 rows, an iteration 49: the generator's half (21 rows) always spans a flush, so
    # each tentative step is settled before its optimizer runs, by what happened last time. The
    # first time nothing happened yet: iteration 1 is two steps; its optimizer teaches the rest.
    df, _ = run_named(tmp_path, "gan", gan_loop(4), flush_rows=16)
    table = df.groupby("step").agg(rows=("op", "size"), optimizer=("phase", lambda p: int((p == "optimizer").sum())))
    assert table["rows"].tolist() == [28, 21, 49, 49, 49]
    assert table["optimizer"].tolist() == [1, 1, 2, 2, 2]
    whole, _ = run_named(tmp_path, "gan_one_part", gan_loop(4))  # one part: exact
    assert whole.groupby("step").size().tolist() == [49] * 4


def test_step_counter_joins_and_settles():
    rows, moved = [0], []
    steps = Steps(lambda: rows[0], lambda first, step: moved.append((first, step)))
    d, g = object(), object()
    assert steps.forward_work() and steps.step == 0  # step 0 begins
    steps.optimizer_start(d), steps.optimizer_end()
    rows[0] = 10
    assert steps.forward_work() and steps.step == 1  # tentative: D stepped in the step before
    steps.optimizer_start(g)  # G did not: one step
    assert steps.step == 0 and moved == [(10, 0)]
    steps.optimizer_end()
    rows[0] = 20
    steps.forward_work()
    steps.optimizer_start(d)  # D already stepped in step 0: a new step
    assert steps.step == 1 and moved == [(10, 0)]
    steps.optimizer_end()
    rows[0] = 30
    steps.forward_work()
    steps.optimizer_start(g), steps.optimizer_end()  # joins again
    assert steps.step == 1 and moved[-1] == (30, 1)
    rows[0] = 40
    steps.forward_work()
    steps.settle()  # a flush before the next optimizer: {D, G} stood last time
    assert steps.step == 2 and len(moved) == 2
    steps.optimizer_start(d), steps.optimizer_end()
    rows[0] = 50
    steps.forward_work()
    steps.settle()  # {D} was joined last time
    assert steps.step == 2 and moved[-1] == (50, 2)
    steps.mark()  # Tracer.step(): the next step never joins
    steps.forward_work()
    steps.optimizer_start(g)
    assert steps.step == 3


def test_trailing_evaluation_joins_a_cut_step_stands(tmp_path):
    model = MLP()
    opt = sgd(model)
    x, y = batch()

    def step():
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    with Tracer(tmp_path / "cut", model=model):
        step()
        model(x)  # the next step's forward, cut: grad mode on
    assert sorted(pd.read_parquet(tmp_path / "cut")["step"].unique()) == [0, 1]
    with Tracer(tmp_path / "weight_log", model=model):
        step()
        model.fc1.weight.norm().item()  # logging that builds a graph, outside any module
    assert set(pd.read_parquet(tmp_path / "weight_log")["step"]) == {0}


def test_distillation_names_the_teacher_apart(traces):
    df, meta = traces["distill"]
    fwd_mm = df[(df["phase"] == "forward") & df["op"].isin(MATMULS)]
    assert fwd_mm["module"].tolist()[:4] == ["MLP#1.fc1", "MLP#1.fc2", "fc1", "fc2"]  # teacher first
    teacher = df[df["module"].str.startswith("MLP#1")]
    assert per_step(teacher, teacher["op"].isin(MATMULS), 3) == [FWD_MB] * 3  # 2·N·T of the teacher
    assert set(df.loc[df["op"] == "aten.mse_loss.default", "module"]) == {"MSELoss#1"}
    # the roots run no op of their own
    assert set(df["module"]) == {"fc1", "act", "fc2", "MLP#1.fc1", "MLP#1.act", "MLP#1.fc2", "MSELoss#1", ""}
    assert meta["params"]["total"] == 1024  # the student only
    external = set(meta["storage_roles"]["external_parameter"])
    assert len(external) == 2  # the teacher's two weights
    student = {p["storage_id"] for p in meta["parameters"].values()}
    assert not external & student
    assert external == set(teacher.loc[teacher["op"] == "aten.t.default", "input_storage_ids"].explode())


def test_recompute_rows_are_attributed_to_the_module_re_run(traces):
    for name in ("checkpoint_reentrant", "checkpoint_non_reentrant_full"):
        df, _ = traces[name]
        rec = df[df["recompute"]]
        assert set(rec["module"]) == {"block.0", "block.1", "block.2"}, name
        assert (rec["step"].value_counts().sort_index() > 0).all()
        fwd_block = df[(df["phase"] == "forward") & df["module"].str.startswith("block.")]
        assert per_step(df, df["recompute"], 3) == per_step(fwd_block, fwd_block["flops"] >= 0, 3)  # 16,640
    df, _ = traces["checkpoint_non_reentrant"]
    rec = df[df["recompute"]]
    assert rec.loc[rec["op"] == "aten.mm.default", "module"].tolist() == ["block.0"] * 3  # stopped before block.2's mm
    assert rec.loc[rec["op"] == "aten.relu.default", "module"].tolist() == ["block.1"] * 3


def test_checkpoint_and_caught_exception_leave_no_stale_module(traces):
    for name in ("checkpoint_non_reentrant", "caught_exception"):
        df, _ = traces[name]
        after = df[df["op"].isin(["aten._foreach_norm.Scalar", "aten._foreach_mul_.Tensor"])]  # clip_grad_norm_
        assert set(after["phase"]) == {"other"} and set(after["module"]) == {""}, name
        opt = df[df["phase"] == "optimizer"]
        assert set(opt["module"]) == {""}, name
    df, _ = traces["caught_exception"]
    failed = df[(df["phase"] == "forward") & (df["op"] == "aten.mm.default")]
    assert failed["module"].tolist()[:3] == ["fc1", "fc1", "fc2"]  # the failed call ran fc1 only


def test_second_thread_changes_nothing(traces, tmp_path):
    df, _ = traces["second_thread"]
    alone, _ = run_named(tmp_path, "alone", second_thread_free_loop(3))
    assert set(df["module"]) == {"fc1", "act", "fc2", ""}
    assert df["op"].tolist() == alone["op"].tolist()
    assert df["step"].tolist() == alone["step"].tolist()


def second_thread_free_loop(iters):
    model = MLP()
    opt = sgd(model)
    x, y = batch()

    def run(tr):
        for _ in range(iters):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()

    return model, run


def test_compiled_module_traces_as_eager(traces, tmp_path):
    df, _ = traces["compiled"]
    eager, _ = run_named(tmp_path, "eager", second_thread_free_loop(3))
    columns = ["op", "phase", "step", "flops"]
    assert df[columns].astype(str).values.tolist() == eager[columns].astype(str).values.tolist()
    assert set(df["module"]) - {"OptimizedModule#1"} == set(eager["module"])


def test_manual_step_marks_steps(traces):
    df, _ = traces["manual_step"]
    update = df[df["op"] == "aten.sub_.Tensor"]
    assert set(update["phase"]) == {"optimizer"} and update.groupby("step").size().tolist() == [2] * 3


def test_forward_only_loops_hold_no_gradient_hooks_and_a_bounded_list_of_module_boundaries(tmp_path, monkeypatch):
    from tracer.recording import attribution

    monkeypatch.setattr(attribution, "_EVENTS_KEPT", 64)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(4)])
    x = torch.randn(4, 16, requires_grad=True)
    counts = []
    with Tracer(tmp_path / "eval", model=model) as tr:
        for _ in range(60):  # forward only, grad mode on, no backward, no optimizer
            out = model(x)
            counts.append((tr._attr.live_hooks(), len(tr._attr._event_seqs)))
    del out
    # a boundary is kept only where an autograd node was made since the last one: the first, then one
    # after each of the 8 layers (the boundaries between them made no node); the next forward's first
    # boundary is the previous forward's last: 9, then 8 more per forward
    assert counts[0] == (0, 9) and counts[1] == (0, 17)
    assert max(hooks for hooks, _ in counts) == 0 and max(kept for _, kept in counts) <= 64


class _Attention(nn.Module):
    """Attention-like: its own matmuls after a child's, and a second output nobody uses (as Hugging Face
    attention modules return their weights)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        q = self.qkv(x)
        w = q @ q.transpose(-1, -2)
        return w @ q, w


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attention()

    def forward(self, x):
        return self.attn(x)[0]


def test_backward_ops_belong_to_the_module_whose_forward_made_their_autograd_node(tmp_path):
    import reports

    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(4, 8)
    with Tracer(tmp_path / "t", model=model):
        model(x).sum().backward()
    df = reports.load(tmp_path / "t")
    mods = reports.by_module(df, phase="backward").set_index("module")
    # w @ q backward: 2 * 4 * 8 * 4 + 2 * 4 * 4 * 8 = 512; q @ qT backward: 2 x 2 * 4 * 8 * 4 = 512; q is used
    # three times, so the engine adds three 4 x 8 gradients: 2 x 32 = 64; 512 + 512 + 64 = 1088
    assert mods.loc["attn", "flops"] == 1088
    assert mods.loc["attn.qkv", "flops"] == 2 * 8 * 4 * 8  # dW only (x needs no gradient) = 512
    assert mods.loc["_Block", "flops"] == 0  # the root made no matmul node itself


def test_time_step_synchronises_every_cuda_device_without_device(monkeypatch):
    from types import SimpleNamespace

    from tracer import measure

    synced = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda index=None: synced.append(index))
    props = SimpleNamespace(name="Mock GPU", total_memory=2**30, multi_processor_count=2, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    timing = measure.time_step(lambda: None, warmup=1, repeats=3)
    assert synced == [0, 1] * 2 * 3  # both devices, before and after each of 3 repeats
    assert timing["device"]["name"] == "Mock GPU"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    synced.clear()
    measure.time_step(lambda: None, warmup=0, repeats=2)
    assert synced == []  # CUDA never used: nothing to wait for


def test_run_device_is_the_first_device_that_is_not_the_cpu(tmp_path):
    model = nn.Linear(8, 8, device="meta")

    def run():
        torch.ones(3) + 1  # a CPU tensor touched first
        model(torch.empty(2, 8, device="meta"))

    with Tracer(tmp_path / "meta"):
        run()
    assert read_metadata(tmp_path / "meta")["device"]["type"] == "meta"
    cpu_model = nn.Linear(8, 8)
    with Tracer(tmp_path / "model", model=cpu_model):
        model(torch.empty(2, 8, device="meta"))
    assert read_metadata(tmp_path / "model")["device"]["type"] == "cpu"  # the model's device wins


def test_traced_threads(tmp_path):
    seen = {}

    def probe(key, enter_mode):
        if enter_mode:  # an autograd engine thread running the traced backward carries the dispatch mode
            with tr._mode:
                seen[key] = tr._attr.traced()
        else:
            seen[key] = tr._attr.traced()

    with Tracer(tmp_path / "threads") as tr:
        for key, enter_mode in (("plain thread", False), ("carries the mode", True)):
            worker = threading.Thread(target=probe, args=(key, enter_mode))
            worker.start()
            worker.join()
        seen["traced thread"] = tr._attr.traced()
    assert seen == {"plain thread": False, "carries the mode": True, "traced thread": True}


def test_optimizer_and_tracer_step_together_count_once(tmp_path):
    model = MLP()
    opt = sgd(model)
    x, y = batch()
    with Tracer(tmp_path / "both", model=model) as tr:
        for _ in range(3):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            tr.step()
            torch.ones(1).item()  # after both boundaries: still the step it follows
    df = pd.read_parquet(tmp_path / "both")
    assert df.groupby("step").size().tolist() == [df.groupby("step").size().iloc[0]] * 3
    assert df.iloc[-1]["step"] == 2


def test_external_modules_without_model_argument(tmp_path):
    model, criterion = MLP(), nn.MSELoss()
    x, y = batch()
    with Tracer(tmp_path / "no_model"):
        criterion(model(x), y).backward()  # the first module to run is the model
    df = pd.read_parquet(tmp_path / "no_model")
    assert set(df.loc[df["op"] == "aten.mm.default", "module"]) == {"fc1", "fc2"}
    assert set(df.loc[df["op"] == "aten.mse_loss.default", "module"]) == {"MSELoss#1"}


def test_a_failing_hook_does_not_break_the_program(tmp_path, monkeypatch):
    from tracer.recording.modules import ModuleNames

    def broken(self, module):
        raise RuntimeError("naming failed")

    model = MLP()
    x, y = batch()
    monkeypatch.setattr(ModuleNames, "name_of", broken)
    with pytest.warns(UserWarning, match="could not record a module or optimizer hook"):
        with Tracer(tmp_path / "broken", model=model):
            out = model(x)
    assert out.shape == (8, 16)
    assert read_metadata(tmp_path / "broken")["record_errors"] >= 1


def test_by_module_keeps_external_roots_apart(traces):
    import reports

    df, meta = traces["distill"]
    df = df.copy()
    df.attrs["runs"] = {"distill": meta}
    df["run"] = "distill"
    tree = reports.by_module(df).set_index("module")
    for root in ("MLP", "MLP#1", "MSELoss#1"):  # the teacher and the loss are roots of their own
        assert pd.isna(tree.loc[root, "parent"]) and tree.loc[root, "depth"] == 0, root
    assert tree.loc["MLP#1.fc1", "parent"] == "MLP#1" and tree.loc["fc1", "parent"] == "MLP"
    teacher = df[df["module"].str.startswith("MLP#1")]["flops"].sum()
    assert tree.loc["MLP#1", "subtree_flops"] == teacher
    assert tree.loc["MLP", "subtree_flops"] == df[df["module"].isin(["fc1", "act", "fc2"])]["flops"].sum()


def test_a_base_exception_in_forward_leaves_no_module_on_the_optimizer(tmp_path):
    class Stop(BaseException):  # not an Exception: torch runs no always_call hook for it
        pass

    class Stopping(nn.Module):
        def forward(self, x):
            raise Stop()

    model = nn.Sequential(nn.Linear(D, D, bias=False), Stopping())
    opt = sgd(model)
    x, _ = batch()
    with Tracer(tmp_path / "stop", model=model):
        for _ in range(2):
            try:
                model(x)
            except Stop:
                pass
            model[0](x).sum().backward()
            opt.step()
    df = pd.read_parquet(tmp_path / "stop")
    assert set(df.loc[df["phase"] == "optimizer", "module"]) == {""}
    assert sorted(df["step"].unique()) == [0, 1]


def test_ops_in_an_engine_callback_belong_to_no_module(tmp_path):
    """DDP's and FSDP2's final copies and reductions run in engine callbacks: no autograd node made them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    made = []

    def hook(grad):
        torch.autograd.Variable._execution_engine.queue_callback(lambda: made.append(torch.full((3,), 2.0) * 3))

    with Tracer(tmp_path / "t", model=model):
        out = model(torch.randn(2, 4))
        out.register_hook(hook)
        out.sum().backward()
    df = pd.read_parquet(tmp_path / "t")
    late = df[(df["phase"] == "backward") & (df["op"] == "aten.mul.Tensor")]
    assert len(made) == 1 and late["module"].tolist() == [""]
    assert set(df.loc[(df["phase"] == "backward") & df["op"].isin(MATMULS[:1]), "module"]) == {"0", "1"}


def test_a_backward_inside_a_hook_names_the_forward_modules_of_its_nodes(tmp_path):
    """A gradient hook that backpropagates through a graph made in the forward (a DEQ's implicit gradient):
    its nodes belong to the modules whose forward made them, not to the module running the hook."""
    torch.manual_seed(0)

    class Implicit(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = nn.Linear(8, 8)

        def forward(self, x):
            z0 = x.detach().requires_grad_()
            fz = self.f(z0)
            z = fz + x

            def hook(g):
                return torch.autograd.grad(fz, z0, g, retain_graph=True)[0] + g

            z.register_hook(hook)
            return z

    model = nn.Sequential(nn.Linear(8, 8), Implicit())
    with Tracer(tmp_path / "t", model=model):
        model(torch.randn(2, 8)).sum().backward()
    df = pd.read_parquet(tmp_path / "t")
    backward_mm = df[(df["phase"] == "backward") & (df["op"] == "aten.mm.default")]
    # the hook's grad: dx through 1.f (2 * 2 * 8 * 8 = 256); then the outer backward: 1.f's dW, layer 0's dW
    assert backward_mm["module"].tolist()[0] == "1.f"
    assert set(backward_mm["module"]) <= {"1.f", "0"}


def test_a_backward_past_the_naming_limit_is_counted_warned_and_reported(tmp_path, monkeypatch, capsys):
    from reports.output.cli import main
    from tracer.recording import attribution

    monkeypatch.setattr(attribution, "NAMED_PER_ENGINE_RUN", 5)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])
    with pytest.warns(UserWarning, match="backward ops of trace .* have no module"):
        with Tracer(tmp_path / "t", model=model, tokens=2):
            model(torch.randn(2, 4)).sum().backward()
    df = pd.read_parquet(tmp_path / "t")
    backward = df[df["phase"] == "backward"]
    # 5 nodes name 11 ops: the loss's SumBackward (expand), layer 3's AddmmBackward (t, mm, t, mm, t, sum, view),
    # an AccumulateGrad (detach), TBackward (t) and an AccumulateGrad (detach); every op after them is unnamed
    assert (backward["module"].iloc[1:11] == "3").all() and (backward["module"].iloc[11:] == "").all()
    assert read_metadata(tmp_path / "t")["backward_unnamed_rows"] == len(backward) - 11 == 28
    main(["report", str(tmp_path / "t")])
    assert "- backward_unnamed_rows: 28 backward ops have no module" in unwrapped(capsys.readouterr().out)


def test_a_deep_graph_is_freed_without_overflowing_the_stack(tmp_path):
    """60,000 chained nodes: naming every one from Python would make PyTorch free them recursively and crash
    (about 40,000 overflow an 8 MB stack); the tracer names the ops of the first NAMED_PER_ENGINE_RUN nodes and no more."""
    import os

    script = (
        "import torch, sys\nfrom torch import nn\nfrom tracer import Tracer\n"
        "class Loop(nn.Module):\n"
        "    def forward(self, h):\n"
        "        for _ in range(60000):\n"
        "            h = torch.tanh(h)\n"
        "        return h\n"
        "import warnings\nwarnings.simplefilter('ignore')\n"
        f"with Tracer({str(tmp_path / 't')!r}, model=Loop(), flush_rows=65536):\n"
        "    h = Loop()(torch.randn(2, requires_grad=True))\n"
        "    h.sum().backward()\n"
        "    del h\n"
        "print('freed')\n"
    )
    done = forked.run(script, env={**os.environ, "PYTHONPATH": str(helpers.ROOT)}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "freed", done.stderr[-2000:]


def test_a_backward_of_more_ops_than_the_node_limit_is_named_whole(tmp_path):
    """2,100 Linear layers: each backward runs 10 ops in 4 autograd nodes (AddmmBackward: t, mm, t, mm, t, sum,
    view; TBackward: t; two AccumulateGrad: detach; layer 0, whose input needs no gradient, skips one mm and its t),
    so 20,999 ops > 20,000 in 8,400 nodes < NAMED_PER_ENGINE_RUN: every one is named."""
    from tracer.recording.attribution import NAMED_PER_ENGINE_RUN

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(2100)])
    with Tracer(tmp_path / "t", model=model, tokens=1, flush_rows=65536):
        model(torch.randn(1, 2)).sum().backward()
    df = pd.read_parquet(tmp_path / "t", columns=["phase", "module"])
    backward = df[df["phase"] == "backward"]
    assert len(backward) == 1 + 2099 * 10 + 8 == 20999 > NAMED_PER_ENGINE_RUN  # the loss's expand, then the layers
    assert (backward["module"].iloc[1:] != "").all() and read_metadata(tmp_path / "t")["backward_unnamed_rows"] == 0
    assert backward["module"].iloc[-1] == "0" and backward["module"].iloc[1] == "2099"


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_forward_method_keeps_its_blocks_module_when_re_run(tmp_path, reentrant):
    """transformers' GradientCheckpointingLayer checkpoints a block's forward method, not its call: the re-run calls
    no hook of the block's, so its own ops (a residual add, a tanh) took the module of the autograd node whose saved
    tensor began the re-run (blocks.1.mlp.down) under use_reentrant=False."""
    import reports

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.up(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.mlp = nn.Linear(8, 8, bias=False), MLP()

        def body(self, x):
            h = x + self.attn(x)
            return h + self.mlp(h.tanh())

        def forward(self, x):
            return checkpoint(self.body, x, use_reentrant=reentrant)

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    with Tracer(tmp_path / "ck", model=model, tokens=4):
        model(torch.randn(4, 8, requires_grad=True)).pow(2).sum().backward()
    df = reports.load(tmp_path / "ck")
    mine = df[df["op"].isin(["aten.add.Tensor", "aten.tanh.default"]) & (df["phase"] == "forward")]
    assert mine["module"].tolist() == ["0", "0", "0", "1", "1", "1"]
    redo = df[df["op"].isin(["aten.add.Tensor", "aten.tanh.default"]) & df["recompute"]]
    assert len(redo) and set(redo["module"]) <= {"0", "1"}, redo["module"].tolist()
