"""The real Lightning (`lightning.pytorch.Trainer`, CPU): the LightningMeter callback and a Tracer around
`trainer.fit`, on a seeded 2-layer MLP, against a hand loop of the same model and an untraced fit."""

import csv
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import reports
import tracer
from tests.tracer.metering.test_meter_steps import Net

PEAK = 1e9  # FLOP/s, given: the figures do not depend on this machine's CPU

# Per micro-batch of B = 2 rows (loss = out.square().sum(), divided by accumulate_grad_batches as Lightning does):
#   forward   fc1 2·2·8·16 = 512 + relu 32 + fc2 2·2·16·4 = 256 + square 8 + sum 8 + Lightning's division 1 = 817
#   backward  division's grad 1 + square's grad 3·2·4 = 24 + fc2 dW, dx 2·256 + relu's grad 32 + fc1 dW 512 = 1,081
#   matmuls   forward 768 + backward 1,024 = 1,792 (FlopCounterMode's figure, checked below)
# SGD: one add_ per parameter element, 8·16 + 16·4 = 192. Accumulating 2 micro-batches adds the second's gradients
# into the first's: 192 more in the backward. Gradient clipping (norm): _foreach_norm 192 + vector norm of the 2
# norms 2 + add 1 + reciprocal 1 + mul 1 + clamp 1 + _foreach_mul_ 192 = 390.
FORWARD, BACKWARD, SGD, CLIP = 817, 1081, 192, 390
ACC_FORWARD, ACC_BACKWARD = 2 * FORWARD, 2 * BACKWARD + SGD  # 1,634 and 2,354
LOUD = dict(accumulate_grad_batches=2, gradient_clip_val=1.0, precision="bf16-mixed", limit_val_batches=2)


# lightning.pytorch, the module trained and tracer.metering.callbacks.LightningMeter (whose first use imports
# Lightning), set by `_lightning` before this module's first test. Not at the top: every pytest-xdist worker imports
# every test module to collect it, and Lightning (with torch._dynamo) costs about 3 CPU-s to import, which a worker
# that runs none of these tests then spent for nothing.
pl = Lit = LightningMeter = None


@pytest.fixture(scope="module", autouse=True)
def _lightning():
    """lightning.pytorch as `pl` (the module's tests skipped when it is not installed), the `Lit` module and
    LightningMeter."""
    global pl, Lit, LightningMeter
    pl = pytest.importorskip("lightning.pytorch")
    from tracer.metering.callbacks import LightningMeter

    class Lit(Net, pl.LightningModule):
        """tests/tracer/metering/test_meter_steps.py's Net (x [2, 8] -> fc1 [8 -> 16] -> relu -> fc2 [16 -> 4], no biases),
        trained with SGD by Lightning."""

        def training_step(self, batch, batch_idx):
            return self(batch[0]).square().sum()

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self(batch[0]).square().sum())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


def _data():
    """16 training rows (8 batches of 2 an epoch) and 8 validation rows, seeded."""
    xs = torch.randn(24, 8, generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(xs[:16]), batch_size=2), DataLoader(TensorDataset(xs[16:]), batch_size=2)


def _fit(callbacks=(), steps=6, traced=None, logger=False, **kwargs):
    """Lit trained from seed 0 for `steps` optimizer steps; `traced`: a Tracer path around trainer.fit."""
    pl.seed_everything(0, verbose=False)
    model = Lit()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        enable_progress_bar=False,
        logger=logger,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        log_every_n_steps=1,
        **kwargs,
    )
    train, val = _data()
    val = val if kwargs.get("limit_val_batches") else None
    if traced is None:
        trainer.fit(model, train, val)
    else:
        with tracer.Tracer(traced, model=model, tokens=2):
            trainer.fit(model, train, val)
    return model


def _optrace_warnings(record):
    return [str(w.message) for w in record if str(w.message).startswith("optrace")]


def _phases(path):
    """{step: {phase: FLOPs}} of a trace."""
    df = reports.load(path)
    return {s: g.groupby("phase").flops.sum().to_dict() for s, g in df.groupby("step")}


def test_lightning_meter_logs_every_metered_step_of_a_real_trainer(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    meter = LightningMeter(tmp_path / "pl", tokens=2, peak_flops=PEAK)
    logger = CSVLogger(tmp_path, name="csv")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _fit([meter], logger=logger)
    assert _optrace_warnings(record) == [] and meter.meter.errors == 0
    table = reports.meter(tmp_path / "pl")
    assert table["step"].tolist() == [0, 1, 2, 3, 4, 5]  # max_steps=6 optimizer steps, each metered once
    assert table["traced"].tolist() == [True, True, False, False, False, False]  # the first two, as documented
    assert table["flops_from_step"].tolist() == [0, 1, 1, 1, 1, 1]  # the second trace serves the later steps
    assert table["model_flops"].tolist() == [FORWARD + BACKWARD] * 6  # 817 + 1,081 = 1,898
    assert table["hardware_flops"].tolist() == [FORWARD + BACKWARD + SGD] * 6  # 2,090
    assert table["mfu"][:2].isna().all() and (table["mfu"][2:] > 0).all()  # no MFU for a traced step's time
    with open(logger.log_dir + "/metrics.csv") as f:
        logged = [row for row in csv.DictReader(f) if row.get("mfu")]
    assert len(logged) == 4  # steps 2-5, one log each; the traced steps log nothing
    assert all(float(row["mfu"]) > 0 and float(row["step_time_s"]) > 0 for row in logged)
    logged_rates = [float(row["tokens_per_s"]) for row in logged]
    assert logged_rates == pytest.approx(table["tokens_per_s"][2:].tolist(), rel=1e-6)


def test_lightning_meter_keeps_validation_inside_an_accumulation_window_out_of_the_step(tmp_path):
    """Lightning validates every `val_check_interval` batches whatever the accumulation: with 2 micro-batches a step
    and validation every 3 batches, it runs between the micro-batches of steps 1 and 5 (batches 2|3 of each epoch).
    Those steps are training steps like the others: same signature, same FLOPs; the validation is no step."""
    meter = LightningMeter(tmp_path / "pl", tokens=2, peak_flops=PEAK)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _fit([meter], steps=8, val_check_interval=3, **LOUD)
    assert _optrace_warnings(record) == [] and meter.meter.errors == 0
    table = reports.meter(tmp_path / "pl")
    assert len(table) == 8  # 8 optimizer steps; the 4 validation runs (and the sanity check) are not steps
    assert table["traced"].tolist() == [True, True] + [False] * 6
    assert table["flops_from_step"].tolist() == [0] + [1] * 7  # steps 1 and 5 keep the training signature
    # 1,634 + 2,354 = 3,988: without the validation's forward passes (2 batches of 816 under bf16 autocast)
    assert table["model_flops"].tolist() == [ACC_FORWARD + ACC_BACKWARD] * 8
    assert table["hardware_flops"].tolist() == [ACC_FORWARD + ACC_BACKWARD + SGD + CLIP] * 8  # 4,570
    assert table["dtype"].tolist() == ["bfloat16"] * 8 and (table["mfu"][2:] > 0).all()
    traces = tracer.read_metadata(tmp_path / "pl")["meter"]["traces"]
    assert [t["optimizer_flops"] for t in traces] == [SGD, SGD]  # clipping is not the optimizer's (see below)


def test_lightning_meter_with_validation_between_steps(tmp_path):
    """Validation every 4 batches runs after an optimizer step (batch 3 ends step 1): begin() leaves it out."""
    meter = LightningMeter(tmp_path / "pl", tokens=2, peak_flops=PEAK)
    _fit([meter], steps=8, val_check_interval=4, **LOUD)
    table = reports.meter(tmp_path / "pl")
    assert meter.meter.errors == 0 and table["flops_from_step"].tolist() == [0] + [1] * 7
    assert table["model_flops"].tolist() == [ACC_FORWARD + ACC_BACKWARD] * 8  # 3,988


def _hand_loop(path, steps, accumulate=1, clip=None):
    """The loop Lightning runs, by hand: the same seeded model and batches, each loss divided by `accumulate`."""
    pl.seed_everything(0, verbose=False)
    model = Lit()
    opt = model.configure_optimizers()
    batches = [b for _ in range(2) for (b,) in _data()[0]]
    with tracer.Tracer(path, model=model, tokens=2):
        for step in range(steps):
            for x in batches[step * accumulate : (step + 1) * accumulate]:
                (model(x).square().sum() / accumulate).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    return model


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_tracer_around_fit_counts_optimizer_steps_and_phases_as_a_hand_loop(tmp_path, accumulate):
    """Lightning calls optimizer.step(closure): the forward, backward and (here) gradient clipping run inside it.
    Steps are the optimizer steps; forward and backward are as in a hand loop, the optimizer phase is the
    update alone, after the closure; clipping is `other`, as in the hand loop."""
    _fit(steps=6, traced=tmp_path / "pl", accumulate_grad_batches=accumulate, gradient_clip_val=1.0)
    _hand_loop(tmp_path / "hand", 6, accumulate, clip=1.0)
    lightning, hand = _phases(tmp_path / "pl"), _phases(tmp_path / "hand")
    assert sorted(lightning) == [0, 1, 2, 3, 4, 5]  # 6 optimizer steps (12 batches with accumulate 2)
    forward, backward = (FORWARD, BACKWARD) if accumulate == 1 else (ACC_FORWARD, ACC_BACKWARD)
    for step in range(6):
        assert lightning[step]["forward"] == hand[step]["forward"] == forward  # 817; 1,634
        assert lightning[step]["backward"] == hand[step]["backward"] == backward  # 1,081; 2,354
        assert lightning[step]["optimizer"] == hand[step]["optimizer"] == SGD  # 192
        assert hand[step]["other"] == CLIP  # 390
    assert [lightning[s]["other"] for s in range(1, 6)] == [CLIP] * 5  # step 0 also holds Lightning's set-up
    df = reports.load(tmp_path / "pl")
    for step, rows in df.groupby("step"):  # the update runs after the closure's forward and backward
        training = rows[rows.phase.isin(["forward", "backward"])]
        update = rows[rows.phase == "optimizer"]
        assert update.seq.min() > training.seq.max(), step
        assert set(update.op) <= {"aten.add_.Tensor", "aten.detach.default"}, step  # SGD's update alone
    assert (df[df.op == "aten.clone.default"].phase == "other").all()  # Lightning's copy of the loss for logging


def test_traced_matmul_flops_match_flop_counter_mode(tmp_path):
    """One step of the model under FlopCounterMode against the matmul rows of every traced Lightning step."""
    _fit(steps=4, traced=tmp_path / "pl")
    pl.seed_everything(0, verbose=False)
    model = Lit()
    x = next(iter(_data()[0]))[0]
    with FlopCounterMode(display=False) as counter:
        model(x).square().sum().backward()
    assert counter.get_total_flops() == 1792  # forward 512 + 256, backward 2 · 256 + 512
    df = reports.load(tmp_path / "pl")
    matmuls = df[df.flop_kind == "matmul"].groupby("step").flops.sum()
    assert matmuls.tolist() == [counter.get_total_flops()] * 4


def test_the_meter_and_the_tracer_leave_the_fit_bitwise_unchanged(tmp_path):
    """Accumulation, clipping, bf16 autocast and validation inside a step: the final parameters are those of an
    untraced fit from the same seed, bit for bit."""
    kwargs = dict(steps=8, val_check_interval=3, **LOUD)
    untraced = list(_fit(**kwargs).parameters())
    metered = list(_fit([LightningMeter(tmp_path / "m", tokens=2, peak_flops=PEAK)], **kwargs).parameters())
    traced = list(_fit(traced=tmp_path / "t", **kwargs).parameters())
    pl.seed_everything(0, verbose=False)
    assert len(untraced) == 2 and not torch.equal(untraced[0], Lit().fc1.weight)  # it trained from seed 0's weights
    for a, b, c in zip(untraced, metered, traced):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_lightning_meter_traces_the_short_step_at_an_epoch_s_end_once(tmp_path):
    """5 batches an epoch (limit_train_batches), 2 accumulated: Lightning steps after batches 1, 3 and 4, so each
    epoch ends with a step of one micro-batch. The first such step is traced itself (its FLOPs its own); the next
    epoch's first step is metered, not traced again, and the next short step reuses the first one's FLOPs."""
    meter = LightningMeter(tmp_path / "pl", tokens=2, peak_flops=PEAK)
    _fit([meter], steps=6, accumulate_grad_batches=2, limit_train_batches=5)
    assert meter.meter.errors == 0
    table = reports.meter(tmp_path / "pl")
    assert table["traced"].tolist() == [True, True, True, False, False, False]
    # two micro-batches 1,634 + 2,354 = 3,988; the short step one: 817 + 1,081 = 1,898 (its gradients are new)
    assert table["model_flops"].tolist() == [3988, 3988, 1898, 3988, 3988, 1898]
    assert table["mfu"].notna().tolist() == [False, False, False, True, True, True]
