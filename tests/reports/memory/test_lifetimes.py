"""reports.lifetimes: storage sizes come from output_storage_bytes (v2), or from live_bytes rises (v1)."""

import numpy as np
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


def _joining(path):
    """Two steps, each adding two [4, 4] views of [4, 8] float32 storages made before the trace: both storages join
    live_bytes at the step's add, and the second add frees the first step's."""
    batches = [tuple(torch.ones(4, 8)[:, :4] for _ in range(2)) for _ in range(2)]
    with Tracer(path, run_name="j"):
        for _ in range(2):
            x, y = batches.pop(0)
            torch.add(x, y)  # a [4, 4] float32 output: 64 bytes
            del x, y
    return reports.load(path)


def test_storages_joining_at_one_row_take_its_rise_with_what_it_frees(tmp_path):
    df = _joining(tmp_path / "t")
    assert df["freed_storage_ids"].map(list).tolist() == [[], [2, 0, 1]]
    # live_bytes counts whole storages: 2 x 128 + 64 = 320 after each add
    assert df["live_bytes"].tolist() == [320, 320]
    v1 = df.assign(output_storage_bytes=None)  # sizes from extents and rises
    table = reports.storages(v1).set_index("storage_id")
    # each view spans 1 + 3·8 + 3·1 = 28 elements: 112 bytes. Row 1's rise: 320 - 320 - 64 made + (64 + 112 + 112)
    # freed (storages 0 and 1 at the sizes row 0 gave them) = 224 = 112 + 112: both joined there
    assert table["nbytes"].to_dict() == {-1: 32, 0: 112, 1: 112, 2: 64, 3: 112, 4: 112, 5: 64}  # -1: 320 - 288
    assert table["alloc_seq"].to_dict() == {-1: -1, 0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}


def test_the_pieces_live_after_a_row_are_those_of_every_piece_live_then(tmp_path):
    from reports.memory.frame_rows import runs_in_order
    from reports.memory.lifetimes import Storages

    df = _joining(tmp_path / "t")
    for frame in (df, df.assign(output_storage_bytes=None)):
        ((name, meta, rows),) = runs_in_order(frame)
        run = Storages(name, meta, rows)
        nbytes, alloc, free, cat = run.live_pieces()
        for row in range(run.n):
            live = (alloc <= row) & ((free < 0) | (free > row))
            picked = run.live_pieces(row)
            order = np.lexsort((picked[0], picked[3]))
            every = np.lexsort((nbytes[live], cat[live]))
            assert picked[0][order].tolist() == nbytes[live][every].tolist()
            assert picked[3][order].tolist() == cat[live][every].tolist()
            assert int(picked[0].sum()) == int(rows.live_bytes[row])  # 320: the categories add up to live_bytes


def test_new_storages_out_of_id_order_split_their_rows_bytes(tmp_path):
    x = torch.ones(4, 8)  # 128 bytes made before the trace
    with Tracer(tmp_path / "t", run_name="o"):
        torch.ones(3)  # row 0: a 12-byte storage
        torch.max(x, dim=0)  # row 1: values [8] float32 (32 bytes) and indices [8] int64 (64 bytes), frees row 0's
    df = reports.load(tmp_path / "t")
    assert df["output_storage_ids"].map(list).tolist() == [[0], [2, 3]]
    swap = {0: 3, 3: 0}  # row 0's storage takes the highest id: the new storages' rows do not ascend with their ids
    for column in ("input_storage_ids", "output_storage_ids", "freed_storage_ids"):
        df[column] = df[column].map(lambda ids: np.array([swap.get(int(i), int(i)) for i in ids], dtype=np.int64))
    v1 = df.assign(output_storage_bytes=None, bytes_allocated=[12, 100])
    # row 1's 100 bytes: 32 + 64 by numel x size, the 4 they miss to its first new storage (id 2): 36;
    # x joins at row 1: live_bytes rises 224 - 12 = 212, less the 100 made, plus the 12 freed (id 3): 124
    assert _sizes(v1) == {0: 64, 1: 124, 2: 36, 3: 12}
    assert _sizes(df) == {0: 64, 1: 128, 2: 32, 3: 12}  # output_storage_bytes read where the trace has it
