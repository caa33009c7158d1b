"""The FLOP sections (breakdown, explain, MFU) from a reports.sql.engine.Trace: reports/sql/flops.py's small frame
gives the pandas functions' results on the whole trace, and `optrace report` prints the same from either engine.

Reference: reports.load(path) and reports.breakdown / explain / mfu on it. SQL: the same functions on
reports.sql.flops.frame(Trace(path)), which holds only the rows the roles' walks and the sections' cells
read, the other rows summed per group, and one row per step and phase. The traces are those whose roles
differ from a dense model's: checkpointed, tied and bf16-autocast weights, experts (views, gathers and
grouped matmuls of stacked weights), LoRA and frozen weights, a frozen teacher, torch.func/vmap gradients,
an evaluation under no_grad, fused attention, convolutions, a traced FSDP2 rank, FLOPs past int64, two runs.
"""

import contextlib
import importlib
import io
import json
import warnings
from math import prod

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import reports
from reports._util import ONE_TO_ONE_COPIES, packet
from reports.errors import ReportError
from reports.flops import roles, walks
from reports.output.source import Source
from reports.sql.engine import Trace
from reports.sql.flops import frame
from tests import helpers
from tracer import Tracer

TOKENS = 32


def _mlp_step(path, model, step, tokens=TOKENS):
    with Tracer(path, model=model, tokens=tokens):
        step()


def _checkpointed(path):
    """test_report_roles.py's checkpointed block: Linear(8, 16), ReLU, Linear(16, 4) under non-reentrant checkpoint."""
    block = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, opt = torch.randn(TOKENS, 8), torch.optim.SGD(block.parameters(), lr=0.1)

    def step():
        checkpoint(block, x, use_reentrant=False).square().mean().backward()
        opt.step()

    _mlp_step(path, block, step)


def _reentrant(path):
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(TOKENS, 8, requires_grad=True)
    _mlp_step(path, model, lambda: checkpoint(model, x, use_reentrant=True).sum().backward())


class LoRA(nn.Module):
    """A frozen base weight W [8, 8] and a trained rank-2 adapter: y = x Wᵀ + (x Aᵀ) Bᵀ."""

    def __init__(self):
        super().__init__()
        self.base = nn.Linear(8, 8, bias=False).requires_grad_(False)
        self.a, self.b = nn.Linear(8, 2, bias=False), nn.Linear(2, 8, bias=False)

    def forward(self, x):
        return (self.base(x) + self.b(self.a(x))).square().mean()


def _lora(path):
    model, x = LoRA(), torch.randn(TOKENS, 8)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)

    def step():
        model(x).backward()
        opt.step()

    _mlp_step(path, model, step)


def _frozen(path):
    from tests.reports.flops.test_breakdown import MLP, D

    model, x = MLP(), torch.randn(TOKENS, D)
    model.fc1.requires_grad_(False)
    _mlp_step(path, model, lambda: model(x).backward())


def _no_grad_eval(path):
    from tests.reports.flops.test_breakdown import MLP, D

    model, x = MLP(), torch.randn(TOKENS, D)

    def step():
        with torch.no_grad():
            model(torch.randn(TOKENS, D))  # an evaluation in the same step
        model(x).backward()

    _mlp_step(path, model, step)


def _teacher(path):
    student, teacher = nn.Linear(8, 4, bias=False), nn.Linear(8, 4, bias=False).requires_grad_(False)
    x, opt = torch.randn(TOKENS, 8), torch.optim.SGD(student.parameters(), lr=0.1)

    def step():
        with torch.no_grad():
            target = teacher(x)
        (student(x) - target).square().mean().backward()
        opt.step()

    _mlp_step(path, student, step)


def _vmap(path):
    from torch.func import functional_call, grad, vmap

    model = nn.Linear(4, 3, bias=False)
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return (functional_call(model, p, (xi[None],)) - yi[None]).square().sum()

    _mlp_step(path, model, lambda: vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y), tokens=8)


def _attention(path):
    b, h, s, e = 2, 2, 8, 4

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(h * e, 3 * h * e, bias=False)

        def forward(self, x):
            q, k, v = self.qkv(x).view(b, s, 3, h, e).permute(2, 0, 3, 1, 4)
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    model, x = Attn(), torch.randn(b, s, h * e, requires_grad=True)
    _mlp_step(path, model, lambda: model(x).backward(), tokens=b * s)


def _patches(path):
    model = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.Flatten(2))
    _mlp_step(path, model, lambda: model(torch.randn(2, 3, 8, 8)).sum().backward(), tokens=8)


def _no_model(path):
    with Tracer(path):
        (torch.randn(4, 4, requires_grad=True) @ torch.randn(4, 4)).sum().backward()


def _wide(path):
    from tests.reports.test_overflow import TOKENS as T
    from tests.reports.test_overflow import Matmuls

    model = Matmuls()
    with Tracer(path, model=model, tokens=T):
        model(torch.empty(T, model.w.shape[0], device="meta"))


class _Quantized(nn.Module):
    """Inference with the fused and quantized matmuls: bias + x @ Wᵀ with its gelu in one op (_addmm_activation),
    then a Linear beside a weight-only int8 matmul whose packed weight [4, 16] is a buffer."""

    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        self.register_buffer("packed", torch.randint(-8, 8, (4, 16), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(4))

    def forward(self, x):
        h = torch._addmm_activation(self.fc.bias, x, self.fc.weight.t(), use_gelu=True)
        return self.out(h) + torch.ops.aten._weight_int8pack_mm(h, self.packed, self.scales)


def _quantized(path):
    model = _Quantized()
    with Tracer(path, model=model, tokens=TOKENS), torch.no_grad():
        model(torch.randn(TOKENS, 8))


def _parametrized(path):
    """Weights that parametrizations compute at each forward: weight_norm's from (v, g), spectral_norm's w / sigma."""
    from torch.nn.utils.parametrizations import spectral_norm, weight_norm

    model = nn.Sequential(
        weight_norm(nn.Linear(16, 32, bias=False)), nn.ReLU(), spectral_norm(nn.Linear(32, 8, bias=False))
    )
    x, opt = torch.randn(TOKENS, 16), torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    with Tracer(path, model=model, tokens=TOKENS):
        for _ in range(2):
            step()


def _lstm(path):
    """nn.LSTM on CPU runs fused kernels without a FLOP formula (mkldnn_rnn_layer and its backward)."""
    model = nn.ModuleDict({"rnn": nn.LSTM(8, 16, batch_first=True), "head": nn.Linear(16, 4)})
    x = torch.randn(2, TOKENS // 2, 8)
    with Tracer(path, model=model, tokens=TOKENS):
        model["head"](model["rnn"](x)[0]).sum().backward()


BUILDERS = {
    "gpt": lambda p: importlib.import_module("tests.reports.sql.test_sql")._gpt(p, 3),
    "cut": lambda p: importlib.import_module("tests.reports.sql.test_sql")._gpt(p, 2, cut=True),
    "tied_bf16": lambda p: importlib.import_module("tests.reports.flops.test_breakdown")._tiny_gpt_trace(
        p, tie=True, dtype=torch.bfloat16
    ),
    "checkpoint": _checkpointed,
    "checkpoint_reentrant": _reentrant,
    "moe_views": lambda p: importlib.import_module("tests.reports.flops.test_moe").trace_moe(p, "eager"),
    "moe_gathers": lambda p: importlib.import_module("tests.reports.flops.test_moe").trace_moe(p, "bmm"),
    "moe_grouped": lambda p: importlib.import_module("tests.reports.flops.test_moe").trace_moe(p, "grouped"),
    "lora": _lora,
    "frozen": _frozen,
    "no_grad_eval": _no_grad_eval,
    "teacher": _teacher,
    "vmap": _vmap,
    "attention": _attention,
    "patches": _patches,
    "fsdp_rank": lambda p: importlib.import_module("tests.tracer.distributed.test_job").simulate(p, 4),
    "wide": _wide,
    "no_model": _no_model,
    "quantized": _quantized,
    "parametrized": _parametrized,
    "lstm": _lstm,
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("sqlflops")
    out = {}
    for name, build in BUILDERS.items():
        torch.manual_seed(0)
        build(root / name)
        out[name] = root / name
    return out


def _pair(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reports.load(path), Trace(path)


def _same_or_same_error(f, df, small):
    """f(df) and f(small) equal, or both raising the same ReportError."""
    try:
        want = f(df)
    except ReportError as exc:
        with pytest.raises(ReportError) as got:
            f(small)
        assert str(got.value) == str(exc)
        return None
    got = f(small)
    if isinstance(want, pd.DataFrame):
        pd.testing.assert_frame_equal(got, want, check_exact=True)
    else:
        assert got == want
    return got


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_sections_on_the_small_frame_equal_those_on_the_rows(traces, name):
    df, sql = _pair(traces[name])
    small = frame(sql)
    for n in ("matmul", "total"):
        _same_or_same_error(lambda d: reports.breakdown(d, n=n), df, small)
        _same_or_same_error(lambda d: reports.explain(d, n=n), df, small)
    _same_or_same_error(reports.mfu, df, small)
    _same_or_same_error(lambda d: reports.mfu(d, step_time_s=0.25, peak_flops=1e9), df, small)
    mfu_only = frame(sql, mfu_only=True)  # compare's MFU: the matmul and attention rows, the others summed
    assert len(mfu_only) <= len(small)
    _same_or_same_error(reports.mfu, df, mfu_only)
    _same_or_same_error(lambda d: reports.mfu(d, step_time_s=0.25, peak_flops=1e9), df, mfu_only)


def test_fused_and_quantized_matmuls(traces):
    """_addmm_activation is a weight matmul whose bias is added, not multiplied (not in N); a weight-only int8
    matmul whose packed weight is a buffer is a weight outside N, not attention."""
    table = reports.breakdown(reports.load(traces["quantized"])).set_index("phase")
    # N = fc.weight 8 * 16 + out.weight 16 * 4 = 192 (no bias); T = 32
    assert table.loc["forward", "n_params"] == 192 and table.loc["forward", "tokens"] == TOKENS
    assert table.loc["forward", "weight_matmul_flops"] == 2 * 192 * TOKENS  # 12288 = 2 * 32 * 8 * 16 + 2 * 32 * 16 * 4
    assert table.loc["forward", "external_weight_flops"] == 2 * TOKENS * 16 * 4  # 4096: the int8 matmul
    assert table.loc["forward", "attention_flops"] == 0
    assert table.loc["forward", "other_flops"] == TOKENS * 4  # 128: the add of the two [32, 4] outputs
    assert table.loc["forward", "ratio"] == (12288 + 128) / 12288  # the model's own FLOPs over 2·N·T
    lines = reports.explain(reports.load(traces["quantized"]))  # no backward ran: none was skipped either
    assert any("the trace ran no backward" in line for line in lines)
    assert not any("never computed" in line for line in lines)


def test_a_spectral_norm_convolution_is_not_in_n(tmp_path):
    """spectral_norm's power iteration multiplies a convolution's weight, as a matrix, by its buffers u and v: that
    puts no convolution weight in N (README: a convolution reuses each weight at every position)."""
    from torch.nn.utils.parametrizations import spectral_norm

    torch.manual_seed(0)
    model = nn.Sequential(spectral_norm(nn.Conv2d(3, 4, 3, padding=1)), nn.Flatten(), spectral_norm(nn.Linear(64, 16)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 3, 4, 4)
    with Tracer(tmp_path / "t", model=model, tokens=4):
        for _ in range(2):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    df = reports.load(tmp_path / "t")
    assert df.attrs["runs"]["t"]["storage_roles"]["buffer"]  # the parametrizations' u and v
    table = reports.breakdown(df).set_index("phase")
    assert table.loc["forward", "n_params"] == 64 * 16  # 1024: the Linear's weight, not the conv's 4 * 3 * 3 * 3
    assert table.loc["forward", "weight_matmul_flops"] == 2 * 1024 * 4  # 8192 = 2·N·T exactly
    assert table.loc["backward", "weight_matmul_flops"] == 4 * 1024 * 4  # 16384: dL/dW and dL/dx of the Linear
    small = frame(Trace(tmp_path / "t"))
    pd.testing.assert_frame_equal(reports.breakdown(small), reports.breakdown(df), check_exact=True)
    lines = reports.explain(df)  # the conv's weight is named though the conv multiplies w / sigma, not w
    assert any(
        line.startswith("Convolution weights: 0.parametrizations.weight.original (108 parameters) are not in N")
        for line in lines
    ), lines
    assert reports.explain(small) == lines


def test_parametrized_weights_are_weights(traces):
    """weight_norm's and spectral_norm's computed weights multiply as their parameters: weight matmuls, in N."""
    table = reports.breakdown(reports.load(traces["parametrized"])).set_index("phase")
    # N = weight_norm's v 16 * 32 + spectral_norm's weight 32 * 8 = 768 (g, 32 values, enters no matmul); T = 32
    assert table.loc["forward", "n_params"] == 768
    # 2·N·T = 49152 (2 * 32 * 16 * 32 + 2 * 32 * 32 * 8); the power iteration's three mv of the [8, 32] weight by
    # its buffers u and v (and their clones), 3 * 2 * 256 = 1536, multiply no token: other
    assert table.loc["forward", "weight_matmul_flops"] == 49152 == 2 * 768 * TOKENS
    assert table.loc["forward", "other_flops"] >= 1536
    # dL/dW of both layers and dL/dx of the second (the input needs no gradient): 32768 + 16384 + 16384
    assert table.loc["backward", "weight_matmul_flops"] == 65536
    assert (table["attention_flops"] == 0).all()  # the power iteration's u · W v (16 FLOPs) is "other"
    # _weight_norm_interface and its backward count 1 per element of v: no op is left without a formula
    assert not any(line.startswith("Ops without") for line in reports.explain(reports.load(traces["parametrized"])))


def test_a_buffer_of_coordinates_times_a_weight_is_token_work(tmp_path):
    """A buffer multiplied as a matrix (coordinates, relative positions) is what the weight multiplies per token: the
    weight is in N and its matmul a weight matmul in both passes (only a buffer vector, spectral_norm's, is not)."""

    class Field(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("coords", torch.randn(TOKENS, 4))
            self.l1, self.l2 = nn.Linear(4, 16, bias=False), nn.Linear(16, 1, bias=False)

        def forward(self):
            return self.l2(torch.relu(self.l1(self.coords)))

    model = Field()
    with Tracer(tmp_path / "t", model=model, tokens=TOKENS):
        model().sum().backward()
    df = reports.load(tmp_path / "t")
    table = reports.breakdown(df).set_index("phase")
    assert table.loc["forward", "n_params"] == 4 * 16 + 16  # 80
    assert table.loc["forward", "weight_matmul_flops"] == 2 * 80 * TOKENS  # 5120
    # dL/dW of both and dL/dx of l2's input (the coordinates need none): 2*32*4*16 + 2 * 2*32*16*1 = 6144
    assert table.loc["backward", "weight_matmul_flops"] == 6144
    pd.testing.assert_frame_equal(
        reports.breakdown(frame(Trace(tmp_path / "t"))), reports.breakdown(df), check_exact=True
    )


def test_explain_names_ops_without_a_formula(traces):
    df = reports.load(traces["lstm"])
    if not (df["flop_kind"] == "unknown").any():  # aten.mkldnn_rnn_layer: 0 FLOPs
        pytest.skip("this torch runs nn.LSTM as mm/addmm (no oneDNN), all of them counted")
    assert any(line.startswith("Ops without a FLOP formula ran") for line in reports.explain(df))
    assert not any(line.startswith("Ops without") for line in reports.explain(reports.load(traces["gpt"])))


def test_two_runs_at_once(traces):
    paths = [traces["gpt"], traces["tied_bf16"], traces["checkpoint"]]
    df, sql = reports.load(paths), Trace(paths)
    small = frame(sql)
    pd.testing.assert_frame_equal(reports.breakdown(small), reports.breakdown(df), check_exact=True)
    assert reports.explain(small) == reports.explain(df)
    pd.testing.assert_frame_equal(
        reports.mfu(small, step_time_s=1.0), reports.mfu(df, step_time_s=1.0), check_exact=True
    )
    pd.testing.assert_frame_equal(
        reports.mfu(frame(sql, mfu_only=True), step_time_s=1.0), reports.mfu(df, step_time_s=1.0), check_exact=True
    )


def _walked(df):
    """The rows reports/sql/flops.sql's flop_rows keeps, from the Python definitions the walks use."""
    packets = df["op"].astype(str).map(packet)
    kind, phase = df["flop_kind"].astype(str), df["phase"].astype(str)
    hops = walks._ADDS | walks.GRADIENT_PLACES | walks._GRADIENT_MOVES
    n_in = df["input_storage_ids"].map(len)
    one = df["input_shapes"].map(lambda shapes: len(shapes) == 2 and any(prod(int(d) for d in s) == 1 for s in shapes))
    return (
        kind.isin(["matmul", "attention"])
        | ((kind == "conv") & (phase == "forward"))
        | packets.isin(ONE_TO_ONE_COPIES | walks._GATHERS | walks.DERIVED)
        | (packets.isin(walks.SCALED) & ((n_in == 1) | ((n_in == 2) & one)))
        | (phase.isin(["backward", "other"]) & ((kind == "collective") | packets.isin(hops)))
    )


@pytest.mark.parametrize("name", ["gpt", "moe_gathers", "fsdp_rank", "tied_bf16"])
def test_the_small_frame_holds_the_walked_rows_a_row_per_group_and_per_step(traces, name):
    df, sql = _pair(traces[name])
    small = frame(sql)
    walked = _walked(df)
    steps = df.groupby(["step", "phase"], observed=True).ngroups
    rest = df[~walked].assign(
        op=df["op"].astype(str).where(df["phase"] == "optimizer", ""),
        dt=df["input_dtypes"].map(lambda v: str(v[0]) if v is not None and len(v) else ""),
        positive=df["flops"] > 0,
    )
    groups = rest.groupby(["phase", "op", "flop_kind", "recompute", "dt", "positive"], observed=True).ngroups
    assert len(small) == int(walked.sum()) + groups + steps < len(df)
    kept = small[small["input_storage_ids"].notna()]
    assert kept["seq"].tolist() == df.loc[walked, "seq"].tolist()
    # every row's FLOPs are in the small frame, the step rows' zero
    assert int(small["flops"].sum()) == int(df["flops"].sum())


def test_the_sql_op_lists_are_the_python_ones():
    import re

    from reports.sql.engine import VIEW_FILES

    text = open(next(f for f in VIEW_FILES if f.endswith("flops.sql")), encoding="utf-8").read()
    body = text[text.index("CREATE VIEW flop_ops") : text.index("CREATE VIEW flop_marked")]
    lists = [set(re.findall(r"'([\w.]+)'", found)) for found in re.findall(r"packet IN \(([^)]*)\)", body)]
    copies, hops, derives, scales = lists
    assert copies == ONE_TO_ONE_COPIES | walks._GATHERS
    assert hops == walks._ADDS | walks.GRADIENT_PLACES | walks._GRADIENT_MOVES
    assert derives == walks.DERIVED and scales == walks.SCALED


def test_figures_from_sql(traces):
    """Literal figures read through Source(trace): no frame of the rows."""
    src = Source(Trace(traces["checkpoint"]))
    rate = src.mfu(1.0, 1e6)
    # test_report_roles.py: forward 13,056, backward 26,752 (8,704 of it re-run by checkpointing), SGD 212
    assert rate["hardware_flops_per_step"] == 13056 + 26752 + 212 == 40020
    assert rate["recompute_flops_per_step"] == 8704  # addmm 2·32·8·16 = 8,192 + relu 32·16 = 512
    assert rate["model_flops_per_step"] == 40020 - 212 - 8704 == 31104
    assert "Activation checkpointing: 8,704 FLOPs per step" in " ".join(src.explain(src.accounts()))
    assert src.count_steps() == 1

    src = Source(Trace(traces["moe_gathers"]))
    t = src.breakdown(src.accounts()).to_pandas().set_index("phase")
    # test_moe.py: N = 32 + 512 + 512 = 1,056, N_active = 32 + 1,024·2/4 = 544, T = 16
    assert t.loc["total", "n_params"] == 1056 and t.loc["total", "n_active"] == 544
    assert t.loc["forward", "weight_matmul_flops"] == 2 * 544 * 16 == 17408
    assert t.loc["backward", "weight_matmul_flops"] == 4 * 544 * 16 == 34816

    src = Source(Trace(traces["lora"]))
    t = src.breakdown(src.accounts()).to_pandas().set_index("phase")
    # N = 64 + 16 + 16 = 96, T = 32: forward base 2·32·8·8 = 4,096 + a 2·32·8·2 = 1,024 + b 2·32·2·8 = 1,024 = 6,144
    assert t.loc["total", "n_params"] == 96 and t.loc["forward", "weight_matmul_flops"] == 6144 == 2 * 96 * 32
    # backward: the frozen base has no dW and x no dL/dx: b's dW and dL/dx 2 x 1,024, a's dW 1,024 = 3,072
    assert t.loc["backward", "weight_matmul_flops"] == 3072

    src = Source(Trace(traces["wide"]))
    # test_overflow.py: 400 matmuls of 13·2**51 FLOPs, past int64 and exact in float64
    assert src.breakdown(src.accounts()).to_pandas().set_index("phase").loc["forward", "flops"] == 400 * 13 * 2**51


@pytest.mark.parametrize(
    "name", ["gpt", "cut", "checkpoint", "moe_grouped", "attention", "teacher", "fsdp_rank", "no_model", "wide"]
)
def test_the_report_text_and_json_are_the_same_from_either_engine(traces, name):
    from reports.output.cli import main

    for flags in ([], ["--json"]):
        outs = []
        for engine in ("pandas", "sql"):
            buf = io.StringIO()
            with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
                warnings.simplefilter("ignore")
                assert (
                    main(
                        [
                            "report",
                            str(traces[name]),
                            "--engine",
                            engine,
                            "--step-time",
                            "0.5",
                            "--peak-tflops",
                            "1",
                            *flags,
                        ]
                    )
                    == 0
                )
            outs.append(buf.getvalue())
        assert outs[0] == outs[1]
    assert "FLOPs per step against 2/4/6 x N x T" in main_text(traces[name])


def main_text(path):
    from reports.output.cli import main

    buf = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
        warnings.simplefilter("ignore")
        main(["report", str(path)])
    return buf.getvalue()


@pytest.mark.parametrize(
    "name", ["gpt", "tied_bf16", "checkpoint", "moe_gathers", "lora", "no_grad_eval", "vmap", "teacher", "fsdp_rank"]
)
def test_every_row_keeps_its_role(traces, name):
    """Roles on the small frame give each walked row the category, weight, activation and training flag it gets
    among all rows; every other row of the trace is "other", multiplies no weight and is no training matmul."""
    df, sql = _pair(traces[name])
    small = frame(sql)
    meta = next(iter(df.attrs["runs"].values()))
    whole, cut = roles.Roles(df, meta), roles.Roles(small, meta)
    kept = small["input_storage_ids"].notna().to_numpy()
    at = df["seq"].isin(small.loc[kept, "seq"]).to_numpy()
    assert at.sum() == kept.sum() > 0
    for field in ("category", "param", "activation", "training"):
        assert getattr(cut, field)[kept].tolist() == getattr(whole, field)[at].tolist(), field
    assert (whole.category[~at] == "other").all() and (whole.param[~at] == -1).all() and not whole.training[~at].any()
    assert cut.matmul_params == whole.matmul_params and cut.names == whole.names


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_frame_from_the_traces_read_is_the_querys(traces, name):
    """reports/sql/flop_rows.py: the walked rows and groups kept from the Trace's one read of the parts (Trace(keep=...),
    as `optrace report` opens it) make the frame flops.sql's query makes, column for column (a trace whose FLOP sums
    could wrap int64 is read by the query)."""
    from reports.sql import tables
    from reports.sql.flop_rows import FlopRows
    from reports.sql.kept_views import ModuleOwn, Peak

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept, sql = Trace(traces[name], keep=(FlopRows, ModuleOwn, Peak)), Trace(traces[name])
    assert (FlopRows, 0) in kept.kept
    pd.testing.assert_frame_equal(frame(kept), frame(sql), check_exact=True)
    assert not kept.kept  # taken once: a second frame is the query's
    pd.testing.assert_frame_equal(frame(kept), frame(sql), check_exact=True)
    # module_own and peak from tables of the kept rows (reports/sql/kept_views.py), FLOPs past int64 by the scan's view
    pd.testing.assert_frame_equal(tables.module_own(kept)[0], tables.module_own(sql)[0], check_exact=True)
    pd.testing.assert_frame_equal(tables.peak(kept), tables.peak(sql), check_exact=True)


def test_a_part_storing_strings_plain_gives_the_frame_of_the_dictionary_one(tmp_path):
    """One part rewritten with plain strings where the tracer writes dictionaries (`input_dtypes` a list<string>, as
    another tool may save it; validate accepts either): the FLOP rows kept from the read of the parts (flop_rows.py)
    make the same frame as the unchanged trace's. Before, building the rows raised ArrowTypeError (the parts' chunks
    of two types) and `optrace report` printed a traceback."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from reports.sql.flop_rows import FlopRows
    from tests.reports.loading.test_damage import rewrite
    from tests.reports.sql.test_sql import _gpt
    from tracer.schema import part_paths

    def plain(table):
        fields = []
        for f in table.schema:
            t = f.type
            if pa.types.is_dictionary(t):
                t = pa.string()
            elif pa.types.is_list(t) and pa.types.is_dictionary(t.value_type):
                t = pa.list_(pa.string())
            fields.append(pa.field(f.name, t))
        schema = pa.schema(fields, metadata=table.schema.metadata)
        return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(table.columns, schema)], schema=schema)

    _gpt(tmp_path / "dictionary", 3)
    mixed = shutil.copytree(tmp_path / "dictionary", tmp_path / "mixed")
    rewrite(part_paths(mixed)[1], plain)
    assert pa.types.is_list(pq.read_schema(part_paths(mixed)[1]).field("input_dtypes").type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept, whole = Trace(mixed, keep=(FlopRows,)), Trace(tmp_path / "dictionary", keep=(FlopRows,))
    assert (FlopRows, 0) in kept.kept
    pd.testing.assert_frame_equal(frame(kept), frame(whole), check_exact=True)


def test_kept_rows_that_cannot_be_joined_leave_the_frame_to_the_query(tmp_path, monkeypatch):
    """If the kept FLOP rows cannot be made into one table (an Arrow type error on parts of unforeseen types), the
    frame is the flops.sql query's, as for a Trace that kept nothing: the same frame, no traceback."""
    import pyarrow as pa

    from reports.sql.flop_rows import FlopRows
    from tests.reports.sql.test_sql import _gpt

    _gpt(tmp_path / "t", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = frame(Trace(tmp_path / "t"))

        def fail(self, wide, steps):
            raise pa.ArrowTypeError("Array chunks must all be same type")

        monkeypatch.setattr(FlopRows, "table", fail)
        kept = Trace(tmp_path / "t", keep=(FlopRows,))
    assert (FlopRows, 0) in kept.kept
    pd.testing.assert_frame_equal(frame(kept), reference, check_exact=True)


def test_the_kept_flop_rows_hold_int32_where_it_fits_and_a_seq_past_it_exact(tmp_path):
    """FlopRows held the walked rows' codes, seq and step in int64 until `table` (7.5 MB a million rows); in int32
    where a part's values fit now, and a seq past int32 (2**40 added to every row's) kept exact: the frame is the
    query's."""
    import shutil

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from reports.sql.flop_rows import FlopRows
    from tests.reports.loading.test_damage import rewrite
    from tests.reports.sql.test_sql import _gpt
    from tracer.schema import part_paths

    _gpt(tmp_path / "t", 3)
    far = shutil.copytree(tmp_path / "t", tmp_path / "far")
    for part in part_paths(far):
        rewrite(part, lambda t: t.set_column(t.schema.get_field_index("seq"), "seq", pc.add(t["seq"], 2**40)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        near, past = Trace(tmp_path / "t", keep=(FlopRows,)), Trace(far, keep=(FlopRows,))
        query = Trace(far)
    walked = near.kept[FlopRows, 0].walked
    assert {walked[c][0].dtype for c in ("op", "phase", "flop_kind", "module", "grad_mode")} == {np.dtype("int32")}
    assert walked["seq"][0].type == walked["step"][0].type == pa.int32() and walked["flops"][0].type == pa.int64()
    walked = past.kept[FlopRows, 0].walked
    assert walked["seq"][0].type == pa.int64() and walked["seq"][0][0].as_py() >= 2**40  # 1,099,511,627,776
    got = frame(past)
    assert got["seq"].min() >= 2**40
    pd.testing.assert_frame_equal(got, frame(query), check_exact=True)


_NO_PANDAS = r"""
import json, os, sys, types
import importlib.abc

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is blocked")

sys.meta_path.insert(0, Blocked())
package = types.ModuleType("reports")  # reports/__init__ imports the pandas tables: the FLOP sections need none of it
package.__path__ = [os.path.join(os.getcwd(), "reports")]
sys.modules["reports"] = package
import pyarrow as pa
import pyarrow.parquet as pq
from reports.flops.breakdown import breakdown_table
from reports.flops.explain import explain_lines
from reports.flops.meter import meter_summary
from reports.flops.mfu import mfu_table
from reports.flops.rows import COLUMNS, Frame
from tracer.schema import part_paths, read_metadata

path = sys.argv[1]
rows = pq.read_table(part_paths(path))
rows = rows.select([c for c in COLUMNS if c in rows.column_names] + ["duration_ns"])
name = os.path.basename(path)  # the run's name, as reports.load gives it
rows = rows.add_column(0, "run", pa.array([name] * rows.num_rows))
frame = Frame(rows, {name: read_metadata(path)})
print(json.dumps({"breakdown": breakdown_table(frame).to_pylist(), "explain": explain_lines(frame),
                  "mfu": mfu_table(frame, step_time_s=1.0, peak_flops=1e6).to_pylist(),
                  "meter": meter_summary(frame.runs),
                  "pandas": "pandas" in sys.modules,
                  "modules": sorted({os.path.dirname(sys.modules[n].__file__) for n in ("tracer", "reports.flops.mfu")})}))
"""


def test_the_flop_sections_import_and_run_without_pandas(traces):
    """breakdown, explain and MFU over a pyarrow.Table, in a process where pandas cannot be
    imported, equal the library's DataFrames of the same trace (its pandas boundary: reports.flops.rows.to_frame)."""
    import subprocess
    import sys

    def plain(records):  # NaN as None, numpy scalars as Python's: the JSON the child printed
        return [{k: None if isinstance(v, float) and v != v else getattr(v, "item", lambda: v)() for k, v in r.items()}
                for r in records]  # fmt: skip

    path = traces["checkpoint"]
    done = subprocess.run([sys.executable, "-c", _NO_PANDAS, str(path)], capture_output=True, text=True,
                          cwd=str(helpers.ROOT), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["pandas"] is False and found["meter"] is None  # no Meter table in this trace
    # the modules the child ran are this checkout's (not an installed copy's)
    assert found["modules"] == [str(helpers.ROOT / "reports" / "flops"), str(helpers.ROOT / "tracer")]
    df = reports.load(path)
    assert plain(found["breakdown"]) == plain(reports.breakdown(df).to_dict("records"))
    assert found["explain"] == reports.explain(df)
    mfu = found["mfu"][0]
    # test_figures_from_sql: hardware 13,056 + 26,752 + 212 = 40,020, of it 8,704 re-run by checkpointing
    assert mfu["hardware_flops_per_step"] == 40020 and mfu["recompute_flops_per_step"] == 8704
    assert plain([mfu]) == plain(reports.mfu(df, step_time_s=1.0, peak_flops=1e6).to_dict("records"))
    # the library's strings stay objects at the boundary (pandas 3 would make an Arrow string column its str dtype)
    assert reports.breakdown(df)["phase"].dtype == object and reports.mfu(df)["device"].dtype == object


def test_the_consumers_of_a_read_code_each_parts_column_once():
    """reports.sql.rowpass.CodeBook: consumers sharing one get the same codes of a part's column (coded once, kept
    for the next consumer), numbered as first seen across parts; another part's column is coded anew."""
    import pyarrow as pa

    from reports.sql.rowpass import CodeBook

    book = CodeBook()
    part = pa.table({"op": pa.array(["aten.mm", "aten.add", "aten.mm"]).dictionary_encode()})
    first = book["op"].of(part.column("op"))
    assert book["op"].of(part.column("op")) is first  # the second consumer's: the same array, not coded again
    assert first.tolist() == [0, 1, 0] and book["op"].names == ["aten.mm", "aten.add"]
    later = pa.table({"op": pa.array(["aten.sum", "aten.mm"]).dictionary_encode()})
    assert book["op"].of(later.column("op")).tolist() == [2, 0]  # aten.sum new: code 2
    assert book["op"].of(part.column("op")).tolist() == [0, 1, 0]  # the first part again: coded again, same codes


def test_codes_of_one_indices_buffer_under_another_dictionary_are_made_anew():
    """reports.sql.rowpass.Codes keeps the codes of the column it coded last by where its values lie: the same indices
    under another dictionary are another column (its names looked up again)."""
    import pyarrow as pa

    from reports.sql.rowpass import Codes

    indices = pa.array([0, 1, 0], pa.int32())
    codes = Codes()
    assert codes.of(pa.DictionaryArray.from_arrays(indices, pa.array(["a", "b"]))).tolist() == [0, 1, 0]
    assert codes.of(pa.DictionaryArray.from_arrays(indices, pa.array(["c", "a"]))).tolist() == [2, 0, 2]  # c new: 2
