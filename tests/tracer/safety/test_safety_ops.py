"""The bad-input matrix, part 2: programs optrace must run exactly as untraced.

Nested and sparse tensors, composite ops under inference_mode, higher-order operators,
torch.compile. Each case compares the traced result with the untraced one and checks
the rows recorded for it.
"""

import warnings

import pandas as pd
import pytest
import torch
from torch import nn

from tracer import Tracer, read_metadata


def traced(tmp_path, fn, **kwargs):
    path = tmp_path / "t"
    with Tracer(path, **kwargs):
        out = fn()
    return out, pd.read_parquet(path), read_metadata(path)


def row(df, op):
    rows = df[df["op"] == op]
    assert len(rows) == 1, df["op"].tolist()
    return rows.iloc[0]


# ------------------------------------------------------------------ 2. nested tensors run as untraced
def test_linear_on_a_jagged_nested_tensor(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(5, 4)], layout=torch.jagged)
    expected = lin(nt)
    out, df, meta = traced(tmp_path, lambda: lin(nt))
    assert all(torch.equal(a, b) for a, b in zip(out.unbind(), expected.unbind()))
    r = row(df, "aten.linear.default")
    assert r["layout"] == "jagged" and r["flop_kind"] == "matmul"
    assert r["flops"] == 2 * 7 * 4 * 3  # the values buffer [2 + 5, 4] @ [4, 3]: 168
    assert list(r["input_shapes"][0]) == []  # symbolic sizes are not read
    assert r["input_storage_ids"][0] >= 0 and meta["record_errors"] == 0


def test_a_strided_nested_tensor(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype warning for the strided layout
        nt = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    expected = (nt * 2).to_padded_tensor(0)
    out, df, meta = traced(tmp_path, lambda: nt * 2)
    assert torch.equal(out.to_padded_tensor(0), expected)
    r = row(df, "aten.mul.Tensor")
    assert r["layout"] == "nested" and r["flop_kind"] == "elementwise"
    assert r["flops"] == 20  # one per stored element: (2 + 3) * 4
    assert meta["record_errors"] == 0


# ------------------------------------------------------------------ 3. sparse tensors get rows
def test_sparse_coo_and_csr_matmuls(tmp_path):
    dense = torch.tensor([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 0], [3.0, 0, 4.0]])  # [4, 3], nnz 4
    b = torch.ones(3, 5)
    coo, csr = dense.to_sparse(), dense.to_sparse_csr()

    def run():
        return torch.sparse.mm(coo, b), torch.mm(csr, b)

    expected = run()
    (a, c), df, meta = traced(tmp_path, run)
    assert torch.equal(a, expected[0]) and torch.equal(c, expected[1])
    rows = df[df["layout"] != ""]
    assert set(rows["layout"]) == {"sparse_coo", "sparse_csr"}
    mms = rows[rows["flop_kind"] == "matmul"]
    assert mms["flops"].tolist() == [40] * len(mms) and len(mms) >= 2  # 2 * nnz 4 * n 5 = 40
    assert (rows["input_storage_ids"].map(lambda ids: all(i >= 0 for i in ids))).all()
    assert meta["record_errors"] == 0


def test_sparse_embedding_keeps_its_optimizer_update(tmp_path):
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    idx = torch.tensor([1, 2, 2])

    def step():
        emb(idx).sum().backward()
        opt.step()

    reference = nn.Embedding(10, 4, sparse=True)
    reference.load_state_dict(emb.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(idx).sum().backward()
    ref_opt.step()
    _, df, meta = traced(tmp_path, step, model=emb)
    assert torch.equal(emb.weight, reference.weight)
    update = df[(df["phase"] == "optimizer") & (df["layout"] == "sparse_coo")]
    assert len(update) >= 1 and meta["record_errors"] == 0 and meta["complete"] is True
    assert update["flop_kind"].iloc[0] == "elementwise" and update["flops"].iloc[0] == 12  # 3 stored rows x 4


# ------------------------------------------------------------------ composite ops under inference_mode
def test_inference_mode_counts_composites_whole_as_training_does(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Softmax(-1))
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x)

    def infer():
        with torch.inference_mode():
            return model(x)

    out, df, _ = traced(tmp_path, infer)
    assert torch.equal(out, expected)
    by_op = df.set_index("op")["flops"]
    assert by_op["aten.linear.default"] == 2 * 4 * 8 * 16  # 1024, as addmm counts
    assert by_op["aten.layer_norm.default"] == 4 * 16 * 7  # 5 per element + weight + bias: 448
    assert by_op["aten.softmax.int"] == 5 * 4 * 16  # 320


@pytest.mark.parametrize(
    "fn, flops",
    [
        (lambda a, b: torch.matmul(a, b), 2 * 2 * 3 * 5 * 4),  # [2, 3, 4] @ [4, 5]: 240
        (lambda a, b: torch.einsum("bik,kj->bij", a, b), 2 * 2 * 3 * 5 * 4),  # the same contraction: 240
        (lambda a, b: torch.einsum("...k,kj", a, b), 2 * 2 * 3 * 5 * 4),  # implicit output, ellipsis: 240
    ],
    ids=["matmul", "einsum", "einsum_implicit"],
)
def test_matmul_and_einsum_whole(tmp_path, fn, flops):
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 4), torch.randn(4, 5)

    def infer():
        with torch.inference_mode():
            return fn(a, b)

    out, df, _ = traced(tmp_path, infer)
    assert torch.allclose(out, a @ b, atol=1e-5)  # einsum may sum in another order than matmul
    assert df["flops"].sum() == flops and df["flop_kind"].iloc[0] == "matmul"


def _tiny_gpt(attention):
    from gpt import GPT, GPTConfig, make_batch

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16, attention=attention)
    model, (idx, targets) = GPT(cfg), make_batch(cfg, 2)
    return lambda: model(idx, targets)


def _cnn():
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.GroupNorm(2, 8),
        nn.ConvTranspose2d(8, 4, 3),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10),
    ).eval()
    x = torch.randn(2, 3, 8, 8)
    return lambda: F.cross_entropy(net(x), torch.tensor([1, 2]))


def _functional(name):
    import torch.nn.functional as F

    x, q = torch.randn(4, 6), torch.randn(2, 3, 5, 4)
    return {
        "rms_norm": lambda: F.rms_norm(x, (6,), torch.ones(6)),
        "sdpa_causal": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
        "einsum_3": lambda: torch.einsum("ij,jk,kl->il", x, x.T, x),
        "log_softmax": lambda: F.log_softmax(x, -1),
        "instance_norm": lambda: F.instance_norm(q),
    }[name]


@pytest.mark.parametrize(
    "make",
    [
        lambda: _tiny_gpt("matmul"),
        lambda: _tiny_gpt("sdpa"),
        _cnn,
        *[lambda n=n: _functional(n) for n in ("rms_norm", "sdpa_causal", "einsum_3", "log_softmax", "instance_norm")],
    ],
    ids=["gpt_matmul", "gpt_sdpa", "cnn", "rms_norm", "sdpa_causal", "einsum_3", "log_softmax", "instance_norm"],
)
def test_inference_mode_counts_what_no_grad_counts(tmp_path, make):
    """Reference comparison: composites counted whole (inference_mode) against what they decompose into (no_grad)."""
    fn = make()
    totals, outs = {}, {}
    for context in (torch.no_grad, torch.inference_mode):

        def run():
            with context():
                return fn()

        outs[context], df, _ = traced(tmp_path, run)
        assert not (df["flop_kind"] == "unknown").any(), df[df["flop_kind"] == "unknown"]["op"].tolist()
        totals[context] = int(df["flops"].sum())
    assert totals[torch.inference_mode] == totals[torch.no_grad] > 0
    assert torch.equal(outs[torch.no_grad], outs[torch.inference_mode])


# ------------------------------------------------------------------ 10. higher-order operators
def test_flex_attention_runs_eagerly_and_is_one_row(tmp_path):
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "flex_attention called without torch.compile()"
        expected = flex_attention(q, k, v)
        out, df, meta = traced(tmp_path, lambda: flex_attention(q, k, v))
    assert torch.equal(out, expected)
    r = row(df, "higher_order.flex_attention")
    assert r["flop_kind"] == "attention" and r["flops"] == 2 * 1 * 2 * 8 * 8 * (4 + 4)  # 2 b h s_q s_k (d + d_v) = 2048
    assert meta["record_errors"] == 0


def test_torch_cond_runs_as_untraced(tmp_path):
    x = torch.randn(3)

    def run():
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    expected = run()
    out, df, _ = traced(tmp_path, run)
    assert torch.equal(out, expected)
    r = row(df, "higher_order.cond")
    assert r["flop_kind"] == "unknown" and r["flops"] == 0


def test_checkpoint_runs_as_untraced(tmp_path):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    block = nn.Sequential(lin, nn.ReLU())  # relu saves its output: the backward recomputes the block
    checkpoint(block, x, use_reentrant=False).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    _, df, meta = traced(tmp_path, lambda: checkpoint(block, x, use_reentrant=False).sum().backward())
    assert torch.equal(x.grad, expected)
    assert (df["op"] == "aten.addmm.default").sum() == 2  # forward, and its recomputation in the backward
    assert meta["record_errors"] == 0


def test_the_checkpoint_hop_runs_as_untraced(tmp_path):
    from torch._higher_order_ops.wrap import tag_activation_checkpoint

    torch.manual_seed(0)
    block = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    x = torch.randn(2, 4)
    expected = tag_activation_checkpoint(block, x, use_reentrant=False)
    out, df, meta = traced(tmp_path, lambda: tag_activation_checkpoint(block, x, use_reentrant=False))
    assert torch.equal(out, expected)
    assert row(df, "aten.addmm.default")["flops"] == 2 * 2 * 4 * 4  # its body's ops are recorded: 64
    assert meta["record_errors"] == 0


# ------------------------------------------------------------------ 9. torch.compile
def test_a_compiled_model_runs_eagerly_is_said_and_named_as_the_original(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    compiled = torch.compile(model)
    x = torch.randn(2, 4)
    expected = model(x)
    out, df, meta = traced(tmp_path, lambda: compiled(x), model=compiled)
    assert torch.equal(out, expected)
    assert meta["compiled_ran_eagerly"] is True and meta["root_module"] == "Sequential"
    assert sorted(meta["parameters"]) == ["0.bias", "0.weight"]
    assert set(df["module"]) <= {"Sequential", "0", "1", ""} and "0" in set(df["module"])


def test_a_compiled_submodule_is_named_by_its_path(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    model[0] = torch.compile(model[0])
    x = torch.randn(2, 4)
    expected = model(x)
    out, df, meta = traced(tmp_path, lambda: model(x), model=model)
    assert torch.equal(out, expected)
    assert meta["compiled_ran_eagerly"] is True
    assert row(df, "aten.addmm.default")["module"] == "0"
