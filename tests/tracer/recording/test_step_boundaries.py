"""Step boundaries in the training loops users write (ops after the optimizer, a loss logged, AMP accumulation, a
step that raises mid-backward): what tests/tracer/recording/test_loops.py
and tests/tracer/recording/test_steps.py did not cover.

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

# the MLP, its batch and their FLOPs (N 1,024; forward 16,384; backward 24,576; SGD 1,024 per step)
from tests.helpers import amp_step
from tests.tracer.recording.test_steps import BWD, FWD, SGD, D, H, T, batch, mlp
from tracer import Tracer, read_metadata


def logging_loop(iters, between, after):
    """The MLP trained with SGD, logging `between(loss)` between backward() and the optimizer step and
    `after(loss)` after it (each None: no log there); run() returns the logged tensors."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    x, y = batch()
    logged = []

    def run():
        for _ in range(iters):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            if between is not None:
                logged.extend(between(loss))
            opt.step()
            opt.zero_grad()
            logged.extend(after(loss))
        return logged

    return model, run


def detach_logging_loop(iters):
    """The loss logged with `loss.detach()` (no host sync), once between backward() and the
    optimizer step (other) and once after it (other, in the step it follows), as torchtitan logs after
    optimizers.step()."""
    return logging_loop(iters, lambda loss: [loss.detach()], lambda loss: [loss.detach()])


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
        assert (
            rows.loc[rows["op"] == "aten.detach.default", "seq"].max()
            > rows.loc[rows["phase"] == "optimizer", "seq"].max()
        )
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


def like_logging_loop(iters):
    """After the optimizer step, a running sum started with `torch.zeros_like(loss)` and a flag made with
    `loss.new_ones(())`: their inputs require grad, their outputs never do (torchgen's DONT_REQUIRE_DERIVATIVE)."""
    return logging_loop(iters, None, lambda loss: [torch.zeros_like(loss), loss.new_ones(())])


def test_zeros_like_and_new_ones_after_the_optimizer_are_other_and_open_no_step(tmp_path):
    one, _ = traced(tmp_path, "one", like_logging_loop(1))
    three, logged = traced(tmp_path, "three", like_logging_loop(3))
    assert all(torch.equal(a, b) for a, b in zip(like_logging_loop(3)[1](), logged))  # bitwise, untraced
    made = three[three["op"].isin(["aten.zeros_like.default", "aten.new_ones.default"]) & (three["module"] == "")]
    # the seed of backward() (ones_like, no module) stays forward work of its step; the two logs are other
    assert made.groupby(["step", "phase"], observed=True).size().to_dict() == {(s, "other"): 2 for s in range(3)}
    for step, rows in three.groupby("step"):  # after the step's optimizer, in that step (before: in the next)
        assert rows.loc[rows["phase"] == "other", "seq"].min() > rows.loc[rows["phase"] == "optimizer", "seq"].max()
    # k identical iterations: every step has the ops, FLOPs and bytes of the one-iteration trace
    columns = ["op", "phase", "module", "flops", "bytes_read", "bytes_written", "bytes_allocated"]
    ref = one[columns].astype(str).values.tolist()
    for step, rows in three.groupby("step"):
        assert rows[columns].astype(str).values.tolist() == ref, step
    other = three[three["phase"] == "other"]
    assert other.groupby("step")["bytes_allocated"].sum().tolist() == [4 + 4] * 3  # two 0-d float32 tensors
    table = reports.by_step(three)
    assert table["flops_forward"].tolist() == [FWD + 128 + 256] * 3  # + mse_loss 8·16 = 128 + relu 8·32 = 256
    assert table["flops_optimizer"].tolist() == [SGD] * 3


V, S, B = 32, 8, 2  # vocabulary, sequence, batch: 16 tokens per micro-batch


class TinyLM(nn.Module):
    """Embedding(32, 16) -> x + fc2(dropout(gelu(fc1(x)))) -> head: Linear(16, 32), fc1 Linear(16, 32), fc2
    Linear(32, 16), no biases. N = 3 · 512 = 1,536 weights that enter a matmul; 16 tokens per micro-batch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, D)
        self.fc1, self.fc2 = nn.Linear(D, H, bias=False), nn.Linear(H, D, bias=False)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        x = x + self.fc2(self.drop(F.gelu(self.fc1(x))))
        return F.cross_entropy(self.head(x).view(-1, V), targets.view(-1))


def amp_loop(iters, accum=2):
    """nanoGPT's loop on a CPU: bf16 autocast, GradScaler, 2 micro-batches, loss.item(), clip, AdamW."""
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    g = torch.Generator().manual_seed(1)
    micro = [(torch.randint(V, (B, S), generator=g), torch.randint(V, (B, S), generator=g)) for _ in range(accum)]

    def run():
        torch.manual_seed(42)  # the dropout masks
        losses = []
        for _ in range(iters):
            amp_step(model, opt, scaler, micro, losses)
        state = [t for s in opt.state.values() for t in s.values()] + [scaler._scale, scaler._growth_tracker]
        return losses, [p.detach().clone() for p in model.parameters()], state, torch.get_rng_state()

    return model, run


def same_bits(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def test_an_amp_accumulation_loop_computes_what_it_computes_untraced(tmp_path):
    df, (losses, params, state, rng) = traced(tmp_path, "amp", amp_loop(2))
    losses0, params0, state0, rng0 = amp_loop(2)[1]()
    assert losses == losses0 and len(losses) == 4  # 2 iterations of 2 micro-batches, every loss.item() equal
    for a, b in zip(params + state + [rng], params0 + state0 + [rng0], strict=True):
        assert same_bits(a, b)  # weights, AdamW's step, exp_avg, exp_avg_sq, the scaler's state, the RNG
    mm = df[df["op"] == "aten.mm.default"]
    assert set(mm["input_dtypes"].map(tuple)) == {("bfloat16", "bfloat16")}
    # per micro-batch 2·N·T = 2·1,536·16 = 49,152 forward; every layer's dX is needed (the embedding is
    # trained): backward 2 · 49,152; two micro-batches: 2 · 3 · 49,152 = 294,912 per step
    fwd_bwd = mm.groupby(["step", "phase"], observed=True)["flops"].sum()
    assert fwd_bwd.to_dict() == {(s, p): f for s in (0, 1) for p, f in (("forward", 98_304), ("backward", 196_608))}
    model, run = amp_loop(1)
    with FlopCounterMode(display=False) as counter:
        run()
    assert counter.get_total_flops() == 294_912


class FailingBackward(torch.autograd.Function):
    """Identity in forward; its backward runs one op (g · 2: 8·32 = 256 FLOPs) and then raises, when armed."""

    armed = False
    error = None

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad * 2.0
        if FailingBackward.armed:
            raise FailingBackward.error
        return grad


def failing_step(model, opt, x, y):
    h = FailingBackward.apply(model[1](model[0](x)))  # between ReLU and fc2
    F.mse_loss(model[2](h), y).backward()
    opt.step()
    opt.zero_grad()


def test_a_step_that_raises_mid_backward(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    x, y = batch()
    FailingBackward.error = ValueError("boom")
    caught = None
    try:
        with Tracer(tmp_path / "caught", model=model, tokens=T):
            failing_step(model, opt, x, y)
            FailingBackward.armed = True
            try:
                failing_step(model, opt, x, y)  # caught by the loop, which goes on
            except ValueError:
                pass
            FailingBackward.armed = False
            opt.zero_grad()
            failing_step(model, opt, x, y)
            failing_step(model, opt, x, y)
            FailingBackward.armed, FailingBackward.error = True, ValueError("boom")
            failing_step(model, opt, x, y)  # not caught: it ends the trace
    except ValueError as exc:
        caught = exc
    finally:
        FailingBackward.armed = False
    assert caught is FailingBackward.error and caught.__context__ is None  # the program's own exception, unchanged
    meta = read_metadata(tmp_path / "caught")
    assert meta["complete"] is False and meta["error"] == "ValueError: boom"
    df = pd.read_parquet(tmp_path / "caught")
    mm = df[df["op"] == "aten.mm.default"].groupby(["step", "phase"], observed=True)["flops"].sum()
    # step 0 a whole step; step 1: the step that raised (forward 16,384, its backward up to the raise: the
    # mse_loss and fc2 backward, dW2 + dH = 2 · 8,192) and the clean step after it (no optimizer step between:
    # one step); step 2 a clean step; step 3 the step that ended the trace
    assert mm.to_dict() == {
        (0, "forward"): FWD, (0, "backward"): BWD,
        (1, "forward"): 2 * FWD, (1, "backward"): 2 * 8_192 + BWD,
        (2, "forward"): FWD, (2, "backward"): BWD,
        (3, "forward"): FWD, (3, "backward"): 2 * 8_192,
    }  # fmt: skip
    # the raising backward's rows are backward rows, and nothing it left behind mislabels the next steps
    clean = df[df["step"] == 2][["op", "phase", "module", "recompute", "flops"]].astype(str).values.tolist()
    assert clean == df[df["step"] == 0][["op", "phase", "module", "recompute", "flops"]].astype(str).values.tolist()
    last = df[df["step"] == 3]
    assert last["phase"].iloc[-1] == "backward" and last["op"].iloc[-1] == "aten.mul.Tensor"  # g · 2, then the raise
    assert not df["recompute"].any()


# ------------------------------------------------------------------ a functional forward that begins with zeros_like(w)
def functional_loop(iters):
    """A model written as a function of a leaf tensor (no module): its forward begins with `torch.zeros_like(w)`,
    an op whose output never requires grad, after the step before's optimizer."""
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)
    opt = torch.optim.SGD([w], lr=0.1)

    def run():
        for _ in range(iters):
            noise = torch.zeros_like(w)  # a perturbation of the weights, the forward's first op
            (x @ (w + noise)).square().sum().backward()
            opt.step()
            opt.zero_grad()
        return w

    return run


def test_a_functional_forward_that_begins_with_zeros_like_of_a_parameter_opens_its_step(tmp_path):
    """Before: each iteration's zeros_like(w) was phase other in the step before (step 0 had two, the last none):
    k identical iterations gave unequal steps. zeros_like(loss) after the optimizer stays other
    (test_zeros_like_and_new_ones_after_the_optimizer_are_other_and_open_no_step above): the loss is no leaf, w is."""
    run_one, run_three = functional_loop(1), functional_loop(3)
    with Tracer(tmp_path / "one"):
        run_one()
    with Tracer(tmp_path / "three"):
        out = run_three()
    assert torch.equal(out, functional_loop(3)())  # bitwise, untraced
    one, three = reports.load(tmp_path / "one"), reports.load(tmp_path / "three")
    made = three[three["op"] == "aten.zeros_like.default"]
    assert made.groupby(["step", "phase"], observed=True).size().to_dict() == {(s, "forward"): 1 for s in range(3)}
    columns = ["op", "phase", "module", "flops", "bytes_read", "bytes_written", "bytes_allocated"]
    ref = one[columns].astype(str).values.tolist()
    for step, rows in three.groupby("step"):
        assert rows[columns].astype(str).values.tolist() == ref, step
    with FlopCounterMode(display=False) as counter:
        functional_loop(1)()
    # x [2, 4] @ w [4, 4]: 2·2·4·4 = 64; backward dW = xᵀ [4, 2] @ dy [2, 4]: 2·4·2·4 = 64 (x needs no gradient)
    mm = three[three["op"] == "aten.mm.default"].groupby("step")["flops"].sum().tolist()
    assert mm == [counter.get_total_flops()] * 3 == [128] * 3
