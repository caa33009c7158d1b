"""The rows of in-place view ops: no bytes written, none allocated.

An in-place view op (`t_`, `unsqueeze_`, `squeeze_`, `as_strided_`, `detach_`: torch tags
them `inplace_view`) changes only the tensor's sizes and strides: it writes no data and
allocates nothing, so its row is a view (is_view, not inplace) with bytes_written 0.
"""

import pytest
import torch

from reports.loading.load import load
from tracer import Tracer


@pytest.mark.parametrize("collector", ["compiled", "python"])
def test_in_place_view_ops_write_nothing(tmp_path, monkeypatch, collector):
    monkeypatch.setenv("OPTRACE_COLLECTOR", collector)
    torch.manual_seed(0)
    a = torch.randn(16, 32)
    with Tracer(tmp_path / "t.parquet"):
        b = a.clone()
        b.unsqueeze_(0)
        b.squeeze_(0)
        b.t_()
        b.as_strided_((32, 16), (1, 32))
        b.relu_()  # a real in-place write, for contrast
    df = load(tmp_path / "t.parquet").set_index("op")
    assert df.loc["aten.clone.default", "bytes_allocated"] == 2048  # 16 * 32 * 4 = 2048
    for op in ["aten.unsqueeze_.default", "aten.squeeze_.dim", "aten.t_.default", "aten.as_strided_.default"]:
        row = df.loc[op]
        assert (row["bytes_allocated"], row["bytes_written"], bool(row["is_view"]), bool(row["inplace"])) == (
            0,
            0,
            True,
            False,
        ), op
    relu = df.loc["aten.relu_.default"]
    assert (relu["bytes_allocated"], relu["bytes_written"], bool(relu["inplace"])) == (
        0,
        2048,
        True,
    )  # 16 * 32 * 4 = 2048 written in place
