"""reports.plan.efficiency: matmul efficiency by (m, n, k) and generation from the published sweep, attention by
kernel and generation, the kernel an attention op stands for, and a matmul's (m, n, k) from its output and FLOPs."""

import numpy as np
import pytest

from reports.plan import efficiency as e


def test_a_measured_shape_reaches_its_own_figure_and_larger_ones_saturate():
    # XLA's sm_90 table: 4096^3 at 783.33 TFLOP/s, of the H100 SXM's 989.4: 0.79172
    assert e.matmul(4096, 4096, 4096, "hopper") == pytest.approx(783.33 / 989.4, rel=1e-12)
    # 256 x 256 x 4096 at 84.31: 0.08521; 256 x 4096 x 4096 at 412.03: 0.41644 (rising with the smallest side)
    assert e.matmul(256, 256, 4096, "hopper") == pytest.approx(84.31 / 989.4, rel=1e-12)
    assert e.matmul(256, 4096, 4096, "hopper") == pytest.approx(412.03 / 989.4, rel=1e-12)
    # past the sweep each side is clamped to 4,096: a Llama-3-8B MLP GEMM reaches what 4096^3 did
    assert e.matmul(16384, 14336, 4096, "hopper") == pytest.approx(783.33 / 989.4, rel=1e-12)
    # an A100: the same curve scaled so 4096^3 reaches mamf-finder's best, 267.9 of 312
    assert e.matmul(4096, 4096, 4096, "ampere") == pytest.approx(267.9 / 312, rel=1e-12)
    ampere = e.matmul(np.array([256, 1024]), 4096, 4096, "ampere")
    assert ampere[0] == pytest.approx(412.03 / 783.33 * 267.9 / 312, rel=1e-12)


def test_between_measured_shapes_the_share_lies_between_its_neighbours():
    # 3000^3 lies between 2048^3 (631.98) and 4096^3 (783.33)
    assert 631.98 / 989.4 < e.matmul(3000, 3000, 3000, "hopper") < 783.33 / 989.4


def test_attention_by_kernel_and_generation():
    assert e.attention("flash", "hopper")[0] == 0.35 and "arXiv:2407.08608" in e.attention("flash", "hopper")[1]
    assert e.attention("flash", "ampere")[0] == 0.60 and e.attention("fa3", "hopper")[0] == 0.75
    assert e.attention("fa3", "ampere") is None and e.generation("V100 SXM2") is None
    assert e.generation("H200") == "hopper" and e.generation("A100") == "ampere"
    assert e.kernel_of("aten._scaled_dot_product_flash_attention_for_cpu.default") == "flash"
    assert e.kernel_of("aten._scaled_dot_product_efficient_attention.default") == "efficient"
    assert e.kernel_of("aten._scaled_dot_product_cudnn_attention_backward.default") == "cudnn"
    assert e.kernel_of("aten.mm.default") is None


def test_matmul_dims_from_the_output_and_flops():
    # [8, 1024, 4096] out of 2 x 8192 x 4096 x 512 FLOPs: m 8 x 1024 = 8192, n 4096, k 512
    assert e.matmul_dims([[8, 1024, 4096]], 2 * 8192 * 4096 * 512) == (8192, 4096, 512)
    assert e.matmul_dims([[4096]], 1e9) is None and e.matmul_dims(None, 1e9) is None
