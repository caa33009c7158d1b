"""Meter callbacks for training frameworks: the Hugging Face `Trainer` and, when it is installed, Lightning.

Each makes a `tracer.metering.meter.Meter` when training starts (the model the framework trains is
the root), brackets every optimizer step with `begin()` and `step()`, so evaluation,
checkpoints and logging between steps stay out of the step time, hands the figures to
the framework's logger and closes the trace when training ends.

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[MeterCallback("runs/hf")])

Logged keys: `mfu`, `hfu`, `step_time_s`, `tokens_per_s` (those known; nothing for a traced
step, whose time is traced time).
"""

import importlib

from tracer.errors import TraceError
from tracer.metering.meter import Meter

__all__ = ["MeterCallback", "logged"]

LOGGED = ("mfu", "hfu", "step_time_s", "tokens_per_s")

try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError:  # the class still imports; the Trainer is what needs transformers
    _TrainerCallback = object


def logged(figures):
    """The figures `Meter.step` returned that a logger takes: the LOGGED keys that are known; none for a
    traced step (its time is traced time)."""
    if not figures or figures.get("traced"):
        return {}
    return {key: figures[key] for key in LOGGED if figures.get(key) is not None}


class MeterCallback(_TrainerCallback):
    """Meter every optimizer step of a Hugging Face `Trainer` run (see `tracer.metering.meter.Meter`).

    tokens  tokens per optimizer step; default: the step's growth of the Trainer's
            `num_input_tokens_seen` (TrainingArguments(include_num_input_tokens_seen=...)), else unknown.
    Other keywords (peak_flops=, run_name=, ...) go to the Meter. `meter` is the Meter while training runs.
    The figures of the last step metered since the previous log go into the next `on_log`'s logs (and
    into `state.log_history`), so loggers called after this callback (the printer, callbacks added later)
    see them; a log with no step metered since the previous one (a second log of the step, an evaluation)
    and the train summary (`train_loss`) get none."""

    def __init__(self, path, *, tokens=None, **meter_kwargs):
        self.path, self.tokens, self.meter_kwargs = path, tokens, meter_kwargs
        self.meter, self._figures, self._seen = None, None, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.meter is not None:  # the last run raised in a step (Trainer then calls no callback): it ends here
            self.meter.close(TraceError("MeterCallback: the training run stopped before on_train_end"))
        self.meter = Meter(self.path, model=model, tokens=self.tokens, **self.meter_kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.meter is not None:
            self._seen = getattr(state, "num_input_tokens_seen", None)
            self.meter.begin()

    def on_step_end(self, args, state, control, **kwargs):
        if self.meter is None:
            return
        tokens = None
        seen = getattr(state, "num_input_tokens_seen", None)
        if self.tokens is None and isinstance(seen, int) and isinstance(self._seen, int) and seen > self._seen:
            tokens = seen - self._seen
        figures = logged(self.meter.step(tokens))
        if figures:  # a traced step logs nothing and keeps the figures of a step metered before it
            self._figures = figures

    def on_log(self, args, state, control, logs=None, **kwargs):
        # the train summary holds train_loss; every log holds train_runtime when tokens are counted (transformers 5)
        if not self._figures or logs is None or "train_loss" in logs:
            return
        figures, self._figures = self._figures, None  # each metered step's figures go into one log
        logs.update(figures)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(figures)

    def on_train_end(self, args, state, control, **kwargs):
        if self.meter is not None:
            self.meter.close()


def _lightning():
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def __getattr__(name):
    """`LightningMeter`, made at its first use: importing Lightning takes about 2 s, which `MeterCallback`'s users
    (Hugging Face) should not pay for having it installed (tests/tracer/metering/test_meter.py runs it against a stand-in)."""
    if name != "LightningMeter":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    pl = _lightning()
    if pl is None:
        raise AttributeError(
            "LightningMeter needs Lightning (lightning.pytorch or pytorch_lightning), which is not installed"
        )
    made = globals()["LightningMeter"] = _lightning_meter(pl)
    return made


def _lightning_meter(pl):
    class LightningMeter(pl.Callback):
        """Meter every optimizer step of a Lightning run; logs the figures with `pl_module.log_dict`.

        A validation Lightning runs inside a step (it validates every `val_check_interval` batches, between two
        micro-batches of an accumulated step too) is held out of the step: its time, its root calls (the step
        keeps its training signature) and, in a traced step, its ops (the tracer pauses for it, so the step's
        rows span two tracer steps)."""

        def __init__(self, path, *, tokens=None, **meter_kwargs):
            self.path, self.tokens, self.meter_kwargs, self.meter = path, tokens, meter_kwargs, None
            self._open = False  # a step begun and not ended (a validation inside it is held out of it)
            self._short_traced = False  # the epoch's short last step was asked to be traced

        def on_train_start(self, trainer, pl_module):
            self.meter = Meter(self.path, model=pl_module, tokens=self.tokens, **self.meter_kwargs)

        def _boundary(
            self, trainer, batch_idx
        ):  # the optimizer steps: each accumulate_grad_batches, and at an epoch's end
            every = max(1, getattr(trainer, "accumulate_grad_batches", 1))
            return (batch_idx + 1) % every == 0 or bool(getattr(trainer, "is_last_batch", False))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.meter is None:
                return
            every = max(1, getattr(trainer, "accumulate_grad_batches", 1))
            if batch_idx % every == 0:
                self.meter.begin(trace=self._short(trainer, batch_idx, every))
                self._open = True
            self.meter._note_inputs(batch)  # training_step(batch) need not call the module's forward

        def _short(self, trainer, batch_idx, every):
            """Whether the step beginning at `batch_idx` is the epoch's short last step (fewer micro-batches than
            accumulated: Lightning steps at an epoch's end), met for the first time: traced, so that it has its own
            FLOPs and the next epoch's first step is not traced again in its place."""
            batches = getattr(trainer, "num_training_batches", None)
            if self._short_traced or not isinstance(batches, int) or batch_idx + every <= batches:
                return False
            self._short_traced = True
            return True

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.meter is not None and self._boundary(trainer, batch_idx):
                self._open = False
                figures = logged(self.meter.step())
                if figures:
                    pl_module.log_dict(figures, on_step=True, on_epoch=False)

        def on_validation_start(self, trainer, pl_module):
            if self.meter is not None and self._open:
                self.meter._hold()

        def on_validation_end(self, trainer, pl_module):
            if self.meter is not None:
                self.meter._release()

        def on_train_end(self, trainer, pl_module):
            if self.meter is not None:
                self.meter.close()

        def on_exception(self, trainer, pl_module, exception):
            """A step raised (Ctrl-C included; Lightning then skips on_train_end): the trace closes incomplete."""
            if self.meter is not None:
                self.meter.close(exception)

    return LightningMeter
