"""tracer.metering.callbacks: the Lightning callback (a stand-in Lightning base, the meter module's callbacks loaded
under it) after an exception in the step, at an epoch's short last step, without a forward call; the Hugging Face
callback after a run that raised. The model and its figures are tests/tracer/metering/test_meter_steps.py's."""

import sys
import types

import pytest
import torch

import reports
import tracer
from tests.tracer.metering.test_meter_steps import PEAK, TRAIN_MODEL, Net, _leftovers
from tracer.metering import meter as meter_module


def test_lightning_callback_closes_the_meter_when_the_step_raises(tmp_path, monkeypatch):
    """Lightning calls `on_exception`, not `on_train_end`, when a step raises (Ctrl-C included): the meter must
    come off then, not stay with its hooks and, in a traced step, the tracer's dispatch mode."""

    class Callback:  # Lightning's base: every hook a no-op
        def on_exception(self, trainer, pl_module, exception):
            pass

    callbacks = _stand_in_lightning(monkeypatch, "meter_callbacks_review", base=Callback)

    before = _leftovers()
    torch.manual_seed(0)
    net = Net()
    trainer = types.SimpleNamespace(accumulate_grad_batches=1)
    cb = callbacks.LightningMeter(tmp_path / "pl", tokens=2, peak_flops=PEAK)
    cb.on_train_start(trainer, net)
    cb.on_train_batch_start(trainer, net, None, 0)
    net(torch.randn(2, 8))
    assert _leftovers() != before  # the first step is traced: hooks and the mode are in place
    error = KeyboardInterrupt()
    cb.on_exception(trainer, net, error)  # as Lightning's _call_and_handle_interrupt does
    assert _leftovers() == before
    meta = tracer.read_metadata(tmp_path / "pl")
    assert meta["complete"] is False and meta["error"] == "KeyboardInterrupt: "


def test_hf_callback_after_a_run_that_raised_starts_anew(tmp_path):
    """Trainer calls no callback when a step raises: the next `trainer.train()` (a notebook's retry) began a second
    Meter while the first was open, and Meter raised TraceError ('another Tracer is already active') into it."""
    pytest.importorskip("transformers")
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    from tracer.metering.callbacks import MeterCallback

    before = _leftovers()
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    callback = MeterCallback(tmp_path / "hf", tokens=2, peak_flops=PEAK)
    handler = CallbackHandler([callback], net, None, opt, None)
    args, state, control = None, TrainerState(), TrainerControl()
    control = handler.on_train_begin(args, state, control)
    control = handler.on_step_begin(args, state, control)
    with pytest.raises(RuntimeError, match="a bad batch"):
        net(torch.randn(2, 8))
        raise RuntimeError("a bad batch")  # Trainer.train raises out; on_train_end never runs
    control = handler.on_train_begin(args, state, control)  # train() again
    for _ in range(2):
        control = handler.on_step_begin(args, state, control)
        net(torch.randn(2, 8)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        control = handler.on_step_end(args, state, control)
    handler.on_train_end(args, state, control)
    assert _leftovers() == before
    meta = tracer.read_metadata(tmp_path / "hf")  # the second run's trace, written over the first
    assert meta["complete"] is True
    assert reports.meter(tmp_path / "hf")["model_flops"].tolist() == [TRAIN_MODEL] * 2  # 1896: 948 · 2


def _epochs_of_5_batches(tmp_path, monkeypatch, name, **trainer):
    """2 epochs of 5 batches, 2 accumulated, under LightningMeter: Lightning steps the optimizer after batches 1, 3
    and 4 (the last batch ends the epoch's accumulation). The meter's table."""
    callbacks = _stand_in_lightning(monkeypatch, name)

    torch.manual_seed(0)
    net = Net()
    net.log_dict = lambda values, **kwargs: None
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    trainer = types.SimpleNamespace(accumulate_grad_batches=2, is_last_batch=False, **trainer)
    cb = callbacks.LightningMeter(tmp_path / name, tokens=4, peak_flops=PEAK)
    cb.on_train_start(trainer, net)
    for _epoch in range(2):
        for i in range(5):
            trainer.is_last_batch = i == 4
            cb.on_train_batch_start(trainer, net, None, i)
            net(torch.randn(2, 8)).square().sum().backward()
            if i % 2 or i == 4:
                opt.step()
                opt.zero_grad()
            cb.on_train_batch_end(trainer, net, None, None, i)
    cb.on_train_end(trainer, net)
    assert cb.meter.errors == 0
    return reports.meter(tmp_path / name)


def test_lightning_callback_meters_the_short_step_at_an_epoch_s_end(tmp_path, monkeypatch):
    """Without `num_training_batches` (an iterable dataset's unknown length) the short step cannot be told ahead.
    Before the fix the step of batch 4 was never ended: it ran into the next epoch's first step."""
    table = _epochs_of_5_batches(tmp_path, monkeypatch, "unknown_length")
    assert table["step"].tolist() == [0, 1, 2, 3, 4, 5]  # 3 optimizer steps an epoch
    # two micro-batches: 2 · 1896 + the second's gradients added into the first's 8·16 + 16·4 = 3984; batch 4's step
    # alone (1896) is a new signature, and the step after it, of two micro-batches, is what gets traced: unknown
    assert table["model_flops"].tolist()[:2] == [3984, 3984] and table["model_flops"].tolist()[3:5] == [3984, 3984]
    assert table["model_flops"].isna().tolist() == [False, False, True, False, False, True]
    assert table["traced"].tolist() == [True, True, False, True, False, False]


def test_lightning_callback_traces_the_epoch_s_short_step_once(tmp_path, monkeypatch):
    """With Lightning's `num_training_batches`, the short step that ends the first epoch is traced itself
    (`Meter.begin(trace=True)`): it has its own FLOPs, the next epoch's first step is metered, not traced, and the
    next epoch's short step reuses the first one's FLOPs, with an MFU."""
    table = _epochs_of_5_batches(tmp_path, monkeypatch, "known_length", num_training_batches=5)
    assert table["traced"].tolist() == [True, True, True, False, False, False]
    # 2 · 1896 + 8·16 + 16·4 = 3984 for two micro-batches; batch 4's step alone: 1896 (its gradients are new)
    assert table["model_flops"].tolist() == [3984, 3984, 1896, 3984, 3984, 1896]
    assert table["mfu"].notna().tolist() == [False, False, False, True, True, True]


def _stand_in_lightning(monkeypatch, name, base=object):
    """tracer.metering.callbacks loaded against a stand-in `lightning.pytorch` whose Callback is `base` (Lightning is
    not installed here)."""
    import importlib.util

    fake = types.ModuleType("lightning.pytorch")
    fake.Callback = base
    monkeypatch.setitem(sys.modules, "lightning", types.ModuleType("lightning"))
    monkeypatch.setitem(sys.modules, "lightning.pytorch", fake)
    spec = importlib.util.spec_from_file_location(name, meter_module.__file__.replace("meter.py", "callbacks.py"))
    callbacks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(callbacks)
    return callbacks


def test_lightning_callback_sees_a_batch_change_when_forward_is_never_called(tmp_path, monkeypatch):
    """Lightning runs `training_step(batch, batch_idx)`; a module whose step calls its submodules (self.fc1(x), as
    Lightning's own examples do) never calls its forward, so the root's inputs were never seen: a smaller batch kept
    the first trace's FLOPs."""
    callbacks = _stand_in_lightning(monkeypatch, "meter_callbacks_review_batch")
    torch.manual_seed(0)
    net = Net()
    net.log_dict = lambda values, **kwargs: None
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    trainer = types.SimpleNamespace(accumulate_grad_batches=1)
    cb = callbacks.LightningMeter(tmp_path / "pl", tokens=2, peak_flops=PEAK)
    cb.on_train_start(trainer, net)
    for i, b in enumerate((2, 2, 3, 3)):
        batch = torch.randn(b, 8)
        cb.on_train_batch_start(trainer, net, batch, i)
        net.fc2(torch.relu(net.fc1(batch))).square().sum().backward()  # training_step: no net(batch)
        opt.step()
        opt.zero_grad()
        cb.on_train_batch_end(trainer, net, None, batch, i)
    cb.on_train_end(trainer, net)
    table = reports.meter(tmp_path / "pl")
    assert table["traced"].tolist() == [True, True, False, True]
    assert table["model_flops"].tolist() == [1896, 1896, 2844, 2844]  # 948 · 2, 948 · 3 (step 2 from step 3's trace)
