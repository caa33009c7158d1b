"""reports.peaks: every peak is per device as torch sees it (a GCD, a GPU of a pair, a partition)."""

import pytest

from reports.flops.peaks import FULL_UNITS, PEAKS, match_device, peak_flops

MI250X = {"type": "cuda", "name": "AMD Instinct MI250X/MI250"}


def test_mi250x_is_per_gcd():
    # the OAM module's 383 bf16 / 95.7 fp32-matrix TFLOP/s are two GCDs, each a torch device: halved
    assert peak_flops(MI250X, "bfloat16")[0] == 191.5e12
    assert peak_flops(MI250X, "float16")[0] == 191.5e12
    assert peak_flops(MI250X, "float32")[0] == 47.85e12
    assert "per GCD" in peak_flops(MI250X, "bfloat16")[1]


def test_boards_of_several_dies_or_gpus_are_per_device():
    assert PEAKS[("H100 NVL", "bfloat16")][0] == 835.5e12  # one GPU of the bridged pair: 1,671 sparse / 2
    assert PEAKS[("B200", "bfloat16")][0] == 2250e12  # two dies, one device: HGX B200's 18 PFLOPS dense / 8
    assert PEAKS[("MI300X", "bfloat16")][0] == 1307.4e12  # eight XCDs, one device in SPX mode


@pytest.mark.parametrize(
    "name, units, dtype, expected",
    [
        ("AMD Instinct MI300X", 38, "bfloat16", 1307.4e12 * 38 / 304),  # CPX mode: 8 devices of 38 CUs
        ("AMD Instinct MI300X", 304, "bfloat16", 1307.4e12),  # SPX: the whole part
        ("NVIDIA H100 80GB HBM3", 16, "bfloat16", 989.4e12 * 16 / 132),  # a MIG 1g slice
        ("NVIDIA A100-SXM4-80GB", 108, "float32", 19.5e12),
        ("NVIDIA L4", 10, "float32", 30.3e12),  # no unit count in FULL_UNITS: the datasheet figure
    ],
)
def test_a_partition_gets_its_share(name, units, dtype, expected):
    value, source = peak_flops({"type": "cuda", "name": name, "multi_processor_count": units}, dtype)
    assert value == pytest.approx(expected, rel=1e-12)
    key = match_device(name)
    assert ("compute units: scaled" in source) == (units < FULL_UNITS.get(key, units))


def test_full_units_name_table_devices():
    assert set(FULL_UNITS) <= {k for k, _ in PEAKS}
