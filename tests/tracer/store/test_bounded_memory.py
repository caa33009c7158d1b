"""What the tracer holds in memory is bounded in bytes, whatever the rows, on both collectors.

A part is written when its rows reach `flush_rows` or the integers of its buffers reach flush_rows * ROW_VALUES
(tracer.store.writer.RowBuffer.values), and the small parts kept for merging take at most SmallParts.MAX_BYTES
(tracer.store.writer.SmallParts). Growth is measured with tracemalloc inside the traced block, after a warm-up.
"""

import gc
import tracemalloc

import pyarrow.parquet as pq
import pytest
import torch

from tracer import Tracer, read_metadata
from tracer.native import loader as native
from tracer.recording import attribution, forward_hooks
from tracer.schema import part_paths
from tracer.store.writer import ROW_VALUES, ROW_WIDTH, SmallParts

TENSOR_INTS = 4 + 1 + 1  # per 1-d tensor in a row: TENSOR_WIDTH (ndim, dtype, storage id, bytes), its size, its stride


@pytest.fixture(params=["python", "compiled"])
def collector(request, monkeypatch):
    """Each collector path in turn (OPTRACE_COLLECTOR); the compiled one must have been built."""
    monkeypatch.setenv(native.ENV, request.param)
    if request.param == "compiled" and native.choose()[0] is None:
        pytest.fail("the compiled collector is not available: run `python -m tracer.native.build_ext`")
    return request.param


def _growth(loop, warmup, passes, by_files=()):
    """Bytes tracemalloc sees held after `passes` calls of `loop`, less before them (after `warmup` calls); with
    `by_files`, also the bytes of those allocated by those files' lines."""
    for _ in range(warmup):
        loop()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(passes):
            loop()
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
        if not by_files:
            return growth
        held = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f) for f in by_files])
        return growth, sum(stat.size for stat in held.statistics("filename"))
    finally:
        tracemalloc.stop()


def test_a_forward_only_loop_under_grad_holds_under_4_mb_over_3000_passes(tmp_path, collector):
    # evaluation that forgot no_grad: no backward, no optimizer step, nothing ever ends a step
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with Tracer(tmp_path / "t", model=model, flush_rows=500) as tr:
        # the module boundaries' bookkeeping: Attribution's marks and its forward hooks (tracer.recording.forward_hooks)
        hooks = (attribution.__file__, forward_hooks.__file__)
        growth, marks = _growth(lambda: model(x), warmup=50, passes=3000, by_files=hooks)
    # before: +9.3 MB (compiled), +7.7 MB (python): the small-parts merger kept every 500-row part (65,536 rows);
    # now 0.4 MB on each
    assert growth < 4_000_000, growth
    # module boundaries (tracer.recording.attribution.Attribution._mark), which nothing clears without a backward: 3 a pass
    # (after each Linear and the ReLU, whose ops made a node), 16 bytes each (a sequence number in an array, a
    # pointer to the module's name): 3 * 3,000 * 16 = 144,000 bytes and the room the array and list reserve.
    # Before: 403 KB (an int object each); now 151 KB
    assert marks < 200_000, marks
    # 6 rows a pass (t, addmm, relu, detach (relu's, saved for backward), t, addmm): 3,050 * 6 = 18,300 rows
    assert read_metadata(tr.path)["rows"] == 18_300


def test_wide_rows_hold_under_flush_rows_rows_worth_of_bytes(tmp_path, collector):
    xs = [torch.randn(2) for _ in range(1000)]
    with Tracer(tmp_path / "t", flush_rows=64) as tr:
        growth = _growth(lambda: torch.cat(xs), warmup=4, passes=100)
    # a row: 26 integers, 1,000 1-d inputs and a 1-d output of 6 each: 26 + 1,001 * 6 = 6,032 integers of 8 bytes
    row_bytes = (ROW_WIDTH + 1001 * TENSOR_INTS) * 8  # (27 + 1,001 * 6) * 8 = 48,264
    # before: +6.3 MB (compiled), +5.2 MB (python): 64 rows buffered, then every part kept by the merger; now 0.15
    # and 0.03 MB
    assert growth < 64 * row_bytes, growth  # 3,088,896
    # 2 rows (6,033 + 6,034 with the id of the cat output the second freed) pass 64 * ROW_VALUES = 8,192: parts of
    # 2 rows (104 rows), then the closing part
    assert [pq.read_metadata(p).num_rows for p in part_paths(tr.path)] == [2] * 52 + [0]


def test_a_part_is_written_when_its_integers_reach_flush_rows_times_row_values(tmp_path, collector):
    """Both collectors flush at the same row: the rows' integers, not only their number, decide."""
    parts = [torch.randn(3) for _ in range(40)]
    with Tracer(tmp_path / "t", flush_rows=4) as tr:
        for _ in range(9):
            torch.cat(parts)
    # a cat row: 27 + 40 inputs * 6 + 1 output * 6 = 273 integers (and the id of the cat output it freed, from the
    # second on); 4 * ROW_VALUES = 512: the second row reaches it (273 + 274 = 547), so a part holds 2 rows, not 4
    assert ROW_VALUES == 128 and ROW_WIDTH + 41 * TENSOR_INTS == 273
    assert [pq.read_metadata(p).num_rows for p in part_paths(tr.path)] == [2, 2, 2, 2, 1]


def test_the_merger_keeps_at_most_max_bytes_of_small_parts(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with Tracer(tmp_path / "t", model=model, flush_rows=32) as tr:
        growth = _growth(lambda: model(x), warmup=10, passes=1000)
        small = tr._writer.small
        kept, files = small.kept, list(small.files)
    # before: +12.9 MB, every part's buffers kept (up to 65,536 rows), each array with room for 1,024 integers
    assert growth < 3_000_000, growth  # now 2.0 MB: the merger's 2 MiB at most, and the part being filled
    # 1,010 passes * 6 rows = 6,060 rows in parts of 32 rows: each a small part, merged 64 at a time (2,048 rows)
    assert 0 < kept == sum(f.nbytes for f in files) <= SmallParts.MAX_BYTES  # 2 MiB = 2,097,152
    assert [f.last - f.first + 1 for f in files if f.level == 1] == [SmallParts.FANOUT]
