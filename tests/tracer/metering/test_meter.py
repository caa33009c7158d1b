"""tracer.metering.meter.Meter: per-step MFU from one traced step per signature; reports.meter; the report section; callbacks."""

import json
import sys

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import reports
import tracer
from reports.errors import ReportError
from reports.output.cli import main as optrace
from tests.helpers import forked, tiny_gpt2, trainer_arguments, unwrapped
from tracer.errors import TraceError
from tracer.metering import meter as meter_module
from tracer.metering.meter import Meter

PEAK = 1e9  # FLOP/s, given: the figures do not depend on this machine's CPU


class Net(nn.Module):
    """x [B, 8] -> fc1 [8 -> 16] -> relu -> fc2 [16 -> 4] (-> extra [4 -> 4] when branch), no biases."""

    def __init__(self, ckpt=False):
        super().__init__()
        self.fc1 = nn.Linear(8, 16, bias=False)
        self.fc2 = nn.Linear(16, 4, bias=False)
        self.extra = nn.Linear(4, 4, bias=False)
        self.ckpt = ckpt

    def forward(self, x, branch=False):
        first = lambda x: torch.relu(self.fc1(x))  # noqa: E731
        h = checkpoint(first, x, use_reentrant=False) if self.ckpt else first(x)
        h = self.fc2(h)
        return self.extra(h) if branch else h


# Per step at batch B (x needs no gradient; loss = out.square().sum(); SGD, one add_ per parameter element):
#   forward   fc1 2·B·8·16 + relu B·16 + fc2 2·B·16·4 + square B·4 + sum B·4 = 408·B
#   backward  square's grad 3·B·4 + fc2 dW and dx 2·2·B·16·4 + relu grad B·16 + fc1 dW 2·B·8·16 = 540·B
#   model     948·B; optimizer 8·16 + 16·4 = 192 (+ 4·4 = 16 with extra's gradient)
def model_flops(b, branch=False):
    return 948 * b + (2 * b * 4 * 4 * 3 if branch else 0)  # extra: forward 2·B·4·4, backward dW and dx twice that


def run(path, batches, branches=None, ckpt=False, metered=True, **kwargs):
    """Train Net with SGD on seeded batches; return (losses, figures per step)."""
    torch.manual_seed(0)
    net = Net(ckpt)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    branches = branches or [False] * len(batches)
    xs = [torch.randn(b, 8) for b in batches]
    m = Meter(path, model=net, tokens=2, peak_flops=PEAK, **kwargs) if metered else None
    losses, figures = [], []
    for x, branch in zip(xs, branches):
        loss = net(x, branch=branch).square().sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if m is not None:
            figures.append(m.step())
    if m is not None:
        m.close()
    return losses, figures


def test_fixed_shapes_reuse_the_traced_flops_and_give_the_traced_mfu(tmp_path):
    path = tmp_path / "fixed"
    losses, figures = run(path, [2, 2, 2, 2])
    assert [f["traced"] for f in figures] == [True, True, False, False]  # the first two steps traced
    assert [f["model_flops"] for f in figures] == [1896] * 4  # 948 * 2
    assert [f["hardware_flops"] for f in figures] == [2088] * 4  # 1896 + optimizer 192
    assert figures[0]["mfu"] is None and figures[1]["mfu"] is None  # traced time is not step time
    df = reports.load(path)
    assert df["step"].nunique() == 2  # two steps traced, two metered
    for f in figures[2:]:
        seconds = f["step_time_s"]
        assert f["mfu"] == 1896 / seconds / PEAK and f["hfu"] == 2088 / seconds / PEAK
        assert f["tokens_per_s"] == 2 / seconds
        traced = reports.mfu(df, step_time_s=seconds, peak_flops=PEAK).iloc[0]
        assert (traced["model_flops_per_step"], traced["hardware_flops_per_step"]) == (1896, 2088)
        assert f["mfu"] == traced["mfu"] and f["hfu"] == traced["hfu"]
    table = reports.meter(path)
    assert table["mfu"].tolist()[2:] == [f["mfu"] for f in figures[2:]]
    assert table["mfu"].isna().tolist() == [True, True, False, False]
    assert table["flops_from_step"].tolist() == [0, 1, 1, 1]  # step 1's trace serves the steps after it
    assert table.equals(reports.meter(df))
    assert losses == run(tmp_path / "plain", [2, 2, 2, 2], metered=False)[0]  # the program's numbers are unchanged


def test_warmup_steps_run_untraced_and_get_the_later_trace_s_flops(tmp_path):
    _, figures = run(tmp_path / "warm", [2, 2, 2, 2], warmup=2)
    assert [f["traced"] for f in figures] == [False, False, True, False]
    assert [f["model_flops"] for f in figures] == [None, None, 1896, 1896]  # 948 · 2, once traced
    assert reports.meter(tmp_path / "warm")["model_flops"].tolist() == [1896] * 4
    assert reports.load(tmp_path / "warm")["step"].nunique() == 1


def test_a_batch_change_retraces_exactly_one_step(tmp_path):
    path = tmp_path / "shapes"
    losses, figures = run(path, [2, 2, 3, 3, 3])
    assert [f["traced"] for f in figures] == [True, True, False, True, False]  # steps 0 and 1, then 3
    assert figures[2]["model_flops"] is None  # new shapes: no FLOPs yet, the next step is traced
    assert [f["model_flops"] for f in figures[3:]] == [2844, 2844]  # 948 * 3
    assert figures[4]["hardware_flops"] == 3036  # 2844 + 192
    meta = tracer.read_metadata(path)["meter"]
    assert len(meta["traces"]) == 3 and meta["traces"][2]["trace_steps"] == [2, 2]
    table = reports.meter(path)
    assert table["model_flops"].tolist() == [1896, 1896, 2844, 2844, 2844]  # step 2 filled from step 3's trace
    assert table["flops_from_step"].tolist() == [0, 1, 3, 3, 3]
    assert losses == run(tmp_path / "plain", [2, 2, 3, 3, 3], metered=False)[0]


def test_a_sequence_length_change_retraces(tmp_path):
    torch.manual_seed(0)
    net = nn.Linear(8, 4, bias=False)
    m = Meter(tmp_path / "seq", model=net, peak_flops=PEAK)
    found = []
    for s in (3, 3, 3, 5, 5):
        net(torch.randn(2, s, 8)).sum().backward()  # no optimizer: the meter's step() ends the step
        net.zero_grad()  # else the gradient of steps 1 on adds into the last (8·4 more FLOPs than step 0)
        found.append(m.step())
    m.close()
    assert [f["traced"] for f in found] == [True, True, False, False, True]
    # forward 2·(2·s)·8·4 + sum 2·s·4; backward dW 2·(2·s)·8·4 (x needs no gradient): 264·s
    assert [f["model_flops"] for f in found] == [792, 792, 792, None, 1320]


def test_a_branch_taken_sometimes_retraces_once(tmp_path):
    path = tmp_path / "branch"
    branches = [False, False, False, True, True, False, True]
    losses, figures = run(path, [2] * 7, branches)
    assert [f["traced"] for f in figures] == [True, True, False, False, True, False, False]
    assert model_flops(2, True) == 2088  # 1896 + 3 · 2·2·4·4
    assert [f["model_flops"] for f in figures] == [1896, 1896, 1896, None, 2088, 1896, 2088]
    assert figures[6]["hardware_flops"] == 2088 + 192 + 16  # extra's add_ too
    assert reports.meter(path)["model_flops"].tolist() == [1896, 1896, 1896, 2088, 2088, 1896, 2088]
    assert losses == run(tmp_path / "plain", [2] * 7, branches, metered=False)[0]


def test_a_branch_outside_any_module_retraces_once(tmp_path):
    """The signature counts the autograd nodes a step makes, so a branch in plain code (no module called) is a new
    signature as a module's is: steps 3 and 4 square the output once more (forward B·4, backward 3·B·4)."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    m = Meter(tmp_path / "op", model=net, tokens=2, peak_flops=PEAK)
    found = []
    for twice in (False, False, False, True, True, False):
        out = net(torch.randn(2, 8))
        if twice:
            out = out.square()
        out.square().sum().backward()
        opt.step()
        opt.zero_grad()
        found.append(m.step())
    m.close()
    assert [f["traced"] for f in found] == [True, True, False, False, True, False]
    # 1896 + forward square 2·4 + backward 3·2·4 = 1928
    assert [f["model_flops"] for f in found] == [1896, 1896, 1896, None, 1928, 1896]


@pytest.mark.parametrize("given", [True, False], ids=["model", "first-module"])
def test_metered_steps_leave_module_calls_on_pytorch_s_fast_path(tmp_path, given):
    """After the traced steps (the first two) the meter keeps two hooks, on the root (a pre-hook that counts the
    modules of a root call without grad, and the forward hook that notes its inputs): no global module hook (which
    sends every module call through Module._call_impl's hook path), with model= or with the first module called
    as root."""
    from torch.nn.modules import module as module_hooks

    torch.manual_seed(0)
    net = Net()
    before = (len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks))
    m = Meter(tmp_path / "hooks", model=net if given else None, tokens=2, peak_flops=PEAK)
    for i in range(4):
        net(torch.randn(2, 8)).square().sum().backward()
        net.zero_grad(set_to_none=True)
        m.step()
        if i == 0:  # step 1 is traced too: the tracer's hooks are on for it
            continue
        hooks = (len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks))
        assert hooks == before
        assert [len(mod._forward_pre_hooks) + len(mod._forward_hooks) for mod in net.modules()] == [2, 0, 0, 0]
    m.close()
    assert [len(mod._forward_hooks) for mod in net.modules()] == [0, 0, 0, 0]
    assert reports.meter(tmp_path / "hooks")["traced"].tolist() == [True, True, False, False]


def test_with_begin_an_evaluation_between_steps_stays_out_of_the_retrace(tmp_path):
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    m = Meter(tmp_path / "eval", model=net, tokens=2, peak_flops=PEAK)
    found = []
    for b in (2, 2, 2, 3, 3):
        m.begin()
        net(torch.randn(b, 8)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        found.append(m.step())
        with torch.no_grad():  # an evaluation between steps: neither timed nor traced
            net(torch.randn(5, 8))
    m.close()
    assert [f["traced"] for f in found] == [True, True, False, False, True]
    assert [f["model_flops"] for f in found] == [1896, 1896, 1896, None, 2844]  # 948 · 2, 948 · 3


def test_checkpoint_recompute_is_hardware_not_model_flops(tmp_path):
    _, figures = run(tmp_path / "ckpt", [2, 2, 2], ckpt=True)  # steps 0 and 1 traced, step 2 metered
    # checkpointing re-runs fc1 and relu in the backward: 2·2·8·16 + 2·16 = 544
    assert [f["model_flops"] for f in figures] == [1896, 1896, 1896]
    assert figures[2]["hardware_flops"] == 2088 + 544
    table = reports.meter(tmp_path / "ckpt")
    assert table["recompute_flops"].tolist() == [544, 544, 544]
    df = reports.load(tmp_path / "ckpt")
    traced = reports.mfu(df, step_time_s=figures[2]["step_time_s"], peak_flops=PEAK).iloc[0]
    assert figures[2]["mfu"] == traced["mfu"] and figures[2]["hfu"] == traced["hfu"]


def test_fused_attention_and_dtype_as_reports_mfu_count_them(tmp_path):
    """The example GPT with SDPA: the meter's model FLOPs drop the score recomputation as reports.mfu does,
    and the peak comes from the same table for the same dtype."""
    from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step

    torch.manual_seed(0)
    cfg = GPTConfig(attention="sdpa", n_layer=1, d_model=16, n_head=2, seq_len=8, vocab_size=32)
    model, idx_targets = GPT(cfg), make_batch(cfg, 2)
    opt = make_optimizer(model)
    m = Meter(tmp_path / "gpt", model=model, tokens=16)
    for _ in range(3):  # steps 0 and 1 traced, step 2 metered
        train_step(model, opt, *idx_targets)
        f = m.step()
    m.close()
    traced = reports.mfu(reports.load(tmp_path / "gpt"), step_time_s=f["step_time_s"]).iloc[0]
    assert traced["recompute_flops_per_step"] > 0  # the fused backward's q @ kᵀ
    assert (f["model_flops"], f["hardware_flops"]) == (
        traced["model_flops_per_step"],
        traced["hardware_flops_per_step"],
    )
    assert reports.meter(tmp_path / "gpt")["dtype"].iloc[2] == traced["dtype"] == "float32"
    assert f["mfu"] == pytest.approx(traced["mfu"], rel=1e-12)  # the CPU's ideal peak, looked up on both sides


def test_the_table_is_written_while_the_run_goes_on(tmp_path):
    torch.manual_seed(0)
    net = nn.Linear(4, 2, bias=False)
    m = Meter(tmp_path / "long", model=net, peak_flops=PEAK)
    for _ in range(17):
        net(torch.ones(1, 4)).sum().backward()
        net.zero_grad()
        m.step()
    written = tracer.read_metadata(tmp_path / "long")["meter"]["steps"]["step"]
    # steps 0 and 1 traced; written when 3, 6 and 12 steps were in the table (the next at 24): 12 >= 17 / 2
    assert written == list(range(12))
    m.close()
    assert len(reports.meter(tmp_path / "long")) == 17


def test_cuda_steps_are_synchronised(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    sync = meter_module._sync_for(torch.device("cuda", 1))
    sync()
    assert calls == [torch.device("cuda", 1)]
    monkeypatch.setattr(meter_module, "cuda_in_use", lambda: False)
    assert meter_module._sync_for(torch.device("cpu")) is None
    monkeypatch.setattr(meter_module, "cuda_in_use", lambda: True)
    assert meter_module._sync_for(torch.device("cpu")) is meter_module.sync_all_cuda


def test_every_step_boundary_waits_for_the_device(tmp_path, monkeypatch):
    waits = []
    monkeypatch.setattr(meter_module, "_sync_for", lambda device: lambda: waits.append(device.type))
    run(tmp_path / "sync", [2, 2, 2])
    # the starts of steps 1 and 2 (after each trace is read back), the ends of steps 1 and 2, and the clock read
    # again after step 2's table write (3 steps in the table: the first metered step's write)
    assert waits == ["cpu"] * 5


def test_a_failing_meter_warns_once_and_the_program_runs_on(tmp_path, monkeypatch):
    def broken(rows):
        raise RuntimeError("boom")

    monkeypatch.setattr(meter_module, "step_flops", broken)
    with pytest.warns(UserWarning, match="meter: could not meter a step"):
        losses, figures = run(tmp_path / "broken", [2, 2, 2, 2])
    assert losses == run(tmp_path / "plain", [2, 2, 2, 2], metered=False)[0]
    assert [f["traced"] for f in figures] == [True, True, False, True]  # a failed read does not stop re-tracing
    assert [f["model_flops"] for f in figures] == [None] * 4
    meta = tracer.read_metadata(tmp_path / "broken")["meter"]
    assert meta["errors"] == 3 and meta["steps"]["step"] == [0, 1, 2, 3]  # every step stays in the table


def test_re_tracing_stops_after_three_failed_reads(tmp_path, monkeypatch):
    def broken(rows):
        raise RuntimeError("boom")

    monkeypatch.setattr(meter_module, "step_flops", broken)
    with pytest.warns(UserWarning, match="meter: could not meter a step"):
        _, figures = run(tmp_path / "broken", [2] * 8)
    # traced, traced (the second step), new, traced (3 failures), then timed only
    assert [f["traced"] for f in figures] == [True, True, False, True, False, False, False, False]


def test_bad_input_is_one_line():
    with pytest.raises(TraceError, match="Meter: peak_flops must be FLOP/s > 0 or None, got -1"):
        Meter("unused", peak_flops=-1)
    with pytest.raises(
        TraceError, match=r"Meter: warmup must be an int >= 0 \(steps run before the first trace\), got -2"
    ):
        Meter("unused", warmup=-2)
    with pytest.raises(TraceError, match=r"Meter: max_traces must be an int >= 1 \(steps traced at most\), got 0"):
        Meter("unused", max_traces=0)
    with pytest.raises(ReportError, match="meter: expected a trace path or a DataFrame from reports.load, got int"):
        reports.meter(3)


def test_a_trace_without_a_meter_has_an_empty_table_and_no_section(tmp_path, capsys):
    net = nn.Linear(4, 2)
    with tracer.Tracer(tmp_path / "plain", model=net):
        net(torch.ones(1, 4)).sum().backward()
    assert len(reports.meter(tmp_path / "plain")) == 0 and "mfu" in reports.meter(tmp_path / "plain")
    optrace(["report", str(tmp_path / "plain")])
    assert "Meter:" not in capsys.readouterr().out


def test_the_report_shows_the_meter(tmp_path, capsys):
    run(tmp_path / "r", [2, 2, 2, 3, 3])
    optrace(["report", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert "Meter: 5 steps, 2 metered untraced (medians over them), traced: step 0, 1, 4" in out
    optrace(["report", str(tmp_path / "r"), "--json"])
    found = json.loads(capsys.readouterr().out)["meter"]
    assert (found["steps"], found["traced_steps"], found["metered_steps"], found["unknown_flops_steps"]) == (
        5,
        [0, 1, 4],
        2,
        0,
    )
    assert found["mfu"]["min"] > 0


def test_under_w_error_nothing_raises(tmp_path):
    code = (
        "import torch; from tracer.metering.meter import Meter\n"
        "torch.manual_seed(0); net = torch.nn.Linear(4, 2); opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        f"m = Meter({str(tmp_path / 'w')!r}, model=net, tokens=1)\n"
        "for b in (1, 1, 2, 2):\n"
        "    net(torch.ones(b, 4)).sum().backward(); opt.step(); opt.zero_grad(); print(m.step()['traced'])\n"
        "m.close()\n"
    )
    done = forked.run(
        code,
        flags=("-W", "error"),
        cwd=tmp_path,
        env={"PYTHONPATH": str(meter_module.__file__.rsplit("/tracer/", 1)[0])},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False", "True"]


def _check_hf_logs(history, path):
    logged = [h for h in history if "loss" in h]
    assert [h["step"] for h in logged] == [1, 2, 3, 4]
    assert "mfu" not in logged[0] and "mfu" not in logged[1]  # the traced steps: their time is traced time
    assert all(h["mfu"] > 0 and h["hfu"] >= h["mfu"] and h["tokens_per_s"] > 0 for h in logged[2:])
    table = reports.meter(path)
    assert table["traced"].tolist() == [True, True, False, False]
    assert table["mfu"].tolist()[2:] == [h["mfu"] for h in logged[2:]]
    assert table["model_flops"].nunique() == 1  # fixed shapes: the second trace's FLOPs are the first's


def _hf_handler(tmp_path):
    """A tiny GPT-2, its optimizer and a MeterCallback driven by transformers' own CallbackHandler, the training
    begun: (model, ids, opt, callback, handler, args, state, control)."""
    transformers = pytest.importorskip("transformers")
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    from tracer.metering.callbacks import MeterCallback

    model, ids = tiny_gpt2(transformers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    callback = MeterCallback(tmp_path / "hf", tokens=16, peak_flops=PEAK)
    handler = CallbackHandler([callback], model, None, opt, None)
    args, state, control = None, TrainerState(), TrainerControl()
    control = handler.on_train_begin(args, state, control)
    return model, ids, opt, callback, handler, args, state, control


def test_hf_callback_logs_mfu_for_every_metered_step(tmp_path):
    """The callback driven by transformers' own CallbackHandler, in the order Trainer calls it (Trainer itself
    needs accelerate, which the dev extra does not install: the next test runs it where it is)."""
    model, ids, opt, callback, handler, args, state, control = _hf_handler(tmp_path)
    for batch in ids.split(2):
        control = handler.on_step_begin(args, state, control)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        state.global_step += 1
        control = handler.on_step_end(args, state, control)
        logs = {"loss": loss.item()}  # Trainer.log: the history gets a copy, then on_log runs
        state.log_history.append({**logs, "step": state.global_step})
        control = handler.on_log(args, state, control, logs=logs)
    handler.on_train_end(args, state, control)
    _check_hf_logs(state.log_history, tmp_path / "hf")


@pytest.mark.parametrize("tokens_seen", [False, True])
def test_hf_trainer_callback_logs_mfu_for_every_metered_step(tmp_path, tokens_seen):
    """With include_num_input_tokens_seen, the tokens per step come from the Trainer's count, and transformers 5
    puts train_runtime into every log: only the train summary (train_loss) gets no figures."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # Trainer needs it
    from tracer.metering.callbacks import MeterCallback

    model, ids = tiny_gpt2(transformers)
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = trainer_arguments(transformers, tmp_path / "out", max_steps=4, include_num_input_tokens_seen=tokens_seen)
    callback = MeterCallback(tmp_path / "hf", tokens=None if tokens_seen else 16, peak_flops=PEAK)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    _check_hf_logs(trainer.state.log_history, tmp_path / "hf")
    summary = trainer.state.log_history[-1]
    assert "train_loss" in summary and "mfu" not in summary  # the summary is no step's log
    if tokens_seen:  # 2 rows of 8 tokens a step, counted by the Trainer
        assert reports.meter(tmp_path / "hf")["tokens"].tolist()[2:] == [16, 16]


def test_lightning_callback_with_a_stand_in_lightning(tmp_path, monkeypatch):
    """Lightning is not installed here: a stand-in `lightning.pytorch` with a plain Callback base runs the
    callback's logic as Lightning calls it, with 2 micro-batches accumulated per optimizer step."""
    import importlib.util
    import types

    fake = types.ModuleType("lightning.pytorch")
    fake.Callback = object
    monkeypatch.setitem(sys.modules, "lightning", types.ModuleType("lightning"))
    monkeypatch.setitem(sys.modules, "lightning.pytorch", fake)
    spec = importlib.util.spec_from_file_location(
        "meter_callbacks_copy", meter_module.__file__.replace("meter.py", "callbacks.py")
    )
    callbacks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(callbacks)  # a copy: the real module keeps its import-time view

    class Module(Net):
        logged = []

        def log_dict(self, values, **kwargs):
            self.logged.append(values)

    torch.manual_seed(0)
    net = Module()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    trainer = types.SimpleNamespace(accumulate_grad_batches=2)
    cb = callbacks.LightningMeter(tmp_path / "pl", tokens=4, peak_flops=PEAK)
    cb.on_train_start(trainer, net)
    for i in range(8):
        cb.on_train_batch_start(trainer, net, None, i)
        net(torch.randn(2, 8)).square().sum().backward()
        if i % 2:
            opt.step()
            opt.zero_grad()
        cb.on_train_batch_end(trainer, net, None, None, i)
    cb.on_train_end(trainer, net)
    assert len(net.logged) == 2 and all(d["mfu"] > 0 for d in net.logged)  # the metered steps 2 and 3
    table = reports.meter(tmp_path / "pl")
    # two micro-batches of 948 · 2, and the second one's gradients added into the first's: 8·16 + 16·4
    assert table["model_flops"].tolist() == [2 * 1896 + 192] * 4


def test_keyword_only_and_mapping_inputs_without_model_are_in_the_signature(tmp_path):
    """No model=: the first module called is the root, and its keyword and mapping inputs count from that call."""
    from collections import UserDict  # a mapping pytree does not walk, as a Hugging Face BatchEncoding

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8, bias=False)

        def forward(self, batch=None, *, x=None):
            return self.fc(x if batch is None else batch["x"]).sum()

    torch.manual_seed(0)
    net = Net()
    xs = {b: torch.randn(b, 8) for b in (2, 16)}
    for name, call in (("kw", lambda b: net(x=xs[b])), ("map", lambda b: net(UserDict(x=xs[b])))):
        m = Meter(tmp_path / name, peak_flops=PEAK)
        found = []
        for b in (2, 2, 2, 16, 16):
            call(b).backward()
            net.zero_grad(set_to_none=True)
            found.append(m.step())
        m.close()
        assert [f["traced"] for f in found] == [True, True, False, False, True]
        # forward 2·B·8·8 + sum B·8, dW 2·B·8·8: B = 2: 256 + 16 + 256 = 528; B = 16: 2048 + 128 + 2048 = 4224
        assert [f["model_flops"] for f in found] == [528, 528, 528, None, 4224]


def test_the_dtype_rules_are_one_module_both_sides_use():
    """tracer/rules.py holds the rules; reports/flops (mfu, recompute, roles) and the meter import them."""
    from reports.flops import mfu, recompute, roles
    from tracer import rules
    from tracer.metering import flops as meter_flops

    assert roles._ADD_FIRST is rules.ADD_FIRST and recompute.score_share is rules.score_share
    assert mfu.dtype_rows is rules.dtype_rows and meter_flops.dtype_rows is rules.dtype_rows
    # no matmul or attention FLOPs: every row with FLOPs decides (a conv net)
    assert rules.dtype_rows([False, False, False], [0, 7776, 144]).tolist() == [False, True, True]
    assert rules.dtype_rows([False, True, False], [0, 512, 144]).tolist() == [False, True, False]
    assert rules.carrying_dtype(["bfloat16", "float32", "bfloat16"], [10, 30, 20]) == "bfloat16"  # 30 each: first seen
    assert rules.skipped_input("aten.addmm.default", 3) == 1 and rules.skipped_input("aten.addmm.default", 1) == 0
    # d_qk 8, d_v 8: 2·b·h·s·s·8 of 2·b·h·s·s·(3·8 + 2·8) = 1/5; d_qk 16, d_v 8: 16 / 64 = 1/4
    assert rules.score_share(4000, [[1], [1, 8], [1, 8], [1, 8]]) == 800
    assert rules.score_share(6400, [[1], [1, 16], [1, 16], [1, 8]]) == 1600


def test_dynamic_padding_traces_at_most_max_traces_steps_and_estimates_the_rest(tmp_path, capsys):
    """40 steps of 29 distinct sequence lengths (pad-to-longest): 8 steps traced, the other new lengths estimated."""
    torch.manual_seed(0)
    net = nn.Linear(8, 4, bias=False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    lengths = [3 + i % 29 for i in range(40)]  # 3..31, then 3..13 again
    m = Meter(tmp_path / "pad", model=net, peak_flops=PEAK)
    found = []
    for s in lengths:
        net(torch.randn(2, s, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        found.append(m.step())
    m.close()
    # steps 0 and 1 traced (the first two), then a new length the step after it is seen: steps 3, 5, ..., 13
    # (lengths 3, 4, then 6, 8, ..., 16), then the cap
    assert [f["step"] for f in found if f["traced"]] == [0, 1, 3, 5, 7, 9, 11, 13]
    # step 12 new (estimated at close), step 13 the last trace, steps 14 and 15 past the cap
    assert [f["flops_estimated"] for f in found[12:16]] == [False, False, True, True]
    # forward 2·(2·s)·8·4 + sum 2·s·4, dW 2·(2·s)·8·4: 264·s, linear in s, so the estimates are exact
    # (length 18 from 16's trace: 4,224 · (2·18·8) / (2·16·8) = 4,752 = 264 · 18); SGD's add_ 8·4 = 32, not scaled
    assert found[15]["model_flops"] == 4752 and found[15]["hardware_flops"] == 4752 + 32
    table = reports.meter(tmp_path / "pad")
    assert table["model_flops"].tolist() == [264 * s for s in lengths]
    assert table["hardware_flops"].tolist() == [264 * s + 32 for s in lengths]
    # estimated: the 6 lengths seen before the cap and never traced (steps 2, 4, ..., 12; at close), the 15 new ones
    # past it (steps 14..28: 17..31) and the 5 untraced among 3..13 seen again (5, 7, 9, 11, 13): 6 + 15 + 5 = 26
    assert int(table["flops_estimated"].sum()) == 26
    assert table.loc[table["flops_estimated"], "step"].tolist() == [*range(2, 13, 2), *range(14, 29), *range(31, 40, 2)]
    optrace(["report", str(tmp_path / "pad"), "--json"])
    summary = json.loads(capsys.readouterr().out)["meter"]
    assert (summary["estimated_flops_steps"], summary["unknown_flops_steps"], len(summary["traced_steps"])) == (
        26,
        0,
        8,
    )
    optrace(["report", str(tmp_path / "pad")])
    assert "26 steps have ESTIMATED FLOPs and MFU" in capsys.readouterr().out


def test_one_step_of_a_signature_never_seen_again_is_estimated(tmp_path, capsys):
    """A batch of 8 at step 3 only: its trace was due at step 4, which ran the old batch; the step is estimated at
    close, well within max_traces, and the report says why in the singular."""
    torch.manual_seed(0)
    net = nn.Linear(8, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with Meter(tmp_path / "once", model=net, tokens=4, peak_flops=PEAK) as m:
        for i in range(6):
            net(torch.randn(8 if i == 3 else 4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            m.step()
    table = reports.meter(tmp_path / "once")
    assert table["flops_estimated"].tolist() == [False, False, False, True, False, False]
    optrace(["report", str(tmp_path / "once")])
    out = unwrapped(capsys.readouterr().out)  # wrapped to the width
    assert "1 step has ESTIMATED FLOPs and MFU" in out and "the step after it ran another signature" in out


def test_no_traced_signature_fits_no_estimate(tmp_path):
    """Past the cap, a signature with other modules called (a branch) has no traced one to scale: no FLOPs."""
    _, figures = run(tmp_path / "cap", [2, 2, 2], [False, True, True], max_traces=1)
    assert [f["traced"] for f in figures] == [True, False, False]
    assert [f["model_flops"] for f in figures] == [1896, None, None]  # 948 · 2; the branch's never traced
    assert [f["flops_estimated"] for f in figures] == [False, False, False]


def test_a_run_that_crashes_is_closed_incomplete_at_exit(tmp_path):
    """A Meter never closed: the exit handler writes the table, and an unhandled exception marks the trace incomplete."""
    code = (
        "import torch; from tracer.metering.meter import Meter\n"
        "torch.manual_seed(0); net = torch.nn.Linear(4, 2, bias=False)\n"
        f"m = Meter({str(tmp_path / 'x')!r}, model=net, peak_flops=1e9)\n"
        "for _ in range(2):\n"
        "    net(torch.ones(1, 4)).sum().backward(); net.zero_grad(); m.step()\n"
        "raise RuntimeError('boom')\n"
    )
    done = forked.run(code, cwd=tmp_path, env={"PYTHONPATH": str(meter_module.__file__.rsplit("/tracer/", 1)[0])})
    assert done.returncode == 1 and "RuntimeError: boom" in done.stderr
    meta = tracer.read_metadata(tmp_path / "x")
    assert meta["complete"] is False and meta["error"] == "RuntimeError: boom"  # the exit handler closed it
    # forward 2·1·4·2 + sum 2, dW 2·1·4·2: 34 per step, both steps in the table
    assert reports.meter(tmp_path / "x")["model_flops"].tolist() == [34, 34]


def test_hf_callback_logs_each_metered_step_once(tmp_path):
    """Logs every 2 steps, an evaluation log and the train summary: figures only in a log with a step metered since
    the previous log, those of the last such step."""
    model, ids, opt, callback, handler, args, state, control = _hf_handler(tmp_path)
    logs = []

    def log(entry):
        logs.append(entry)
        handler.on_log(args, state, control, logs=entry)

    for batch in ids.split(2):  # 4 steps
        control = handler.on_step_begin(args, state, control)
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        opt.zero_grad()
        state.global_step += 1
        control = handler.on_step_end(args, state, control)
        if state.global_step % 2 == 0:
            log({"loss": 1.0})
            log({"eval_loss": 1.0})  # the same step again: nothing metered since
    log({"train_runtime": 1.0})
    handler.on_train_end(args, state, control)
    mfu = reports.meter(tmp_path / "hf")["mfu"].tolist()  # steps 0 and 1 traced: NaN
    # step 2's log: meter steps 0 and 1 ran since the start, both traced, so no figures; step 4's: steps 2 and 3
    # metered since, so step 3's
    assert [entry.get("mfu") for entry in logs] == [None, None, mfu[3], None, None]


def test_the_exit_handler_closes_a_run_that_ended_normally_complete(tmp_path, monkeypatch):
    for name in ("last_exc", "last_value"):  # no unhandled exception
        monkeypatch.delattr(sys, name, raising=False)
    net = nn.Linear(4, 2, bias=False)
    m = Meter(tmp_path / "ok", model=net, peak_flops=PEAK)
    net(torch.ones(1, 4)).sum().backward()
    m.step()
    m._at_exit()
    meta = tracer.read_metadata(tmp_path / "ok")
    assert meta["complete"] is True and "error" not in meta
    assert meta["meter"]["traces"][0]["model_flops"] == 34  # forward 2·1·4·2 + sum 2, dW 2·1·4·2
