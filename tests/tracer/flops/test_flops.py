"""FLOP formulas: golden numbers on tiny shapes, parity with torch's FlopCounterMode,
the registration API and its messages, and the classification of a training step."""

from collections import defaultdict
from math import prod

import pytest
import torch
import torch.nn.functional as F
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from tracer.errors import TraceError
from tracer.flops import formulas as flops
from tracer.flops.formulas import register_flop_formula
from tracer.flops.op_kinds import METADATA_OPS, FlopRule, flop_rule
from tracer.schema import FLOP_KINDS

aten = torch.ops.aten


class _Record(TorchDispatchMode):
    """Runs every op and records (op, kind, flops, causal) from its FlopRule."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in METADATA_OPS:
            rule = flop_rule(func)
            causal = rule.causal(args, kwargs) if rule.causal else None
            count = rule.count(args, kwargs, out)
            self.rows.append((func, rule.kind, count.flops if rule.detailed else count, causal))
        return out


def record(fn):
    with _Record() as mode:
        fn()
    return mode.rows


def flops_of(fn, op):
    """Total FLOPs and the kinds recorded for one op packet while running fn."""
    rows = [r for r in record(fn) if r[0].overloadpacket is op]
    assert rows, f"{op} was not dispatched"
    return sum(r[2] for r in rows), {r[1] for r in rows}


def ones(*shape, **kw):
    return torch.ones(*shape, **kw)


# ------------------------------------------------------------------ golden numbers

GOLDEN = [
    # (name, op, run, flops, kind)
    ("mm", aten.mm, lambda: ones(16, 32) @ ones(32, 2), 2 * 16 * 32 * 2, "matmul"),  # 2048
    (
        "addmm",
        aten.addmm,  # the bias adds are not counted
        lambda: torch.addmm(ones(2), ones(16, 32), ones(32, 2)),
        2048,
        "matmul",
    ),
    ("bmm", aten.bmm, lambda: torch.bmm(ones(3, 4, 5), ones(3, 5, 6)), 2 * 3 * 4 * 5 * 6, "matmul"),  # 720
    ("baddbmm", aten.baddbmm, lambda: torch.baddbmm(ones(3, 4, 6), ones(3, 4, 5), ones(3, 5, 6)), 720, "matmul"),
    ("addbmm", aten.addbmm, lambda: torch.addbmm(ones(4, 6), ones(3, 4, 5), ones(3, 5, 6)), 720, "matmul"),
    ("mv", aten.mv, lambda: torch.mv(ones(4, 5), ones(5)), 2 * 4 * 5, "matmul"),  # 40
    ("addmv", aten.addmv, lambda: torch.addmv(ones(4), ones(4, 5), ones(5)), 40, "matmul"),
    ("dot", aten.dot, lambda: torch.dot(ones(7), ones(7)), 2 * 7, "matmul"),  # 14
    (
        "_addmm_activation",
        aten._addmm_activation,  # bias + a @ b, then gelu: the matmul only
        lambda: torch._addmm_activation(ones(2), ones(16, 32), ones(32, 2), use_gelu=True),
        2048,
        "matmul",
    ),
    # the weight-only quantized and FP8 matmuls, x [4, 64] times a weight of 64 x 32 values: 2 * 4 * 64 * 32 = 16384
    (
        "_weight_int8pack_mm",
        aten._weight_int8pack_mm,
        lambda: aten._weight_int8pack_mm(ones(4, 64), ones(32, 64, dtype=torch.int8), ones(32)),
        16384,
        "matmul",
    ),
    (
        "_weight_int4pack_mm_for_cpu",
        aten._weight_int4pack_mm_for_cpu,  # the weight packed to [32, 32] bytes
        lambda: aten._weight_int4pack_mm_for_cpu(
            ones(4, 64, dtype=torch.bfloat16),
            aten._convert_weight_to_int4pack_for_cpu(ones(32, 64, dtype=torch.int32), 2),
            32,
            ones(2, 32, 2, dtype=torch.bfloat16),
        ),
        16384,
        "matmul",
    ),
    (
        "_dyn_quant_matmul_4bit",
        aten._dyn_quant_matmul_4bit,  # on meta: a real packed weight needs KleidiAI
        lambda: aten._dyn_quant_matmul_4bit(
            ones(4, 64, device="meta"), ones(1100, dtype=torch.uint8, device="meta"), 32, 64, 32
        ),
        16384,
        "matmul",
    ),
    (
        "_scaled_mm_v2",
        aten._scaled_mm_v2,
        lambda: aten._scaled_mm_v2(
            ones(4, 64, dtype=torch.float8_e4m3fn),
            ones(32, 64, dtype=torch.float8_e4m3fn).t(),
            [torch.tensor(1.0)],
            [0],
            [0],
            [torch.tensor(1.0)],
            [0],
            [0],
            None,
            torch.float32,
        ),
        16384,
        "matmul",
    ),
    ("addr", aten.addr, lambda: torch.addr(ones(3, 4), ones(3), ones(4)), 2 * 3 * 4, "matmul"),  # 24
    # x [2, 3, 8, 8] * w [4, 3, 3, 3], padding 1 -> [2, 4, 8, 8]: 2 * 2 * 64 * (4 * 3 * 3 * 3) = 27648
    ("conv2d", aten.convolution, lambda: F.conv2d(ones(2, 3, 8, 8), ones(4, 3, 3, 3), padding=1), 27648, "conv"),
    ("add", aten.add, lambda: ones(3, 4) + ones(4), 3 * 4, "elementwise"),  # one per output element
    ("add_", aten.add_, lambda: ones(3, 4).add_(1), 12, "elementwise"),  # in place: the input's numel
    ("gelu", aten.gelu, lambda: F.gelu(ones(3, 4)), 12, "elementwise"),  # gelu counts 1 per element
    # activations without the pointwise tag, and their backward: one per element written
    ("hardswish", aten.hardswish, lambda: F.hardswish(ones(3, 4)), 12, "elementwise"),
    ("glu", aten.glu, lambda: F.glu(ones(3, 4)), 3 * 2, "elementwise"),  # halves the last dim: 6
    ("log_sigmoid", aten.log_sigmoid_forward, lambda: F.logsigmoid(ones(3, 4)), 12, "elementwise"),  # not its buffer
    ("floor_divide", aten.floor_divide, lambda: torch.floor_divide(ones(3, 4), ones(4)), 12, "elementwise"),
    (
        "leaky_relu backward",
        aten.leaky_relu_backward,
        lambda: F.leaky_relu(ones(3, 4, requires_grad=True)).sum().backward(),
        12,
        "elementwise",
    ),
    (
        "glu backward",
        aten.glu_backward,  # writes dL/dx of the [3, 4] input: 12
        lambda: F.glu(ones(3, 4, requires_grad=True)).sum().backward(),
        12,
        "elementwise",
    ),
    (
        "weight_norm",
        aten._weight_norm_interface,  # w = g v / ||v||: one per element of v [4, 3]
        lambda: torch._weight_norm_interface(ones(4, 3), ones(4, 1), 0),
        12,
        "elementwise",
    ),
    (
        "amp update scale",
        aten._amp_update_scale_,  # GradScaler's bookkeeping of one scale
        lambda: torch._amp_update_scale_(ones(1), ones(1, dtype=torch.int32), torch.zeros(1), 2.0, 0.5, 100),
        0,
        "none",
    ),
    ("sum", aten.sum, lambda: ones(3, 4).sum(), 12, "reduction"),  # one per input element
    ("mean dim", aten.mean, lambda: ones(3, 4).mean(0), 12, "reduction"),
    ("softmax", aten._softmax, lambda: ones(3, 4).softmax(-1), 5 * 12, "softmax"),  # 60
    ("log_softmax", aten._log_softmax, lambda: ones(3, 4).log_softmax(-1), 60, "softmax"),
    # [3, 4] with weight and bias: 12 * (5 + 1 + 1) = 84; without: 12 * 5 = 60
    ("layer_norm", aten.native_layer_norm, lambda: F.layer_norm(ones(3, 4), (4,), ones(4), ones(4)), 84, "norm"),
    ("layer_norm no affine", aten.native_layer_norm, lambda: F.layer_norm(ones(3, 4), (4,)), 60, "norm"),
    # [2, 3, 4] eval with running stats: 2 * 24 = 48; training: 24 * (5 + 1 + 1) = 168
    (
        "batch_norm eval",
        aten.native_batch_norm,
        lambda: F.batch_norm(ones(2, 3, 4), ones(3), ones(3), ones(3), ones(3)),
        48,
        "norm",
    ),
    (
        "batch_norm train",
        aten.native_batch_norm,
        lambda: F.batch_norm(ones(2, 3, 4), ones(3), ones(3), ones(3), ones(3), training=True),
        168,
        "norm",
    ),
    # [2, 4, 3] in 2 groups, with weight and bias: 24 * 7 = 168
    ("group_norm", aten.native_group_norm, lambda: F.group_norm(ones(2, 4, 3), 2, ones(4), ones(4)), 168, "norm"),
    # two tensors of 3 and 4 elements: one per element written, 3 + 4 = 7
    ("foreach add_", aten._foreach_add_, lambda: torch._foreach_add_([ones(3), ones(2, 2)], 1.0), 7, "foreach"),
    (
        "foreach addcmul_",
        aten._foreach_addcmul_,
        lambda: torch._foreach_addcmul_([ones(3), ones(4)], [ones(3), ones(4)], [ones(3), ones(4)], 0.5),
        7,
        "foreach",
    ),
    ("foreach norm", aten._foreach_norm, lambda: torch._foreach_norm([ones(3), ones(4)]), 7, "foreach"),
    # one add per element of grad_output [6, 5], gathered into the weight grad: 30
    (
        "embedding backward",
        aten.embedding_dense_backward,
        lambda: aten.embedding_dense_backward(ones(6, 5), torch.arange(6), 10, -1, False),
        30,
        "elementwise",
    ),
    ("view", aten.view, lambda: ones(3, 4).view(12), 0, "none"),
    ("clone", aten.clone, lambda: ones(3, 4).clone(), 0, "none"),  # tagged pointwise, still a copy
    ("randn", aten.randn, lambda: torch.randn(3, 4), 0, "none"),
]


@pytest.mark.parametrize("name, op, run, expected, kind", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden(name, op, run, expected, kind):
    assert flops_of(run, op) == (expected, {kind})


def test_out_overload_uses_its_packet_tag():
    # add.out carries no pointwise tag; aten.add's overloads that are tagged all say pointwise
    run = lambda: torch.add(ones(3, 4), 1, out=torch.empty(3, 4))  # noqa: E731
    assert flops_of(run, aten.add) == (12, {"elementwise"})


def test_index_put_counts_only_when_accumulating():
    x, idx, values = torch.zeros(5, 3), torch.tensor([0, 0, 2]), ones(3, 3)
    # accumulate=True: one add per value, 3 * 3 = 9; accumulate=False is a copy
    run = lambda: x.index_put_((idx,), values, accumulate=True)  # noqa: E731
    assert flops_of(run, aten.index_put_) == (9, {"elementwise"})
    assert flops_of(lambda: x.index_put_((idx,), values), aten.index_put_) == (0, {"elementwise"})


def test_native_dropout_counts_one_per_input_element():
    # output [3, 4] plus a mask [3, 4]: 12, the mask is not counted again
    run = lambda: aten.native_dropout(ones(3, 4), 0.5, True)  # noqa: E731
    assert flops_of(run, aten.native_dropout) == (12, {"elementwise"})


def test_batch_norm_backward():
    x, w, b = ones(2, 3, 4, requires_grad=True), ones(3, requires_grad=True), ones(3, requires_grad=True)
    y = F.batch_norm(x, None, None, w, b, training=True)
    # 24 elements * (grad_input 9 + 1 weight, grad_weight 2, grad_bias 1) = 312
    assert flops_of(lambda: y.sum().backward(), aten.native_batch_norm_backward) == (312, {"norm"})


def test_conv2d_backward():
    x = ones(2, 3, 8, 8, requires_grad=True)
    w = ones(4, 3, 3, 3, requires_grad=True)
    out = F.conv2d(x, w, padding=1)
    # grad_input: conv_transpose(grad_out [2, 4, 8, 8], w) = 2 * 2 * 64 * 108 = 27648
    # grad_weight: conv(x^T [3, 2, 8, 8], grad_out^T [4, 2, 8, 8]) -> [3, 4, 3, 3]: 2 * 3 * 9 * 512 = 27648
    assert flops_of(lambda: out.sum().backward(), aten.convolution_backward) == (55296, {"conv"})


def test_softmax_and_layer_norm_backward():
    x = ones(3, 4, requires_grad=True)
    y = x.softmax(-1)
    assert flops_of(lambda: y.sum().backward(), aten._softmax_backward_data) == (4 * 12, {"softmax"})
    w, b = ones(4, requires_grad=True), ones(4, requires_grad=True)
    y = F.layer_norm(x, (4,), w, b)
    # 12 * (grad_input 9 + 1 weight, grad_weight 2, grad_bias 1) = 156
    assert flops_of(lambda: y.sum().backward(), aten.native_layer_norm_backward) == (156, {"norm"})


def test_sdpa_cpu_forward_backward_and_causal():
    q, k, v = (ones(2, 3, 8, 4, requires_grad=True) for _ in range(3))
    # [b=2, h=3, s=8, d=4]: 2 * b * h * s_q * s_k * (d_qk + d_v) = 2 * 2 * 3 * 8 * 8 * 8 = 6144
    for causal in (False, True):
        rows = record(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward())
        fwd = [r for r in rows if r[0] is aten._scaled_dot_product_flash_attention_for_cpu.default]
        bwd = [r for r in rows if r[0] is aten._scaled_dot_product_flash_attention_for_cpu_backward.default]
        assert [r[1:] for r in fwd] == [("attention", 6144, causal)]
        # backward: 2 * 2 * 3 * 8 * 8 * (3 * 4 + 2 * 4) = 15360 = 2.5 x forward
        assert [r[1:] for r in bwd] == [("attention", 15360, causal)]


def test_causal_positional_and_keyword():
    rule = flop_rule(aten._scaled_dot_product_flash_attention_for_cpu.default)
    q = ones(1, 1, 2, 2)
    assert rule.causal((q, q, q, 0.0, True), {}) is True
    assert rule.causal((q, q, q), {"is_causal": True}) is True
    assert rule.causal((q, q, q), {}) is False
    rule = flop_rule(aten._efficient_attention_forward.default)
    args = (q, q, q, None, None, None, None, None, 0.0)
    assert rule.causal(args + (1,), {}) is True  # custom_mask_type 1: causal from the top left
    assert rule.causal(args + (0,), {}) is False
    assert flop_rule(aten.mm.default).causal is None


# ------------------------------------------------------------------ parity with FlopCounterMode


def _grad(*shape):
    return torch.randn(*shape, requires_grad=True)


PARITY = [
    ("mm", lambda: torch.randn(16, 32) @ torch.randn(32, 8)),
    ("linear fwd+bwd", lambda: F.linear(_grad(4, 6, 16), _grad(8, 16), _grad(8)).sum().backward()),
    ("matmul 3d fwd+bwd", lambda: (_grad(3, 4, 5) @ _grad(3, 5, 6)).sum().backward()),
    ("baddbmm", lambda: torch.baddbmm(torch.randn(3, 4, 6), torch.randn(3, 4, 5), torch.randn(3, 5, 6))),
    ("conv2d fwd+bwd", lambda: F.conv2d(_grad(2, 3, 9, 9), _grad(4, 3, 3, 3), stride=2).sum().backward()),
    # grouped convolutions: forward only; FlopCounterMode's backward does not divide by groups
    # (tests/tracer/flops/test_conv_groups.py pins ours)
    ("conv1d groups fwd", lambda: F.conv1d(torch.randn(2, 4, 10), torch.randn(6, 2, 3), groups=2)),
    (
        "conv_transpose2d fwd+bwd",
        lambda: F.conv_transpose2d(_grad(2, 3, 5, 5), _grad(3, 4, 3, 3), stride=2).sum().backward(),
    ),
    ("conv3d fwd+bwd", lambda: F.conv3d(_grad(1, 2, 4, 5, 6), _grad(3, 2, 2, 2, 2)).sum().backward()),
    (
        "_scaled_mm",
        lambda: torch._scaled_mm(
            torch.randn(16, 32).to(torch.float8_e4m3fn),
            torch.randn(8, 32).to(torch.float8_e4m3fn).t(),
            torch.tensor(1.0),
            torch.tensor(1.0),
            out_dtype=torch.float32,
        ),
    ),
    # on meta, sdpa takes the math path (bmm, _safe_softmax), which FlopCounterMode counts
    (
        "sdpa meta causal fwd+bwd",
        lambda: (
            F.scaled_dot_product_attention(
                *(torch.randn(2, 4, 16, 8, device="meta", requires_grad=True) for _ in range(3)), is_causal=True
            )
            .sum()
            .backward()
        ),
    ),
]


@pytest.mark.parametrize("name, run", PARITY, ids=[p[0] for p in PARITY])
def test_parity_with_flop_counter_mode(name, run):
    torch.manual_seed(0)
    ours = defaultdict(int)
    for func, _, count, _ in record(run):
        ours[func.overloadpacket] += count
    with FlopCounterMode(display=False) as counter:
        run()
    theirs = counter.get_flop_counts().get("Global", {})
    assert theirs, f"{name}: FlopCounterMode counted nothing"
    assert {op: ours[op] for op in theirs} == theirs


def test_sdpa_cpu_kernel_which_flop_counter_mode_misses():
    q = _grad(2, 4, 16, 8)
    run = lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()  # noqa: E731
    with FlopCounterMode(display=False) as counter:
        run()
    assert counter.get_total_flops() == 0
    ours = {func.overloadpacket: count for func, kind, count, _ in record(run) if kind == "attention"}
    # 2 * 2 * 4 * 16 * 16 * (8 + 8) = 65536 forward; backward 2.5x = 163840
    assert ours == {
        aten._scaled_dot_product_flash_attention_for_cpu: 65536,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: 163840,
    }


ATTENTION_SHAPES = [
    # (q, k, v) in [b, h, s, d]: plain, cross-attention, GQA with d_v != d_qk
    ((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)),
    ((1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8)),
    ((2, 8, 6, 16), (2, 2, 10, 16), (2, 2, 10, 4)),
]


@pytest.mark.parametrize("q, k, v", ATTENTION_SHAPES)
def test_attention_formulas_match_torch(q, k, v):
    out = (q[0], q[1], q[2], v[3])
    assert flops.sdpa_flop(q, k, v) == flop_counter.sdpa_flop(q, k, v)
    assert flops.sdpa_backward_flop(out, q, k, v) == flop_counter.sdpa_backward_flop(out, q, k, v)
    # the flash / efficient kernels take [b, s, h, d]; torch's counts need [b, h, s, d] (see flops.py)
    t = lambda s: (s[0], s[2], s[1], s[3])  # noqa: E731
    fwd, bwd = flop_counter.sdpa_flop_count(q, k, v), flop_counter.sdpa_backward_flop_count(out, q, k, v)
    assert flops.flash_attention_flop(t(q), t(k), t(v), None, None, q[2], k[2]) == fwd
    assert flops.efficient_attention_flop(t(q), t(k), t(v), None, None, None, q[2], k[2]) == fwd
    assert flops.flash_attention_backward_flop(t(out), t(q), t(k), t(v), t(out), None, None, None, q[2], k[2]) == bwd
    assert (
        flops.efficient_attention_backward_flop(t(out), t(q), t(k), t(v), None, t(out), None, None, q[2], k[2]) == bwd
    )


def test_varlen_flash_attention_matches_torch_on_meta():
    # 3 packed sequences, at most 5 long, 2 heads, d 8: counted as 3 sequences of 5 (upper bound)
    meta = dict(device="meta")
    q = torch.empty(12, 2, 8, **meta)
    cum = torch.empty(4, dtype=torch.int32, **meta)
    args = (q, q, q, cum, cum, 5, 5, 0.0, False, False)
    rule = flop_rule(aten._flash_attention_forward.default)
    expected = flop_counter._flash_attention_forward_flop(q, q, q, cum, cum, 5, 5)
    # the lengths of meta tensors cannot be read: the count is the bound, and says so
    assert rule.count(args, {}, None) == (expected, True, None)
    assert expected == 3 * 2 * 2 * 5 * 5 * (8 + 8)


def test_slow_conv2d_forward_which_flop_counter_mode_rejects():
    x, w = ones(1, 2, 5, 5), ones(3, 2, 3, 3)
    # [1, 2, 5, 5] * [3, 2, 3, 3] -> [1, 3, 3, 3]: 2 * 1 * 9 * 54 = 972
    run = lambda: aten._slow_conv2d_forward(x, w, [3, 3], None, [1, 1], [0, 0])  # noqa: E731
    assert flops_of(run, aten._slow_conv2d_forward) == (972, {"conv"})


# ------------------------------------------------------------------ registration


@torch.library.custom_op("optrace_test::mymul", mutates_args=())
def mymul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y


@register_flop_formula(torch.ops.optrace_test.mymul, kind="elementwise")
def _mymul_flop(x_shape, y_shape, out_shape=None, **kwargs) -> int:
    """Three FLOPs per output element (an arbitrary test value)."""
    return 3 * prod(out_shape)


def test_custom_op_formula():
    x = ones(3, 4)
    assert flops_of(lambda: mymul(x, x), torch.ops.optrace_test.mymul) == (36, {"elementwise"})


@torch.library.custom_op("optrace_test::noformula", mutates_args=())
def noformula(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_custom_op_without_formula_is_unknown():
    assert flops_of(lambda: noformula(ones(2)), torch.ops.optrace_test.noformula) == (0, {"unknown"})


def test_register_refuses_wrong_target_type():
    with pytest.raises(TraceError, match="got 'mm' of type str"):
        register_flop_formula("mm")
    with pytest.raises(TraceError, match=r"OpOverload aten\.mm\.default; pass its packet aten\.mm"):
        register_flop_formula(aten.mm.default)


def test_register_refuses_duplicate():
    with pytest.raises(TraceError, match="aten::mm already has a FLOP formula"):
        register_flop_formula(aten.mm)(lambda *a, out_shape=None, **k: 0)
    with pytest.raises(TraceError, match="optrace_test::mymul already has"):
        register_flop_formula([torch.ops.optrace_test.mymul])(lambda *a, out_shape=None, **k: 0)


def test_register_refuses_bad_kind():
    with pytest.raises(TraceError, match="kind 'matmuls' is not one of matmul, attention, conv"):
        register_flop_formula(torch.ops.optrace_test.mymul, kind="matmuls")


# ------------------------------------------------------------------ classification


def test_every_aten_overload_gets_a_rule():
    seen = 0
    for name in dir(aten):
        packet = getattr(aten, name)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            for overload in packet.overloads():
                rule = flop_rule(getattr(packet, overload))
                assert isinstance(rule, FlopRule) and rule.kind in FLOP_KINDS
                seen += 1
    assert seen > 2000


def test_metadata_ops():
    for op in (
        aten.size.default,
        aten.size.int,
        aten.stride.default,
        aten.numel.default,
        aten.dim.default,
        aten.is_contiguous.default,
        aten.is_contiguous.memory_format,
        aten.sym_size.int,
        torch.ops.prim.layout.default,
        torch.ops.prim.device.default,
    ):
        assert op in METADATA_OPS
    assert aten.view.default not in METADATA_OPS


@pytest.mark.parametrize(
    "module",
    [
        torch.nn.Hardswish,
        torch.nn.LeakyReLU,
        torch.nn.ELU,
        torch.nn.SELU,
        torch.nn.CELU,
        torch.nn.Softplus,
        torch.nn.Mish,
        torch.nn.GLU,
        torch.nn.PReLU,
        torch.nn.Hardtanh,
        torch.nn.ReLU6,
        torch.nn.Hardsigmoid,
        torch.nn.LogSigmoid,
        torch.nn.RReLU,
        torch.nn.Softshrink,
        torch.nn.Hardshrink,
    ],
    ids=lambda m: m.__name__,
)
def test_activations_and_their_backward_have_a_kind(module):
    torch.manual_seed(0)
    rows = record(lambda: module()(torch.randn(4, 6, requires_grad=True)).sum().backward())
    assert not [str(op) for op, kind, _, _ in rows if kind == "unknown"]
    # each activation's forward and backward op counts the 24 elements it writes (GLU's forward 12)
    counted = {str(op): flops for op, kind, flops, _ in rows if kind == "elementwise" and flops}
    assert counted and set(counted.values()) <= {24, 12}, counted


def test_training_step_has_no_unknown_op():
    torch.manual_seed(0)
    vocab, dim, heads = 50, 16, 2

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, dim)
            self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
            self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
            self.fc, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
            self.drop = torch.nn.Dropout(0.1)
            self.head = torch.nn.Linear(dim, vocab)

        def forward(self, idx):
            b, s = idx.shape
            x = self.emb(idx)
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-1, -2)) * (dim // heads) ** -0.5
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            manual = (scores.masked_fill(mask, float("-inf")).softmax(-1) @ v).transpose(1, 2)
            fused = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
            x = x + self.proj((manual + fused).reshape(b, s, dim))
            x = x + self.drop(self.fc2(F.gelu(self.fc(self.ln2(x)))))
            return self.head(x)

    model = Block()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    idx = torch.randint(0, vocab, (2, 8))

    def step():
        logits = model(idx)
        F.cross_entropy(logits.view(-1, vocab), idx.view(-1)).backward()
        opt.step()
        opt.zero_grad()

    rows = record(lambda: [step() for _ in range(2)])
    unknown = sorted({str(func) for func, kind, _, _ in rows if kind == "unknown"})
    assert not unknown, f"ops without a FLOP kind: {unknown}"
    kinds = {kind for _, kind, _, _ in rows}
    assert {"matmul", "attention", "elementwise", "reduction", "softmax", "norm", "foreach", "none"} <= kinds
