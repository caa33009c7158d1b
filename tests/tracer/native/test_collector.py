"""The compiled path (tracer/native/_dispatch.cpp, tracer/native/_collector.cpp) and the pure-Python path write identical traces.

Each workload runs twice from the same seed, once per path (OPTRACE_COLLECTOR), and the two
traces are compared column by column (every column but the op times) and key by key in the
run metadata (but its times, ids and `collector`). The workloads are the benchmark ones at
tiny sizes: the example GPT, a Hugging Face GPT-2, a model on the meta device, and ops with
views, in-place writes, out=, list outputs, a Parameter, a sparse tensor (recorded by the
Python path inside a compiled trace) and FakeTensorMode (tensor subclasses: Python path).
"""

import json
import sys

import pytest
import torch

import reports
from tests import helpers
from tracer import Tracer, read_metadata
from tracer.errors import TraceError
from tracer.native import loader as native

sys.path.insert(0, str(helpers.EXAMPLES))

from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step  # noqa: E402

from tests.helpers import unwrapped
from tests.reports.flops.test_fp8 import fp8_step

TIMING = ("duration_ns", "busy_ns", "start_ns")
VOLATILE = ("start_time", "end_time", "trace_id", "run_name", "collector")


def _trace(tmp_path, monkeypatch, make, path):
    """Trace `make()`'s workload with the collector `path`; (frame, metadata)."""
    monkeypatch.setenv(native.ENV, path)
    torch.manual_seed(0)
    model, run = make()
    with Tracer(tmp_path / path, model=model, run_name="same"):
        run()
    return reports.load(tmp_path / path), read_metadata(tmp_path / path)


def _plain(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return None if value is None or value != value else value  # NaN and NA alike


def _assert_identical(tmp_path, monkeypatch, make):
    """Trace with both collectors and compare; the compiled trace's frame."""
    py, py_meta = _trace(tmp_path, monkeypatch, make, "python")
    cc, cc_meta = _trace(tmp_path, monkeypatch, make, "compiled")
    assert py_meta["collector"] == {"path": "python", "reason": "OPTRACE_COLLECTOR=python"}
    assert cc_meta["collector"]["path"] == "compiled" and set(cc_meta["collector"]) == {"path", "compiled_rows"}
    assert list(py.columns) == list(cc.columns) and len(py) == len(cc) > 0
    for column in py.columns:
        if column not in TIMING:
            assert [_plain(v) for v in py[column]] == [_plain(v) for v in cc[column]], column
    for meta in (py_meta, cc_meta):
        for key in VOLATILE:
            meta.pop(key, None)
    assert py_meta == cc_meta
    return cc


def _gpt(device=None):
    cfg = GPTConfig(seq_len=16, n_layer=1, d_model=32, vocab_size=64)
    with torch.device(device or "cpu"):
        model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, 2)
    if device:
        idx, targets = idx.to(device), targets.to(device)
    return model, lambda: [train_step(model, opt, idx, targets) for _ in range(2)]  # the 2nd step has AdamW state


def test_example_gpt_identical(tmp_path, monkeypatch, compiled):
    df = _assert_identical(tmp_path, monkeypatch, _gpt)
    assert (df["op"] == "aten._foreach_add_.Scalar").sum() == 2  # the in-place foreach ops, which return None
    assert df["freed_storage_ids"].map(len).sum() > 0  # frees seen through the compiled path's weak references


def test_meta_model_identical(tmp_path, monkeypatch, compiled):
    df = _assert_identical(tmp_path, monkeypatch, lambda: _gpt("meta"))
    assert set(df.loc[df["op"] == "aten.mm.default", "device"]) == {"meta"}  # AdamW's step counts stay on the CPU


def test_hf_gpt2_identical(tmp_path, monkeypatch, compiled):
    tf = pytest.importorskip("transformers")

    def make():
        cfg = tf.GPT2Config(
            vocab_size=64,
            n_positions=16,
            n_embd=32,
            n_layer=1,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation="eager",
        )
        model = tf.GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(model.parameters())
        idx = torch.randint(0, 64, (2, 16))

        def run():
            model(input_ids=idx, labels=idx).loss.backward()
            opt.step()

        return model, run

    _assert_identical(tmp_path, monkeypatch, make)


def _views_and_writes():
    w = torch.nn.Parameter(torch.ones(4, 8))

    def run():
        x = torch.arange(32.0).reshape(4, 8)
        t = x.t()  # a view: strides (1, 8)
        x.add_(1)  # in place: writes 4 * 8 * 4 = 128 bytes
        c = torch.empty(4, 8)
        torch.mul(x, w.detach(), out=c)  # out=: c is written, not read
        parts = torch.split(x[1:, 2:], 3, dim=1)  # list output, views at storage offsets
        torch.cat([*parts, t[:3, :2]], dim=1)
        x.view(32).index_put_((torch.tensor([0, 5]),), torch.tensor(7.0))  # int64 indices, a 0-d value
        (x > 3).sum() + w.sum()  # bool and int64; the Parameter as an input
        torch.ones(2, dtype=torch.float16).resize_(6)  # a storage grown in place
        s = torch.sparse_coo_tensor(
            torch.tensor([[0, 1], [1, 0]]), torch.tensor([2.0, 3.0]), (2, 2), check_invariants=False
        )
        torch.mm(s, torch.ones(2, 3))  # sparse: the Python path records this op inside a compiled trace

    return None, run


def test_views_and_inplace_identical(tmp_path, monkeypatch, compiled):
    df = _assert_identical(tmp_path, monkeypatch, _views_and_writes)
    t = df[df["op"] == "aten.t.default"].iloc[0]
    assert _plain(t["output_shapes"]) == [[8, 4]] and _plain(t["output_strides"]) == [[1, 8]] and t["is_view"]
    assert _plain(t["output_storage_ids"]) == _plain(t["input_storage_ids"])
    add = df[df["op"] == "aten.add_.Tensor"].iloc[0]
    assert add["inplace"] and add["bytes_written"] == 4 * 8 * 4 == 128
    mul = df[df["op"] == "aten.mul.out"].iloc[0]
    # reads x and w (2 x 128 bytes), writes c (128 bytes), allocates nothing
    assert (mul["bytes_read"], mul["bytes_written"], mul["bytes_allocated"]) == (256, 128, 0)
    assert df[df["op"] == "aten.mm.default"].iloc[0]["layout"] == "sparse_coo"


def test_fake_tensors_identical(tmp_path, monkeypatch, compiled):
    from torch._subclasses.fake_tensor import FakeTensorMode

    def make():
        def run():
            with FakeTensorMode():  # FakeTensor is a subclass: the Python path records its ops
                a = torch.ones(8, 16)
                (a @ torch.ones(16, 4)).relu()

        return None, run

    df = _assert_identical(tmp_path, monkeypatch, make)
    assert df[df["op"] == "aten.mm.default"].iloc[0]["flops"] == 2 * 8 * 16 * 4 == 1024


def test_fp8_step_identical(tmp_path, monkeypatch, compiled):
    """A Float8 linear's training step: three _scaled_mm, counted alike by both paths."""
    df = _assert_identical(tmp_path, monkeypatch, fp8_step)
    scaled = df[df["op"] == "aten._scaled_mm.default"]
    assert scaled["flops"].tolist() == [65_536] * 3  # 2 * 16 * 32 * 64 each: the forward and two backward
    assert scaled["phase"].tolist() == ["forward", "backward", "backward"]


def _rms_norm_on_meta():
    with torch.device("meta"):
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 8, dtype=torch.bfloat16), torch.nn.RMSNorm(8, dtype=torch.bfloat16)
        )
        x = torch.empty(4, 8, dtype=torch.bfloat16)
    return model, lambda: model(x).float().sum().backward()


def test_fused_norm_on_meta_identical(tmp_path, monkeypatch, compiled):
    """rms_norm on meta stands in as the fused kernel's two ops (tracer.recording.meta_fused) on both paths."""
    df = _assert_identical(tmp_path, monkeypatch, _rms_norm_on_meta)
    assert (df["op"] == "aten._fused_rms_norm.default").sum() == 1
    assert (df["op"] == "aten._fused_rms_norm_backward.default").sum() == 1
    assert read_metadata(tmp_path / "compiled")["fused_standins"] == {"rms_norm": 1, "composite": 0}


def test_storage_key_matches_torch(compiled):
    x = torch.ones(3, 4)
    for t in (x, x[1:], x.t(), torch.nn.Parameter(x.clone())):
        assert compiled.storage_key(t) == torch._C._storage_id(t) == t.untyped_storage()._cdata


def test_bad_collector_name(tmp_path, monkeypatch):
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(TraceError, match="OPTRACE_COLLECTOR must be one of 'compiled', 'python' or unset, got 'fast'"):
        Tracer(tmp_path / "t")


def test_stale_build_runs_python_path(tmp_path, monkeypatch, compiled):
    """A module built for another torch is not used: the Python path runs and the metadata says why."""
    monkeypatch.setattr(compiled, "torch_version", "0.0.0")
    monkeypatch.setattr(native, "_imported", None)  # import again (restored after the test)
    with Tracer(tmp_path / "t"):
        torch.ones(3) + 1
    assert read_metadata(tmp_path / "t")["collector"] == {
        "path": "python",
        "reason": f"built for torch 0.0.0, running {torch.__version__}",
    }
    df = reports.load(tmp_path / "t")
    assert df.loc[df["op"] == "aten.add.Tensor", "flops"].tolist() == [3]  # one per output element: 3


def test_the_report_names_the_python_path_and_why(tmp_path, monkeypatch, capsys, compiled):
    """A trace the pure-Python path wrote gets a note naming why, and `--json` its `collector`; the compiled hook's
    trace gets no note and its row count."""
    from reports.output.cli import main

    monkeypatch.setenv(native.ENV, "python")
    with Tracer(tmp_path / "py"):
        torch.ones(3) + 1
    monkeypatch.delenv(native.ENV)
    with Tracer(tmp_path / "c"):
        torch.ones(3) + 1
    for name, engine in (("py", "sql"), ("py", "pandas"), ("c", "sql")):
        assert main(["report", str(tmp_path / name), "--engine", engine]) == 0
        out = unwrapped(capsys.readouterr().out)  # the caveat, wrapped to the width
        expected = (
            "- python_path: traced by optrace's pure-Python path (OPTRACE_COLLECTOR=python): the same rows as the "
            "compiled hook's, at about twice its tracing cost per op (docs/performance.md)"
        )
        assert (expected in out) == (name == "py") and ("pure-Python path" in out) == (name == "py")
    assert main(["report", str(tmp_path / "py"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["collector"] == {"path": "python", "reason": "OPTRACE_COLLECTOR=python"}
    assert main(["report", str(tmp_path / "c"), "--json"]) == 0
    # ones (a factory op) and the add: 2 rows, both from the compiled hook
    assert json.loads(capsys.readouterr().out)["collector"] == {"path": "compiled", "compiled_rows": 2}


def test_counts_the_compiled_hook_makes_itself(tmp_path, monkeypatch, compiled):
    """mm, addmm, bmm, baddbmm, layer norm and softmax (forward and backward), a reduction and a foreach op are
    counted in C++ (tracer/native/_dispatch.cpp native_flops) with the Python formulas' arithmetic; a count past int64 is
    left to Python, which stores INT64_MAX flagged as a bound."""
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    a3, b3 = a.expand(2, 3, 4), b.expand(2, 4, 5)
    xs = [torch.ones(3), torch.ones(2, 2)]
    x, w = torch.ones(3, 4, requires_grad=True), torch.ones(4, requires_grad=True)
    y = torch.ones(2, 5, requires_grad=True)
    with Tracer(tmp_path / "norms"):
        torch.nn.functional.layer_norm(x, (4,), weight=w).sum().backward()
        torch.softmax(y, dim=-1).sum().backward()
    norms = reports.load(tmp_path / "norms")
    counted = norms[norms["flop_kind"].isin(["norm", "softmax"])]
    # 12 elements x (5 + 1 for the weight) = 72; backward with grad_input and grad_weight 12 x (9 + 1 + 2) = 144;
    # softmax 10 x 5 = 50, its backward 10 x 4 = 40
    assert counted["flops"].tolist() == [72, 144, 50, 40]
    with Tracer(tmp_path / "t"):
        a @ b  # 2 * 3 * 4 * 5 = 120
        torch.addmm(torch.ones(3, 5), a, b, beta=0.5)  # 120: the bias adds are not counted
        torch.bmm(a3, b3)  # 2 * 2 * 3 * 4 * 5 = 240
        torch.baddbmm(torch.ones(2, 3, 5), a3, b3, alpha=2.0)  # 240
        a.sum(dtype=torch.float64)  # one per input element: 12
        torch._foreach_mul_(xs, 2.0)  # one per element of the list: 3 + 4 = 7
        with torch.device("meta"):
            torch.empty(2**21, 2**21) @ torch.empty(2**21, 2**21)  # 2 * 2**63 = 2**64, past int64
            # a foreach list of 3 x 2**62 elements (expanded: one element of storage each) = 3 * 2**62, past int64;
            # the compiled count gave 0 before
            torch._foreach_norm([torch.empty(1).expand(2**62) for _ in range(3)], 1)
    df = reports.load(tmp_path / "t")
    counted = df[df["flop_kind"] != "none"]
    assert counted["op"].tolist() == [
        "aten.mm.default",
        "aten.addmm.default",
        "aten.bmm.default",
        "aten.baddbmm.default",
        "aten.sum.default",
        "aten._foreach_mul_.Scalar",
        "aten.mm.default",
        "aten._foreach_norm.Scalar",
    ]
    assert counted["flops"].tolist() == [120, 120, 240, 240, 12, 7, 2**63 - 1, 2**63 - 1]
    assert counted["flops_bound"].tolist() == [False] * 6 + [True, True]
    # every row was written by the compiled hook (the count past int64 was asked of the Python formula from there)
    assert read_metadata(tmp_path / "t")["collector"]["compiled_rows"] == len(df)
