"""reports.lifetimes: storage sizes come from output_storage_bytes (v2), or from live_bytes rises (v1)."""

import torch

import reports
from tracer import Tracer


def _trace(path):
    base = torch.zeros(4, 4)  # 16 float32: a 64-byte storage made before the trace
    x = base[:, :2]  # a view of 8 of them, spanning 1 + 3·4 + 1·1 = 14 elements (56 bytes)
    with Tracer(path, run_name="m"):
        x.add_(1.0)  # the first op: no live_bytes rise before it to read the storage's size from
        torch.ones(3)  # 12 bytes
    return reports.load(path)


def _sizes(df):
    return reports.storages(df).set_index("storage_id")["nbytes"].to_dict()


def test_the_size_of_a_storage_is_read_from_output_storage_bytes(tmp_path):
    df = _trace(tmp_path / "t")
    assert df["output_storage_bytes"].tolist()[0].tolist() == [64]
    assert _sizes(df) == {0: 64, 1: 12}  # the whole storage, no unnamed bytes (storage -1)
    assert reports.by_category(df, at="end").set_index("category")["bytes"]["inputs"] == 64


def test_a_v1_trace_falls_back_to_the_extent_and_live_bytes(tmp_path):
    df = _trace(tmp_path / "t")
    for v1 in (df.assign(output_storage_bytes=None), df.drop(columns=["output_storage_bytes"])):
        # the view's extent, 14 x 4 = 56 bytes, and 64 - 56 = 8 live bytes no row names (storage -1)
        assert _sizes(v1) == {-1: 8, 0: 56, 1: 12}
        timeline = reports.timeline(v1)
        categories = [c for c in timeline.columns if c.endswith("_bytes") and c != "live_bytes"]
        assert (timeline[categories].sum(axis=1) == timeline["live_bytes"]).all()  # 64, then 76
        assert timeline["live_bytes"].tolist() == [64, 76]
