"""The compiled path on tensors the workloads of tests/tracer/native/test_collector.py do not reach.

Each case runs three times from the same seed: untraced, traced by the Python path and traced
by the compiled path (tracer/native/_collector.cpp). The two traces must be identical column by column
(`_assert_identical` of tests/tracer/native/test_collector.py: every column but the op times, and the run
metadata), neither may fail to record an op or warn, and the program's results must be
bit-identical to the untraced run's.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

import reports
from tests.tracer.native.test_collector import _assert_identical
from tracer import Tracer, read_metadata


def _zero_dim():
    a, b = torch.tensor(3.0), torch.randn(())
    return a * b, torch.stack([a, b]), (a + b).item()


def _zero_size():
    x = torch.randn(0, 4)
    return x.sum(0), x @ torch.randn(4, 3), torch.cat([x, torch.randn(2, 4)]), x.t().contiguous()


def _bool():
    m = torch.rand(3, 4) > 0.5
    return m & ~m, m.any(), torch.where(m, 1.0, 0.0), m.t().sum()


def _complex64():
    z = torch.randn(3, 4, dtype=torch.complex64)
    return z * z.conj(), torch.view_as_real(z) + 0, z.abs(), z.conj().resolve_conj(), z.t() @ z


def _int8_uint8():
    a = torch.randint(-5, 5, (3, 4), dtype=torch.int8)
    b = torch.randint(0, 9, (3, 4), dtype=torch.uint8)
    return a + a, b * 2, a.to(torch.float32), b.view(torch.int8), (a.to(torch.uint8) ^ b)


def _half_bfloat16():
    h = torch.randn(3, 4, dtype=torch.float16)
    g = torch.randn(3, 4, dtype=torch.bfloat16)
    return h @ h.t(), g @ g.t(), h.to(torch.bfloat16) + g, F.softmax(h, dim=-1)


def _float8():
    f = torch.randn(4, 4).to(torch.float8_e4m3fn)
    return f.to(torch.float32), f.view(torch.uint8) + 0, f.t().contiguous(), torch.cat([f, f])


def _channels_last():
    x = torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last)
    y = F.conv2d(x, torch.randn(2, 3, 3, 3))
    return y, x + 1, x.permute(0, 2, 3, 1) * 2, F.max_pool2d(x, 2)


def _strided():
    x = torch.randn(4, 6)[:, ::2]  # strides (6, 2)
    y = torch.randn(2, 3, 4).transpose(0, 2)  # strides (1, 4, 12)
    return x * 2, x.t() @ x, y.sum(1), y.flip(0) + 0


def _expanded():
    x = torch.randn(3, 1).expand(3, 5)  # stride 0
    s = torch.tensor(2.0).expand(2, 2)  # every stride 0
    return x + 1, x.sum(), x.contiguous(), s * x[:2, :2], torch.randn(4).broadcast_to(2, 3, 4) @ torch.randn(4, 2)


def _offsets():
    b = torch.randn(10)
    v = b[3:7]  # storage offset 3
    return v * 2, b.narrow(0, 5, 3).clone(), torch.as_strided(b, (2, 2), (1, 3), 2) + 0, v.view(2, 2) @ v.view(2, 2)


def _autocast_grad():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = (x @ w).relu()
        loss = y.float().sum()
    loss.backward()
    return y.detach(), loss.detach(), w.grad


def _inference_mode():
    with torch.inference_mode():
        x = torch.randn(3, 3)
        y = x @ x
        x.add_(1)
    return y, x, x.clone() * 2


def _from_numpy():
    np = pytest.importorskip("numpy")
    a = torch.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = torch.from_numpy(np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2])  # a numpy view with strides (4, 2)
    a.mul_(2)  # writes into numpy's memory
    return a + 1, a.t() @ a, b * 3


def _resize_set():
    x = torch.randn(4)
    head = x.clone()
    x.resize_(10)  # the storage grows in place
    x[4:] = 1.0
    y = torch.empty(0)
    y.set_(x.untyped_storage(), 2, (2, 2), (2, 1))  # y now views x's storage at offset 2
    z = torch.empty(3)
    z.set_(x)
    x.resize_(2)  # shrinks the view, not the storage
    return head, y + 1, z * 2, x.clone()


def _checkpoint():
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    y = checkpoint(lambda t: lin(t).relu(), x, use_reentrant=False)
    y.sum().backward()
    return y.detach(), x.grad, lin.weight.grad, lin.bias.grad


def _vmap_grad():
    from torch.func import grad, vmap

    x = torch.randn(3, 4)
    square = lambda t: (t**2).sum()  # noqa: E731
    return vmap(torch.sin)(x), grad(square)(x), vmap(grad(square))(x), vmap(torch.dot)(x, x)


def _quantized():
    q = torch.quantize_per_tensor(torch.randn(3, 4), 0.1, 3, torch.quint8)
    return (
        q.dequantize(),
        q.int_repr(),
        q.t().dequantize(),
        torch.quantize_per_tensor(torch.randn(4), 0.5, 0, torch.qint8),
    )


def _meta():
    x = torch.empty(3, 4, device="meta")
    return x @ x.t(), x.sum(1), torch.cat([x, x]), x[1:].t()


def _fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(2, 3)
        b = a.t() @ a
        c = torch.cat([a, a]).sum(0)
    return tuple(b.shape), tuple(c.shape), b.dtype  # the fake tensors themselves belong to their mode


def _parameter():
    p = torch.nn.Parameter(torch.randn(3))
    out = (p * 2).sum()
    out.backward()
    with torch.no_grad():
        p.mul_(2)
    return out.detach(), p.detach().clone(), p.grad, torch.stack([p.detach(), p.grad])


def _tensor_lists():
    xs = [torch.randn(2), torch.randn(3)]
    torch._foreach_add_(xs, 1.0)
    torch._foreach_add_(xs, [torch.ones(2), torch.ones(3)])
    ys = torch._foreach_mul(xs, 2.0)
    return torch.cat(xs), *xs, *ys, torch.stack([xs[0], xs[0]])


def _optional_none():
    x = torch.randn(2, 4)
    return F.layer_norm(x, (4,)), F.layer_norm(x, (4,), None, torch.zeros(4)), F.linear(x, torch.randn(3, 4), None)


def _tuple_outputs():
    x = torch.randn(3, 4)
    v, i = torch.max(x, dim=1)
    s, j = torch.sort(x, dim=0)
    return v, i, s, j, *torch.aminmax(x), *torch.std_mean(x, dim=1)


def _inplace_view():
    x = torch.randn(4, 4)
    x[1:3, ::2].mul_(2)
    x.t()[0].add_(1)
    x.diagonal().zero_()
    x.view(16)[5:].clamp_(min=0)
    return x


def _out_resize():
    x = torch.randn(3, 4)
    out = torch.empty(0)
    torch.add(x, 1, out=out)  # grows out's storage from 0 to 48 bytes
    mm = torch.empty(0)
    torch.mm(x, x.t(), out=mm)
    big = torch.empty(20)
    torch.mul(x, 2, out=big[:12].view(3, 4))  # out= into a view, no resize
    v, i = torch.empty(0), torch.empty(0, dtype=torch.int64)
    torch.max(x, dim=1, out=(v, i))
    return out, mm, big[:12], v, i


def _odd_dtypes():
    u = torch.arange(6).to(torch.uint16)
    e = torch.randn(4).to(torch.float8_e5m2)
    c = torch.ones(3, dtype=torch.complex32)
    return (
        u.to(torch.int32),
        u.view(torch.int16),
        torch.zeros(2, dtype=torch.uint64),
        e.to(torch.float16),
        c.to(torch.complex64),
    )


def _optional_lists():
    x = torch.randn(3, 4)
    idx = torch.tensor([2, 0])
    x[:, idx] = 1.0  # index_put_ with indices [None, idx]
    return x[:, idx], x[None, ..., idx], x.index_select(1, idx)


def _odd_layouts():
    s = torch.eye(3).to_sparse_csr()
    n = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)])
    return s @ torch.ones(3, 2), (n * 2).to_padded_tensor(0.0)


def _mkldnn():
    k = torch.randn(2, 3).to_mkldnn()  # opaque: no storage to be had
    return (k + k).to_dense()


def _functionalize():
    from torch.func import functionalize

    def f(t):
        y = t.clone()
        y[0].add_(1)
        return y.view(-1) * 2

    x = torch.randn(2, 3)
    return functionalize(f)(x), f(x)


def _native_counts():
    # the counts the compiled hook makes itself (tracer/native/_dispatch.cpp native_flops), at their edges: a matmul past
    # int64 (left to the Python count: INT64_MAX, flagged a bound), bias forms with kwarg-only alpha and beta,
    # a reduction and a foreach op, whose counts read the first tensor and the first list
    with torch.device("meta"):
        huge = torch.empty(2**21, 2**21) @ torch.empty(2**21, 2**21)  # 2 * 2**63 FLOPs
        big = torch.bmm(torch.empty(2**10, 2**20, 2**20), torch.empty(2**10, 2**20, 2**13))  # 2 * 2**63 FLOPs
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    c = torch.addmm(torch.randn(3, 5), a, b, beta=0.5, alpha=2.0)
    d = torch.baddbmm(torch.randn(2, 3, 5), a.expand(2, 3, 4), b.expand(2, 4, 5), alpha=3.0)
    e = torch.bmm(a.expand(2, 3, 4), b.expand(2, 4, 5))
    xs = [torch.randn(3), torch.randn(2, 2)]
    torch._foreach_mul_(xs, 2.0)
    # layer norms without and with a weight, their backward with and without the weight's gradient, and softmaxes
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    norms = F.layer_norm(x, (4,)), F.layer_norm(x, (4,), weight=w.detach()), F.layer_norm(x, (4,), w, torch.zeros(4))
    (norms[0].sum() + norms[1].sum() + norms[2].sum()).backward()
    y = torch.randn(2, 5, requires_grad=True)
    (F.softmax(y, dim=-1).pow(2).sum() + F.log_softmax(y, dim=0).sum()).backward()
    return huge, big, c, d, e, a.sum(dtype=torch.float64), torch.amax(b, dim=1), xs, x.grad, w.grad, y.grad


CASES = {
    "zero_dim": _zero_dim,
    "zero_size": _zero_size,
    "bool": _bool,
    "complex64": _complex64,
    "int8_uint8": _int8_uint8,
    "half_bfloat16": _half_bfloat16,
    "float8_e4m3fn": _float8,
    "channels_last": _channels_last,
    "strided": _strided,
    "expanded": _expanded,
    "offsets": _offsets,
    "autocast_grad": _autocast_grad,
    "inference_mode": _inference_mode,
    "from_numpy": _from_numpy,
    "resize_set": _resize_set,
    "checkpoint": _checkpoint,
    "vmap_grad": _vmap_grad,
    "quantized": _quantized,
    "meta": _meta,
    "fake": _fake,
    "parameter": _parameter,
    "tensor_lists": _tensor_lists,
    "optional_none": _optional_none,
    "tuple_outputs": _tuple_outputs,
    "inplace_view": _inplace_view,
    "out_resize": _out_resize,
    "odd_dtypes": _odd_dtypes,
    "optional_lists": _optional_lists,
    "odd_layouts": _odd_layouts,
    "functionalize": _functionalize,
    "mkldnn": _mkldnn,
    "native_counts": _native_counts,
}


def _assert_same(got, want):
    """Bit-identical results: the same types, dtypes, shapes, strides and bytes (meta: no bytes)."""
    assert type(got) is type(want)
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
    elif isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape, got.stride(), got.device) == (want.dtype, want.shape, want.stride(), want.device)
        if want.is_quantized:
            assert (got.q_scale(), got.q_zero_point()) == (want.q_scale(), want.q_zero_point())
            got, want = got.int_repr(), want.int_repr()
        if want.device.type != "meta":
            as_bytes = lambda t: t.detach().resolve_conj().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
            assert torch.equal(as_bytes(got), as_bytes(want))
    else:
        assert got == want


_PYTHON_ONLY = {"fake"}  # every tensor a subclass: the compiled collector reads none

# tracer.flops.layouts `describe` records a tensor without a storage (mkldnn's opaque ones) under
# storage id -1, which reports/loading/validate.py rejects as damage: both paths alike.


@pytest.mark.parametrize("case", list(CASES))
def test_collector_matrix(tmp_path, monkeypatch, compiled, case):
    fn = CASES[case]
    torch.manual_seed(0)
    want = fn()  # untraced
    results = []

    def make():
        return None, lambda: results.append(fn())

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="optrace")  # no warning from optrace, on either path
        df = _assert_identical(tmp_path, monkeypatch, make)
    assert len(results) == 2
    for got in results:  # the Python path's run, then the compiled path's
        _assert_same(got, want)
    for path in ("python", "compiled"):  # no op failed to record (a failure is a count, not an error)
        assert read_metadata(tmp_path / path)["record_errors"] == 0, path
    fast = read_metadata(tmp_path / "compiled")["collector"]["compiled_rows"]  # rows the compiled hook wrote itself
    assert (fast == 0) if case in _PYTHON_ONLY else (0 < fast <= len(df))


def test_an_mkldnn_tensor_gets_a_storage_id_of_its_own(tmp_path):
    # an mkldnn tensor has no storage to read: it gets a fresh id holding no bytes (it was -1, which
    # reports.load rejects as damage), and the trace loads and reports
    torch.manual_seed(0)
    with Tracer(tmp_path / "t"):
        k = torch.randn(2, 3).to_mkldnn()
        (k + k).to_dense()
    df = reports.load(tmp_path / "t")
    add = df[df["op"] == "aten.add.Tensor"].iloc[0]
    assert add["layout"] == "_mkldnn"  # torch._mkldnn, as the layout names it
    assert min(add["input_storage_ids"]) >= 0 and min(add["output_storage_ids"]) >= 0
    assert (add["flops"], add["flop_kind"]) == (0, "unknown")  # not counted, and named as such:
    assert "aten.add.Tensor" in reports.uncounted(df)["op"].tolist()
