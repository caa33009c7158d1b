"""Training loops as users write them, traced end to end: the program computes what it computes untraced, and the
report's, plan's and library's figures agree with closed forms and with torch.utils.flop_counter.FlopCounterMode."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from gpt import GPT, GPTConfig, make_optimizer
from torch.utils.flop_counter import FlopCounterMode

import reports
from tests.helpers import amp_step
from tracer import Tracer

# ------------------------------------------------------------------ nanoGPT: accumulation, GradScaler, clipping
CFG = GPTConfig(vocab_size=128, seq_len=16, n_layer=2, n_head=2, d_model=32)
ACC, BATCH, STEPS = 2, 4, 3  # micro-batches per step, sequences per micro-batch


def nanogpt(path=None, steps=STEPS):
    """`steps` iterations of a nanoGPT-style loop (bf16 autocast, ACC micro-batches whose loss.item() is logged,
    GradScaler, unscale, clip, step, update); traced into `path` unless None. (losses, state dict, RNG state)."""
    torch.manual_seed(0)
    model = GPT(CFG)
    opt = make_optimizer(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    losses = []

    def loop():
        for _ in range(steps):
            shape = (BATCH, CFG.seq_len)
            batches = [
                (torch.randint(0, CFG.vocab_size, shape), torch.randint(0, CFG.vocab_size, shape)) for _ in range(ACC)
            ]
            amp_step(model, opt, scaler, batches, losses)

    if path is None:
        loop()
    else:
        with Tracer(path, model=model, tokens=ACC * BATCH * CFG.seq_len):
            loop()
    return losses, model.state_dict(), torch.get_rng_state()


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    path = tmp_path_factory.mktemp("nanogpt") / "k.parquet"
    return nanogpt(), nanogpt(path), reports.load(path)


def test_nanogpt_computes_bit_for_bit_what_it_computes_untraced(nano):
    (losses, state, rng), (traced_losses, traced_state, traced_rng), _ = nano
    assert traced_losses == losses and len(losses) == STEPS * ACC
    assert all(torch.equal(state[name], traced_state[name]) for name in state)
    assert torch.equal(rng, traced_rng)


def test_nanogpt_matmul_flops_are_flop_counter_modes_and_6NT(nano):
    *_, df = nano
    torch.manual_seed(0)
    model = GPT(CFG)
    x = torch.randint(0, CFG.vocab_size, (BATCH, CFG.seq_len))
    with FlopCounterMode(display=False) as counter, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, x).backward()
    counted = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    step = df[(df["step"] == 1) & df["phase"].isin(["forward", "backward"])]
    traced = step.groupby("op", observed=True)["flops"].sum()
    # per micro-batch, T = 4 * 16 = 64 tokens, N = 28,672 matmul weights (2 blocks x 12,288 + head 4,096):
    # weight matmuls 6·N·T = 6 * 28,672 * 64 = 11,010,048 (addmm 3,145,728 + mm 7,864,320), attention
    # 2 layers x 2 (QKᵀ, AV) x 3 (forward, 2 backward) x 2·B·h·S·S·dh = 12 * 2 * 4 * 2 * 16 * 16 * 16 = 786,432 (bmm)
    assert counted == {"aten.addmm": 3145728, "aten.mm": 7864320, "aten.bmm": 786432}
    for op, flops in counted.items():
        assert traced[op + ".default"] == ACC * flops  # two micro-batches per step


def test_nanogpt_steps_repeat_and_memory_is_the_closed_form(nano):
    *_, df = nano
    table = df.groupby(["step", "phase"], observed=True)[["flops", "bytes_allocated"]].sum()
    for phase in ("forward", "backward", "optimizer"):
        assert table.loc[(1, phase)].tolist() == table.loc[(2, phase)].tolist(), phase
    # the first optimizer step makes AdamW's state: exp_avg and exp_avg_sq of N = 34,176 fp32 values, 2 * 34,176 * 4
    # = 273,408 bytes, and one 4-byte step count for each of the 29 parameter tensors: 273,524
    assert table.loc[(0, "optimizer"), "bytes_allocated"] - table.loc[(1, "optimizer"), "bytes_allocated"] == 273408
    memory = reports.by_category(df).set_index("category")["bytes"]
    assert memory["parameters"] == memory["gradients"] == 136704  # 34,176 * 4
    assert memory["optimizer_state"] == 273524  # 273,408 + 29 * 4


# ------------------------------------------------------------------ plan: autocast's bf16 weight copies
def frozen_autocast(path, batch):
    """Two steps of 8 frozen Linear(64, 64) under bf16 autocast behind a trainable scale of 64 values: autocast
    copies each weight to bf16 (64 * 64 * 2 = 8,192 bytes) and saves it for the backward's dL/dx; no weight gradient
    is computed, so no parameter-sized backward temporary blurs the peak."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(8)]).requires_grad_(False)
    scale = torch.nn.Parameter(torch.ones(64))
    model = torch.nn.Module()
    model.layers, model.scale = layers, scale
    opt = torch.optim.SGD([scale], lr=0.1)
    x = torch.randn(batch, 64)
    with Tracer(path, model=model, tokens=batch):
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(layers(x * scale).float(), torch.zeros(batch, 64))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
    return reports.load(path)


@pytest.fixture(scope="module")
def autocast_plans(tmp_path_factory):
    folder = tmp_path_factory.mktemp("autocast")
    at4, at8 = frozen_autocast(folder / "b4", 4), frozen_autocast(folder / "b8", 8)
    return reports.plan(at4, gpu="H100", micro_batch=8).iloc[0], reports.plan(at8, gpu="H100").iloc[0]


def test_plan_keeps_autocasts_weight_copies_fixed_when_the_micro_batch_grows(autocast_plans):
    planned, traced = autocast_plans
    assert (planned["batch"], traced["batch"]) == (4, 8)
    # the trace at 8 peaks at 207,364 bytes; planned from the trace at 4 it was 272,904: the 8 bf16 copies, 8 * 8,192
    # = 65,536 bytes, counted twice (as growing with the activations); now 207,368: the 4-byte loss scalar, counted
    # as growing (docs/plan.md), is the 4 bytes more
    assert traced["peak_bytes_per_rank"] == 207364
    assert planned["peak_bytes_per_rank"] == 207364 + 4


def test_plan_reads_and_writes_autocasts_weight_copies_once_whatever_the_micro_batch(autocast_plans):
    planned, traced = autocast_plans
    # memory-bound time of a step (bytes / the H100's bandwidth x efficiency): the trace at 8 gives 88.08 ns; planned
    # from the trace at 4 it was 112.35 ns (+27.6%: the bf16 copies' writes and reads scaled with the micro-batch),
    # now 87.89 ns (-0.2%: the scale's gradient, a reduction over the batch, is the rest)
    assert planned["memory_bound_s"] == pytest.approx(traced["memory_bound_s"], rel=0.005)
    assert planned["compute_bound_s"] == traced["compute_bound_s"]


# ------------------------------------------------------------------ plan: a DataLoader's partial last batch
def test_plan_prices_a_step_of_the_batch_it_reads_not_a_partial_last_batch(tmp_path):
    """12 samples in batches of 5: steps of 5, 5 and 2 rows through Linear(64, 256) -> ReLU -> Linear(256, 64), no
    biases, N = 32,768. The plan reads its batch (5) from the first step's forward and priced the last complete step,
    the partial batch of 2: 329,472 FLOPs per step against the batch of 5's 823,680, tokens/s 2.5x too high."""
    from tests.reports.plan.test_plan_inputs import partial_batches

    df = reports.load(partial_batches(tmp_path / "partial"))
    assert reports.by_step(df)["flops"].tolist() == [856448, 856448, 362240]  # the last, 2 rows
    table = reports.plan(df, gpu="H100")
    planned, notes = table.iloc[0], " ".join(table.attrs["plan"]["partial"]["notes"])
    assert (planned["batch"], planned["tokens_per_step"]) == (5, 5)
    # forward 2·N·T = 2·32,768·5 = 327,680; backward dL/dW 327,680 + the second layer's dL/dx 2·5·256·64 = 163,840;
    # relu, square and mean 1,280 + 320 + 320 forward, their gradients 1,280 + 4·320 backward: 819,200 + 4,480
    assert planned["model_flops_per_step"] == 823680  # was 329,472: step 2's 2 rows
    assert "step 2 has 131,840: a partial last batch" in notes  # its forward: 2·N·2 + 512 + 128 + 128


# ------------------------------------------------------------------ torch.compile(fullgraph=True), another length
class _Block(torch.nn.Module):
    """A pre-norm transformer block of width D = 32, 4 heads, causal SDPA, a 4·D MLP, no biases: N = 3·D² + D² +
    2·4·D² = 12,288 weights that enter a matmul."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.qkv, self.o = torch.nn.Linear(32, 96, bias=False), torch.nn.Linear(32, 32, bias=False)
        self.fc, self.proj = torch.nn.Linear(32, 128, bias=False), torch.nn.Linear(128, 32, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 32))
        return x + self.proj(F.gelu(self.fc(x)))


def _compiled_steps(path, lengths):
    """A fullgraph-compiled block (compiled and run once at length 8 before the trace), AdamW, one step per length
    of `lengths` on 2 sequences, traced into `path` unless None; then a step at length 16 after the trace. (losses,
    parameters)."""
    torch.manual_seed(0)
    block = _Block()
    opt = torch.optim.AdamW(block.parameters(), lr=1e-3)
    compiled = torch.compile(block, fullgraph=True, backend="eager")

    def step(seq):
        torch.manual_seed(seq)
        loss = compiled(torch.randn(2, seq, 32)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    losses = [step(8)]
    with Tracer(path, model=compiled, tokens=16) if path else contextlib.nullcontext():
        losses += [step(seq) for seq in lengths]
    losses.append(step(16))  # compiled anew for length 16, after the trace
    return losses, [p.detach().clone() for p in block.parameters()]


def test_a_compiled_block_at_two_lengths_counts_each_steps_flops(tmp_path):
    untraced, traced = _compiled_steps(None, (8, 16, 8)), _compiled_steps(tmp_path / "compiled", (8, 16, 8))
    assert all(torch.equal(a, b) for a, b in zip(untraced[0] + untraced[1], traced[0] + traced[1]))
    df = reports.load(tmp_path / "compiled")
    mm = df[df["flop_kind"] == "matmul"].groupby("step")["flops"].sum().tolist()
    # 6·N·T with T = 2 sequences x the length: 6·12,288·16 = 1,179,648 and 6·12,288·32 = 2,359,296
    assert mm == [1179648, 2359296, 1179648]
    for seq, flops in ((8, mm[0]), (16, mm[1])):  # FlopCounterMode on the eager block, forward and backward
        torch.manual_seed(0)
        block = _Block()
        with FlopCounterMode(display=False) as counter:
            block(torch.randn(2, seq, 32)).square().mean().backward()
        assert counter.get_total_flops() == flops
    attention = df[df["flop_kind"] == "attention"].groupby("step")["flops"].sum().tolist()
    # the flash kernel's forward 4·B·S²·D = 4·2·8²·32 = 16,384, its backward 2.5x: 57,344; at S = 16, 4x: 229,376
    assert attention == [57344, 229376, 57344]
    assert reports.by_step(df)["flops"].tolist() == [1349638, 2715142, 1349638]


# ------------------------------------------------------------------ a GAN and LoRA: per-phase FLOPs, closed forms
def _gan_iterations(path, k):
    """k iterations of a GAN: G = Linear(8, 16) -> ReLU -> Linear(16, 12), D = Linear(12, 16) -> ReLU -> Linear(16,
    1), no biases, N = 320 + 208 = 528, B = 4. D's step reads G's output through detach(); G's step backpropagates
    through D with retain_graph=True; two Adam optimizers, each stepping once per iteration."""
    torch.manual_seed(0)
    g = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 12, bias=False))
    d = torch.nn.Sequential(torch.nn.Linear(12, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 1, bias=False))
    opt_g, opt_d = torch.optim.Adam(g.parameters(), lr=1e-3), torch.optim.Adam(d.parameters(), lr=1e-3)
    both = torch.nn.ModuleDict({"G": g, "D": d})
    losses = []
    with Tracer(path, model=both, tokens=4) if path else contextlib.nullcontext():
        for _ in range(k):
            torch.manual_seed(1)
            real, fake = torch.randn(4, 12), g(torch.randn(4, 8))
            loss_d = d(real).mean() - d(fake.detach()).mean()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            loss_g = -d(fake).mean()
            opt_g.zero_grad()
            loss_g.backward(retain_graph=True)
            opt_g.step()
            losses += [loss_d.item(), loss_g.item()]
    return losses, [p.detach().clone() for p in both.parameters()]


def test_a_gan_with_detach_and_retain_graph_counts_each_weight_matmul(tmp_path):
    untraced, traced = _gan_iterations(None, 3), _gan_iterations(tmp_path / "gan", 3)
    assert untraced[0] == traced[0] and all(torch.equal(a, b) for a, b in zip(untraced[1], traced[1]))
    df = reports.load(tmp_path / "gan")
    assert reports.by_step(df)["flops"].tolist() == [23216] * 3  # 3 iterations, 3 steps of one figure
    b = reports.breakdown(df).set_index("phase")
    # forward: G once 2·4·320 = 2,560, D three times (real, fake.detach(), fake) 3·2·4·208 = 4,992: 7,552
    assert b.loc["forward", "weight_matmul_flops"] == 7552
    # backward: D's step, twice dL/dW of D 2·4·208 = 1,664 and dL/dx of D.2 2·4·16 = 128 (its input x and the
    # detached fake need none): 3,584; G's step through D, dL/dW 1,664 and dL/dx 128 + 2·4·192 = 1,536, then G's
    # dL/dW 2·4·320 = 2,560 and G.2's dL/dx 1,536 (z needs none): 7,424; 11,008
    assert b.loc["backward", "weight_matmul_flops"] == 11008
    _, (g0, g2, d0, d2) = _gan_iterations(None, 0)  # the weights, as initialised
    with FlopCounterMode(display=False) as counter:  # the same iteration's matmuls, without the optimizers
        g = lambda x: F.linear(F.relu(F.linear(x, g0.requires_grad_())), g2.requires_grad_())  # noqa: E731
        d = lambda x: F.linear(F.relu(F.linear(x, d0.requires_grad_())), d2.requires_grad_())  # noqa: E731
        real, fake = torch.randn(4, 12), g(torch.randn(4, 8))
        (d(real).mean() - d(fake.detach()).mean()).backward()
        (-d(fake).mean()).backward(retain_graph=True)
    assert counter.get_total_flops() == 7552 + 11008


def test_lora_counts_no_weight_gradient_for_the_frozen_base(tmp_path):
    """Two layers of a frozen Linear(32, 32) plus a rank-4 adapter x @ Aᵀ @ Bᵀ (A [4, 32], B [32, 4]), T = 16 rows:
    N = 2·(1,024 + 128 + 128) = 2,560, of which N_lora = 512 train."""

    class LoRA(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.base = torch.nn.Linear(32, 32, bias=False).requires_grad_(False)
            self.A, self.B = torch.nn.Parameter(torch.randn(4, 32) * 0.1), torch.nn.Parameter(torch.randn(32, 4) * 0.1)

        def forward(self, x):
            return self.base(x) + (x @ self.A.t()) @ self.B.t()

    torch.manual_seed(0)
    model = torch.nn.Sequential(LoRA(), LoRA())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x = torch.randn(16, 32)
    with Tracer(tmp_path / "lora", model=model, tokens=16):
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    df = reports.load(tmp_path / "lora")
    b = reports.breakdown(df).set_index("phase")
    assert b.loc["forward", "weight_matmul_flops"] == 81920  # 2·N·T = 2·2,560·16
    # no dL/dW for the frozen bases; dL/dA, dL/dB and the adapters' inner dL/dx 3·2·16·128 = 12,288 per layer, the
    # second layer's dL/dx through its base 2·16·1,024 = 32,768 and its A 4,096 (x needs none): 61,440 = 1.5·N·T
    assert b.loc["backward", "weight_matmul_flops"] == 61440
    assert b.loc["backward", "expected_flops"] - 61440 == 36864 + 65536  # the skipped dL/dx and frozen dL/dW
    explained = " ".join(reports.explain(df))
    assert "Skipped: 0.base.weight (1,024 parameters: 32,768 FLOPs); 0.A (128 parameters: 4,096 FLOPs)" in explained
    assert "0.base.weight (1,024 parameters: 32,768 FLOPs); 1.base.weight (1,024 parameters: 32,768 FLOPs)" in explained
