"""Mixture-of-experts grouped matmuls: _grouped_mm and _scaled_grouped_mm FLOPs from the group
offsets (exact, with tokens per expert in group_sizes), and the flagged bound where the offsets
cannot be read (meta, fake tensors)."""

import pandas as pd
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.helpers import unwrapped
from tracer import Tracer
from tracer.flops.formulas import FlopCount
from tracer.flops.grouped import concrete_ints, grouped_mm_count
from tracer.flops.op_kinds import flop_rule

aten = torch.ops.aten
T, K, N, E = 16, 8, 8, 3  # tokens, model width, expert width, experts (16-byte aligned strides in bf16)


def grouped_rows(tmp_path, fn):
    path = tmp_path / "t"
    with Tracer(path):
        out = fn()
    df = pd.read_parquet(path)
    return out, df[df["op"] == "aten._grouped_mm.default"].reset_index(drop=True)


def test_forward_on_cpu_counts_the_routed_tokens(tmp_path):
    torch.manual_seed(0)
    a, b = torch.randn(T, K), torch.randn(E, K, N)
    offs = torch.tensor([2, 5, 16], dtype=torch.int32)  # experts get 2, 3 and 11 tokens
    expected = torch._grouped_mm(a, b, offs=offs)
    out, rows = grouped_rows(tmp_path, lambda: torch._grouped_mm(a, b, offs=offs))
    assert torch.equal(out, expected)
    (r,) = rows.itertuples()
    assert r.flops == 2 * T * K * N == 2048  # (2 + 3 + 11) tokens x 2 * 8 * 8
    assert not r.flops_bound and list(r.group_sizes) == [2, 3, 11]
    assert r.flop_kind == "matmul"


def test_rows_past_the_last_offset_are_not_counted(tmp_path):
    torch.manual_seed(0)
    a, b = torch.randn(T, K), torch.randn(E, K, N)
    offs = torch.tensor([2, 5, 12], dtype=torch.int32)  # 4 padding rows after the last expert
    _, rows = grouped_rows(tmp_path, lambda: torch._grouped_mm(a, b, offs=offs))
    assert rows["flops"].tolist() == [2 * 12 * K * N] == [1536]
    assert list(rows["group_sizes"][0]) == [2, 3, 7] and not rows["flops_bound"][0]


def test_backward_counts_both_gradients_per_group(tmp_path):
    torch.manual_seed(0)
    a = torch.randn(T, K, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(E, K, N, dtype=torch.bfloat16, requires_grad=True)
    offs = torch.tensor([4, 10, 16], dtype=torch.int32)
    grad = torch.ones(T, N, dtype=torch.bfloat16)
    _, rows = grouped_rows(tmp_path, lambda: torch._grouped_mm(a, b, offs=offs).backward(grad))
    # forward [16, 8] @ [3, 8, 8]; backward dA = dY [16, 8] @ B^T [3, 8, 8] (2D x 3D) and
    # dB = A^T [8, 16] @ dY [16, 8] grouped along the 16 tokens (2D x 2D -> [3, 8, 8]):
    # each 2 * 16 * 8 * 8 = 2048
    assert rows["flops"].tolist() == [2048, 2048, 2048]
    assert [list(g) for g in rows["group_sizes"]] == [[4, 6, 6]] * 3
    assert not rows["flops_bound"].any()
    assert sorted(list(r[0]) for r in rows["output_shapes"]) == [[E, K, N], [T, K], [T, N]]


def test_3d_operands():
    torch.manual_seed(0)
    rule = flop_rule(aten._grouped_mm.default)
    a, b = torch.randn(E, 8, 16), torch.randn(E, 16, 8)
    # [3, 8, 16] @ [3, 16, 8], no offsets: a batched matmul, 2 * 3 * 8 * 16 * 8 = 6144
    assert rule.count((a, b), {}, None) == FlopCount(6144)
    # [3, 8, 16] @ [16, 16] with the 16 columns of b grouped 2, 3, 7 (4 not computed): 2 * 8 * 16 * 12 = 3072
    offs = torch.tensor([2, 5, 12], dtype=torch.int32)
    assert rule.count((a, torch.randn(16, 16)), {"offs": offs}, None) == FlopCount(3072, False, (2, 3, 7))
    out = torch._grouped_mm(a.to(torch.bfloat16), torch.randn(16, 16, dtype=torch.bfloat16), offs=offs)
    assert tuple(out.shape) == (8, 16)  # torch agrees on the shapes the formula reads


def test_meta_tensors_count_the_bound_and_flag_it(tmp_path):
    a = torch.empty(T, K, dtype=torch.bfloat16, device="meta")
    b = torch.empty(E, K, N, dtype=torch.bfloat16, device="meta")
    offs = torch.empty(E, dtype=torch.int32, device="meta")
    _, rows = grouped_rows(tmp_path, lambda: torch._grouped_mm(a, b, offs=offs))
    # every token met once: 2 * 16 * 8 * 8 = 2048, exact only if the offsets end at 16: a bound
    assert rows["flops"].tolist() == [2048] and rows["flops_bound"].tolist() == [True]
    assert rows["group_sizes"][0] is None


def test_fake_tensors_count_the_bound():
    rule = flop_rule(aten._grouped_mm.default)
    with FakeTensorMode():
        a = torch.empty(T, K, dtype=torch.bfloat16)
        b = torch.empty(E, K, N, dtype=torch.bfloat16)
        offs = torch.empty(E, dtype=torch.int32)
        assert concrete_ints(offs) is None
        assert rule.count((a, b, offs), {}, None) == FlopCount(2048, True, None)


def test_scaled_grouped_mm_reads_its_offsets_after_the_scales():
    rule = flop_rule(aten._scaled_grouped_mm.default)
    assert rule.detailed and rule.kind == "matmul"
    a, b = torch.empty(T, K), torch.empty(E, K, N)  # the rule reads shapes and offsets only
    scale = torch.ones(1)
    offs = torch.tensor([8, 8, 16], dtype=torch.int32)  # the second expert gets no token
    # 2 * 16 * 8 * 8 = 2048; the scaling is not counted
    assert rule.count((a, b, scale, scale, offs), {}, None) == FlopCount(2048, False, (8, 0, 8))
    meta = offs.to("meta")
    assert rule.count((a, b, scale, scale), {"offs": meta}, None) == FlopCount(2048, True, None)


def test_weight_gradient_case_without_offsets_is_a_bound():
    # [8, 16] @ [16, 8] -> [3, 8, 8]: the 16-long contraction grouped; unknown offsets: 2 * 8 * 8 * 16
    assert grouped_mm_count((8, 16), (16, 8), None) == FlopCount(2048, True, None)
    assert grouped_mm_count((8, 16), (16, 8), (16, 16, 16)) == FlopCount(2048, False, (16, 0, 0))


def test_report_and_json_name_the_bound_flops(tmp_path, capsys):
    import json

    from reports.output.cli import main

    a = torch.empty(T, K, dtype=torch.bfloat16, device="meta")
    b = torch.empty(E, K, N, dtype=torch.bfloat16, device="meta")
    offs = torch.empty(E, dtype=torch.int32, device="meta")
    path = tmp_path / "t"
    with Tracer(path):
        torch._grouped_mm(a, b, offs=offs)  # a bound: 2048
        a @ torch.empty(K, N, dtype=torch.bfloat16, device="meta")  # a count: 2 * 16 * 8 * 8 = 2048
    assert main(["report", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["bound_flops"] == {"flops": 2048, "rows": 1}
    assert summary["flops"]["total"] == 4096
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "- flops_bound: 1 ops count an upper bound of their FLOPs (2.05 k per step)" in unwrapped(out)
