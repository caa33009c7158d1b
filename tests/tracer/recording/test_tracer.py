"""The tracer core: rows, phases, modules, storage ids, bytes, devices, failure modes."""

import signal
import subprocess
import sys
import textwrap
import weakref

import pandas as pd
import pytest
import torch
from torch import nn

import reports
import tracer
from tests import helpers
from tests.helpers import forked
from tracer import TraceError, Tracer, read_metadata
from tracer.schema import COLUMN_NAMES, SCHEMA_VERSION


def trace(tmp_path, fn, name="t.parquet", **kwargs):
    path = tmp_path / name
    with Tracer(path, **kwargs):
        fn()
    return pd.read_parquet(path), read_metadata(path)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2))


def test_public_names_import():
    for name in tracer.__all__:
        assert getattr(tracer, name) is not None


def test_import_tracer_does_not_import_pandas():
    code = "import sys, tracer; tracer.Tracer; assert 'pandas' not in sys.modules, 'pandas imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(helpers.ROOT))


def test_tracing_and_metering_do_not_import_pandas(tmp_path):
    """A traced step (its marker, parts, a late metadata part, an earlier trace replaced) and a Meter's steps (it reads its
    traced steps back) in a fresh interpreter leave pandas unimported (pyarrow's Schema.empty_table, pa.array and pyarrow.dataset import it)."""
    code = textwrap.dedent(f"""
        import sys
        import torch
        from tracer import Meter, Tracer, read_metadata
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step():
            model(torch.ones(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
        for _ in range(2):  # the second replaces the first: its marker and parts are read
            with Tracer({str(tmp_path / "t")!r}, model=model, flush_rows=4) as t:
                step()
        t.set_step_time(0.01)
        with Meter({str(tmp_path / "m")!r}, model=model, tokens=2) as meter:
            figures = [(step(), meter.step())[1] for _ in range(3)]
        print(read_metadata({str(tmp_path / "t")!r})["rows"], [f["model_flops"] for f in figures])
        assert "pandas" not in sys.modules, "pandas imported"
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=helpers.ROOT)
    assert done.returncode == 0, done.stderr
    rows, flops = done.stdout.split(maxsplit=1)
    assert int(rows) > 0
    # forward: addmm 2 * 2 * 4 * 4 = 64, relu 2 * 4 = 8, addmm 2 * 2 * 4 * 2 = 32, sum 2 * 2 = 4 (108); backward: two mm
    # 2 * 2 * 2 * 4 = 32 each, bias sum 2 * 2 = 4, threshold_backward 2 * 4 = 8, mm 2 * 4 * 2 * 4 = 64, bias sum
    # 2 * 4 = 8 (148, the first layer's input needs no gradient); 108 + 148 = 256 each step, one signature
    assert flops.strip() == "[256, 256, 256]", flops


def test_columns_and_metadata(tmp_path):
    model = mlp()
    x = torch.randn(8, 32)
    df, meta = trace(tmp_path, lambda: model(x), model=model, tokens=8, run_name="mlp")
    assert tuple(df.columns) == COLUMN_NAMES
    assert df["seq"].tolist() == list(range(len(df)))
    assert meta["schema_version"] == SCHEMA_VERSION == 4 and meta["complete"] is True
    assert meta["run_name"] == "mlp" and meta["tokens"] == 8 and meta["root_module"] == "Sequential"
    # 32 * 16 + 16 + 16 * 2 + 2 = 562 parameters
    assert meta["params"] == {"total": 562, "trainable": 562, "embedding": 0}
    assert meta["parameters"]["0.weight"]["shape"] == [16, 32]
    assert meta["device"]["type"] == "cpu"
    assert meta["rows"] == len(df)


def test_forward_backward_optimizer_phases_and_steps(tmp_path):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(8, 32)

    def steps():
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()

    df, meta = trace(tmp_path, steps, model=model)
    assert sorted(df["step"].unique()) == [0, 1]
    for step in (0, 1):
        phases = df[df["step"] == step]["phase"].tolist()
        # forward, then backward, then optimizer, each a contiguous run
        collapsed = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
        assert collapsed == ["forward", "backward", "optimizer"]
    assert df[df["phase"] == "optimizer"]["op"].str.startswith("aten._foreach_").any()
    # 4 parameters -> 4 gradients and 2 moments + 1 step counter each = 12 optimizer state tensors
    assert len(meta["storage_roles"]["gradient"]) == 8  # 4 per step: zero_grad frees them
    assert len(meta["storage_roles"]["optimizer_state"]) == 12


def test_ops_after_backward_outside_modules_are_other(tmp_path):
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)

    def step():
        (x @ w).sum().backward()
        with torch.no_grad():
            w.sub_(0.1 * w.grad)  # a manual update: not forward, not backward

    df, _ = trace(tmp_path, step)
    assert df[df["op"] == "aten.mm.default"]["phase"].tolist() == ["forward", "backward"]
    assert df[df["op"] == "aten.mul.Tensor"]["phase"].tolist() == ["other"]
    # the op writing the parameter in place after the backward is the update: phase optimizer (tests/tracer/recording/test_steps.py)
    assert df[df["op"] == "aten.sub_.Tensor"]["phase"].tolist() == ["optimizer"]


def test_module_attribution_in_forward_and_backward(tmp_path):
    model = mlp()
    x = torch.randn(8, 32)
    df, _ = trace(tmp_path, lambda: model(x).sum().backward(), model=model)
    addmm = df[df["op"] == "aten.addmm.default"]
    assert addmm["module"].tolist() == ["0", "2"]
    mm = df[(df["op"] == "aten.mm.default") & (df["phase"] == "backward")]
    # layer 2: grad input [8,2]@[2,16], grad weight [2,8]@[8,16]; layer 0: grad weight only (x needs no grad)
    assert mm["module"].tolist() == ["2", "2", "0"]
    assert df[df["op"] == "aten.threshold_backward.default"]["module"].tolist() == ["1"]
    assert df[df["op"] == "aten.sum.default"]["module"].tolist() == [""]  # the loss, outside the model


def test_root_module_and_module_called_twice(tmp_path):
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return (self.inner(self.inner(x)) * 2).sum()

    model = Twice()
    x = torch.randn(3, 4)
    df, meta = trace(tmp_path, lambda: model(x).backward(), model=model)
    fwd = df[df["phase"] == "forward"]
    assert fwd[fwd["op"] == "aten.addmm.default"]["module"].tolist() == ["inner", "inner"]
    assert fwd[fwd["op"] == "aten.mul.Tensor"]["module"].tolist() == ["Twice"]
    bwd = df[df["phase"] == "backward"]
    assert set(bwd["module"]) >= {"Twice", "inner"}
    assert (bwd[bwd["op"] == "aten.mm.default"]["module"] == "inner").all()


def test_modules_named_without_model_argument(tmp_path):
    model = mlp()
    df, meta = trace(tmp_path, lambda: model(torch.randn(2, 32)))
    assert df[df["op"] == "aten.addmm.default"]["module"].tolist() == ["0", "2"]
    assert meta["root_module"] is None and "params" not in meta


def test_storage_ids_views_and_copies(tmp_path):
    x = torch.randn(2, 3)

    def ops():
        x[0]
        x.t()
        x.view(3, 2)
        x.t().contiguous()

    df, _ = trace(tmp_path, ops)
    rows = {op: r for op, r in zip(df["op"], df.itertuples())}
    sid = rows["aten.select.int"].input_storage_ids[0]
    for op in ("aten.select.int", "aten.t.default", "aten.view.default"):
        r = rows[op]
        assert r.is_view and not r.inplace and r.bytes_allocated == 0 and r.bytes_written == 0
        assert list(r.output_storage_ids) == [sid]
    copy = rows["aten.clone.default"]
    assert not copy.is_view and copy.output_storage_ids[0] != sid
    assert copy.bytes_allocated == 24  # 2 * 3 * 4 bytes
    assert list(copy.output_strides[0]) == [2, 1] and list(copy.input_strides[0]) == [1, 3]


def test_bytes_allocated_and_live_bytes(tmp_path):
    def ops():
        a = torch.zeros(4, 8)  # 4 * 8 * 4 = 128 bytes
        b = torch.zeros(4, 8, dtype=torch.float16)  # 4 * 8 * 2 = 64 bytes
        c = a + a  # elementwise ops allocate: 128 bytes
        del a, b, c
        torch.ones(1)  # 4 bytes, after the three frees

    df, _ = trace(tmp_path, ops)
    assert df["bytes_allocated"].tolist() == [128, 64, 128, 4]
    assert df["live_bytes"].tolist() == [128, 192, 320, 4]
    assert len(df["freed_storage_ids"].iloc[3]) == 3
    add = df.iloc[2]
    assert add.bytes_read == 256 and add.bytes_written == 128  # reads a twice, writes one 4 x 8 float32


def test_inplace_ops(tmp_path):
    x = torch.zeros(4)
    df, _ = trace(tmp_path, lambda: x.add_(1))
    r = df.iloc[0]
    assert r.inplace and not r.is_view and r.bytes_allocated == 0 and r.bytes_written == 16  # 4 * 4 bytes
    assert list(r.output_storage_ids) == [r.input_storage_ids[0]]


def test_flops_recorded(tmp_path):
    x = torch.ones(16, 32)
    w = torch.ones(32, 2)
    df, _ = trace(tmp_path, lambda: x @ w)
    mm = df[df["op"] == "aten.mm.default"].iloc[0]
    assert mm.flops == 2048 and mm.flop_kind == "matmul"  # 2 * 16 * 32 * 2 = 2048
    assert list(mm.output_shapes[0]) == [16, 2] and list(mm.input_dtypes) == ["float32", "float32"]


def test_meta_device_model_larger_than_memory(tmp_path):
    # 65536 x 65536 float32 weight: 16 GiB, never allocated on the meta device
    model = nn.Linear(65536, 65536, bias=False, device="meta")
    x = torch.empty(8, 65536, device="meta")
    df, meta = trace(tmp_path, lambda: model(x), model=model)
    mm = df[df["op"] == "aten.mm.default"].iloc[0]
    assert mm.flops == 2 * 8 * 65536 * 65536  # 68,719,476,736
    assert mm.bytes_allocated == 8 * 65536 * 4  # 2 MiB output
    assert mm.device == "meta" and meta["device"]["type"] == "meta"
    assert df["live_bytes"].iloc[0] >= 65536 * 65536 * 4


def test_fake_tensor_mode(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = nn.Linear(4096, 4096)
        x = torch.randn(64, 4096)
        df, meta = trace(tmp_path, lambda: model(x).sum().backward(), model=model)
    fwd = df[(df["op"] == "aten.addmm.default")].iloc[0]
    assert fwd.flops == 2 * 64 * 4096 * 4096  # 2,147,483,648
    assert fwd.bytes_allocated == 64 * 4096 * 4
    assert df[df["phase"] == "backward"]["op"].eq("aten.mm.default").sum() == 1  # x needs no grad
    # the fake tensors say "cpu", but no CPU ran them: no peak, so MFU is N/A even with a step time
    assert meta["device"]["type"] == "cpu" and meta["device"]["fake"] is True
    rate = reports.mfu(reports.load(tmp_path / "t.parquet"), step_time_s=10.0).iloc[0]
    assert rate["mfu"] != rate["mfu"] and "fake tensors" in rate["peak_source"]


def test_autocast_bf16_records_dtypes_as_run(tmp_path):
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)

    df, _ = trace(tmp_path, run, model=model)
    addmm = df[df["op"] == "aten.addmm.default"].iloc[0]
    assert list(addmm.input_dtypes) == ["bfloat16"] * 3 and list(addmm.output_dtypes) == ["bfloat16"]
    assert addmm.bytes_allocated == 4 * 8 * 2  # bf16 output: 2 bytes per element


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode(tmp_path, context):
    model = mlp()

    def run():
        with context():
            model(torch.randn(2, 32))

    df, _ = trace(tmp_path, run, model=model)
    # under inference_mode aten.linear arrives whole and runs whole; no_grad decomposes it
    linear = "aten.linear.default" if context is torch.inference_mode else "aten.addmm.default"
    assert df[df["op"] == linear]["phase"].tolist() == ["forward", "forward"]
    assert df[df["op"] == linear]["flops"].tolist() == [2048, 128]  # 2 * 2 * 32 * 16 = 2048; 2 * 2 * 16 * 2 = 128
    assert (df["phase"] != "backward").all()


def test_exception_reaches_user_and_trace_stays_readable(tmp_path):
    class Boom(Exception):
        pass

    error = Boom("model failed")
    path = tmp_path / "boom.parquet"
    with pytest.raises(Boom) as raised:
        with Tracer(path):
            torch.ones(3) + 1
            raise error
    assert raised.value is error
    df = pd.read_parquet(path)
    meta = read_metadata(path)
    assert len(df) == 2 and meta["complete"] is False and meta["error"] == "Boom: model failed"
    assert torch._C._len_torch_dispatch_stack() == 0


def test_killed_process_keeps_flushed_rows(tmp_path):
    path = tmp_path / "killed.parquet"
    script = textwrap.dedent(f"""
        import os, signal, torch
        from tracer import Tracer
        with Tracer({str(path)!r}, flush_rows=100):
            x = torch.ones(4)
            for i in range(350):
                x = x + 1
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    root = str(helpers.ROOT)
    proc = forked.run(script, cwd=root)
    assert proc.returncode == -signal.SIGKILL
    df = pd.read_parquet(path)
    assert len(df) == 300  # 351 ops (ones + 350 adds); the 51 after the third flush were in memory
    assert df["seq"].tolist() == list(range(300))
    assert read_metadata(path)["complete"] is False


def test_flushes_bound_memory(tmp_path):
    path = tmp_path / "parts.parquet"
    with Tracer(path, flush_rows=10) as tr:
        x = torch.ones(2)
        for _ in range(25):
            x = x * 2
        assert len(tr._rows) <= 10
    assert len(list(path.glob("part-*.parquet"))) == 3  # 26 rows: 10 + 10 + 6
    assert len(pd.read_parquet(path)) == 26


def test_tracer_keeps_no_tensor_alive(tmp_path):
    with Tracer(tmp_path / "alive.parquet") as tr:
        y = torch.randn(100) * 2
        ref = weakref.ref(y.untyped_storage())
        del y
        assert ref() is None
        torch.ones(1)
    assert tr._storages.live_bytes == 0


def test_untraced_code_unaffected_after_the_block(tmp_path):
    from torch.nn.modules import module as module_globals

    hooks_before = len(module_globals._global_forward_pre_hooks), len(module_globals._global_forward_hooks)
    model = mlp()
    with Tracer(tmp_path / "a.parquet", model=model):
        model(torch.randn(2, 32))
    assert torch._C._len_torch_dispatch_stack() == 0
    assert (len(module_globals._global_forward_pre_hooks), len(module_globals._global_forward_hooks)) == hooks_before
    out = model(torch.ones(2, 32))
    assert out.shape == (2, 2)


def test_rerun_replaces_an_earlier_trace(tmp_path):
    path = tmp_path / "same.parquet"
    for n in (3, 1):
        with Tracer(path):
            for _ in range(n):
                torch.ones(1)
    assert len(pd.read_parquet(path)) == 1


def test_step_time_and_ceiling_after_close(tmp_path):
    path = tmp_path / "timed.parquet"
    with Tracer(path) as tr:
        torch.ones(2)
    tr.set_step_time(0.25)
    tr.set_ceiling(tracer.matmul_ceiling("cpu", torch.float32, n=64, trials=1))
    meta = read_metadata(path)
    assert meta["step_time"] == {"median_s": 0.25} and meta["ceiling"]["n"] == 64
    assert meta["complete"] is True and len(pd.read_parquet(path)) == 1


def test_time_step_measures_untraced_steps():
    calls = []
    timing = tracer.time_step(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 5 and len(timing["times_s"]) == 3 and timing["median_s"] >= 0


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda device, ran: tracer.time_step(lambda: ran.append(1), device=device), "time_step"),
        (lambda device, ran: tracer.matmul_ceiling(device, n=4), "matmul_ceiling"),
    ],
    ids=["time_step", "matmul_ceiling"],
)
def test_a_cuda_device_without_cuda_is_refused_in_one_line(monkeypatch, call, what):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without CUDA
    ran = []
    with pytest.raises(
        TraceError,
        match=rf"^{what}: device 'cuda' asked for, but CUDA is not available in this "
        r"process \(torch.cuda.is_available\(\) is False\); pass device='cpu' or leave it out$",
    ):
        call("cuda", ran)  # before: time_step timed the CPU unsynchronised; matmul_ceiling raised torch's error
    with pytest.raises(
        TraceError,
        match=rf"^{what}: device must be a torch.device or a device string such as 'cpu' "
        r"or 'cuda:0', got 'gpu'$",
    ):
        call("gpu", ran)
    assert ran == []  # refused before the warm-up calls


def test_a_failing_formula_does_not_break_the_program(tmp_path):
    lib = torch.library.Library("optrace_tracer_test", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")

    @tracer.register_flop_formula(torch.ops.optrace_tracer_test.twice, kind="elementwise")
    def broken(x_shape, out_shape=None, **kwargs):
        raise ValueError("formula bug")

    path = tmp_path / "broken.parquet"
    with pytest.warns(UserWarning, match="could not record optrace_tracer_test.twice.default"):
        with Tracer(path):
            out = torch.ops.optrace_tracer_test.twice(torch.ones(3))
    assert out.tolist() == [2.0, 2.0, 2.0]
    assert read_metadata(path)["record_errors"] == 1


# errors: each names the bad value and what was expected, before anything runs


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"path": 123}, "path must be a str, bytes or os.PathLike, got int"),
        ({"model": "gpt"}, "model must be a torch.nn.Module or None, got str"),
        ({"tokens": 0}, r"tokens must be an int from 1 to 2\*\*53 \(tokens per step\) or None, got 0"),
        ({"tokens": True}, "tokens must be an int from 1 .* got True"),
        ({"tokens": 8.0}, "tokens must be an int from 1 .* got 8.0"),
        ({"run_name": 5}, "run_name must be a str or None, got int"),
        ({"flush_rows": 0}, "flush_rows must be a positive int, got 0"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    kwargs = {"path": tmp_path / "x.parquet", **kwargs}
    with pytest.raises(TraceError, match=match):
        Tracer(kwargs.pop("path"), **kwargs)


def test_two_tracers_at_once(tmp_path):
    with Tracer(tmp_path / "a.parquet"):
        with pytest.raises(TraceError, match=r"another Tracer is already active \(writing '.*a.parquet'\)"):
            with Tracer(tmp_path / "b.parquet"):
                pass


def test_tracer_used_twice(tmp_path):
    tr = Tracer(tmp_path / "a.parquet")
    with tr:
        pass
    with pytest.raises(TraceError, match="was already used; create a new one"):
        with tr:
            pass


def test_path_errors(tmp_path):
    (tmp_path / "file.parquet").write_text("not a trace")
    with pytest.raises(TraceError, match="a file of that name exists"):
        with Tracer(tmp_path / "file.parquet"):
            pass
    (tmp_path / "dir.parquet").mkdir()
    (tmp_path / "dir.parquet" / "notes.txt").write_text("mine")
    with pytest.raises(TraceError, match="it is a directory holding 'notes.txt', which optrace did not write"):
        with Tracer(tmp_path / "dir.parquet"):
            pass
    assert (tmp_path / "dir.parquet" / "notes.txt").exists()
    with pytest.raises(TraceError, match="cannot write trace '/sys/t.parquet'"):
        with Tracer("/sys/t.parquet"):
            pass


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda tr: tr.set_step_time(-1),
            r"set_step_time: expected finite seconds >= 1e-09 \(one ns\) or the dict time_step returns, got -1$",
        ),
        (lambda tr: tr.set_ceiling(3.0), "set_ceiling: expected the dict matmul_ceiling returns, got 3.0"),
        (lambda tr: tracer.time_step(5), "time_step: fn must be callable, got int"),
        (lambda tr: tracer.time_step(print, repeats=0), "time_step: repeats must be an int >= 1, got 0"),
        (lambda tr: tracer.matmul_ceiling(n=0), "matmul_ceiling: n must be a positive int, got 0"),
    ],
)
def test_timing_errors(tmp_path, call, match):
    with Tracer(tmp_path / "t.parquet") as tr:
        pass
    with pytest.raises(TraceError, match=match):
        call(tr)


def test_time_step_refuses_to_run_traced(tmp_path):
    with Tracer(tmp_path / "t.parquet"):
        with pytest.raises(TraceError, match="call it outside the Tracer"):
            tracer.time_step(lambda: None)


def test_storage_roles_after_one_step(tmp_path):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters())

    def step():
        model(torch.randn(8, 32)).sum().backward()
        opt.step()

    _, meta = trace(tmp_path, step, model=model)
    params = {p["storage_id"] for p in meta["parameters"].values()}
    roles = meta["storage_roles"]
    # 4 parameter tensors: 4 gradients; AdamW keeps exp_avg, exp_avg_sq and a step scalar for each: 12
    assert len(roles["gradient"]) == 4 and len(roles["optimizer_state"]) == 12
    assert not params & set(roles["gradient"]) and not params & set(roles["optimizer_state"])


def test_cuda_paths_synchronise_and_read_cuda_memory(monkeypatch):
    from tracer import device

    assert device.cuda_sync_for("cpu") is None and device.cuda_memory(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 8192)  # two 32 x 32 float32: 2 * 4096
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 2 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 12288)
    assert device.cuda_sync_for("cuda") is torch.cuda.synchronize
    assert device.cuda_memory(torch.device("cuda", 0)) == {
        "allocated_bytes": 8192,
        "reserved_bytes": 2097152,
        "max_allocated_bytes": 12288,
    }


def test_out_argument_and_resize_count_as_allocations(tmp_path):
    a, b = torch.randn(16, 16), torch.randn(16, 16)  # 16 * 16 * 4 = 1024 bytes each

    def ops():
        c = torch.empty(0)
        torch.add(a, b, out=c)  # c's storage grows from 0 to 1024 bytes
        c.resize_(4096)  # and to 4096 * 4 = 16384 bytes
        del c
        torch.ones(1)

    df, _ = trace(tmp_path, ops)
    assert df["op"].tolist() == [
        "aten.empty.memory_format",
        "aten.add.out",
        "aten.resize_.default",
        "aten.ones.default",
    ]
    assert df["bytes_allocated"].tolist() == [0, 1024, 15360, 4]  # 16384 - 1024 = 15360
    assert df["live_bytes"].tolist() == [0, 3072, 18432, 2052]  # a + b + c; then c freed: 2048 + 4
    assert df["bytes_read"].iloc[1] == 2048  # a and b; the out= tensor is written, not read
    assert df["bytes_written"].iloc[1] == 1024


def test_a_failed_flush_loses_its_rows_but_not_the_trace(tmp_path, monkeypatch):
    from tracer.store import writer

    real_write = writer.write_table
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(writer, "write_table", flaky)
    path = tmp_path / "flaky.parquet"
    with pytest.warns(UserWarning, match="disk full"):
        with Tracer(path, flush_rows=2):
            a = torch.zeros(1)
            for _ in range(6):
                a = a + 1  # 7 ops: parts of 2 rows, the second part fails
    df = pd.read_parquet(path)
    meta = read_metadata(path)
    assert df["seq"].tolist() == [0, 1, 4, 5, 6]  # seq 2 and 3 were in the lost part
    assert meta["lost_rows"] == 2 and meta["rows"] == 5 and meta["complete"] is False


def test_entering_walks_the_models_parameters_and_buffers_once(tmp_path, monkeypatch):
    """tracer.recording.start.TraceStart._start: the run metadata, the storages alive at entry and FSDP2's parameters
    read one walk of the model's parameters and one of its buffers (each walk costs a pass over every module)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    calls = {"named_parameters": 0, "buffers": 0}
    for name in calls:
        method = getattr(model, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += kwargs.get("recurse", True)  # a walk of every module; recurse=False reads the root's own
            return _method(*args, **kwargs)

        monkeypatch.setattr(model, name, counted)  # model.parameters() calls model.named_parameters() too
    tr = Tracer(tmp_path / "t", model=model, tokens=4)
    with tr:
        entered = dict(calls)
        model(torch.randn(2, 4))
    # the code before: named_parameters 3 (run_metadata, UnshardedParameters, register_at_entry), buffers 2
    assert entered == {"named_parameters": 1, "buffers": 1}
    meta = read_metadata(tr.path)
    # 4 * 4 + 4 (the Linear) + 4 + 4 (the norm's weight and bias) = 28 parameters; the norm's 3 buffers (running mean
    # and variance, batches tracked) have their role
    assert meta["params"]["total"] == 28 and len(meta["parameters"]) == 4
    assert len(meta["storage_roles"]["buffer"]) == 3
