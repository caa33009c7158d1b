"""The tracer's hot-path shortcuts give the bytes and times the plain code gives.

`extend` (tracer.store.writer, and the compiled collector's in tracer/native/_collector.cpp) appends
int64 values in one packed call; `marker_file` splices the facts into a marker built once
(tracer/schema.py); the wall clock is read inline in the dispatch hook (tracer.recording.timing
WallTimer.inline). Traces stay identical: tests/tracer/native/test_collector.py compares them column by column.
"""

import json
import struct
from array import array

import pytest

from tracer import schema
from tracer.native import loader as native
from tracer.recording.timing import OffTimer, WallTimer
from tracer.store import writer
from tracer.store.directory import MARKER_BYTES

# 0, negatives, the int64 ends and a row's width of values
VALUES = [(0,), (-1, 1, 2**63 - 1, -(2**63)), tuple(range(-13, 13))]


def _extenders():
    found = [writer.extend]
    module, _ = native.choose()
    if module is not None:
        found.append(module.extend)
    return found


@pytest.mark.parametrize("values", VALUES)
def test_extend_appends_what_array_extend_appends(values):
    for extend in _extenders():
        packed, plain = array("q", [7]), array("q", [7])
        extend(packed, *values)
        plain.extend(values)
        assert packed == plain  # e.g. [7, 0] for (0,)


def test_extend_refuses_a_value_past_int64():
    for extend in _extenders():
        buffer = array("q")
        with pytest.raises((OverflowError, struct.error)):  # C++, Python
            extend(buffer, 2**63)  # one past the largest int64
        assert len(buffer) == 0


@pytest.mark.parametrize("facts", [{"format": "optrace", "trace_id": "ab" * 16}, {"rows": 12, "complete": True}])
def test_marker_bytes_are_pyarrows(facts):
    text = json.dumps(facts)
    padded = text + " " * (MARKER_BYTES - len(text))
    for given in (padded, text):  # the padded marker of a trace, and an unpadded length
        assert schema.marker_file(given) == schema._marker_file(given.encode())


def test_only_a_plain_wall_clock_is_read_inline():
    assert WallTimer().inline and not WallTimer().binds
    assert not WallTimer(sync=lambda: None, name="sync").inline  # synchronises around the op
    assert not OffTimer().inline and OffTimer().binds  # no times: bind marks busy_ns null


def test_op_facts_kept_across_traces_follow_a_replaced_formula(tmp_path):
    """The facts of an op are kept from trace to trace (tracer.recording.dispatch `_op_info`), and made
    again when a FLOP formula is replaced in between: each trace counts with the formula it began with."""
    import pandas as pd
    import torch

    from tracer import Tracer
    from tracer.flops.formulas import _registry
    from tracer.recording.dispatch import _described

    a = torch.ones(3)
    with Tracer(tmp_path / "first"):
        torch.dot(a, a)
    assert id(torch.ops.aten.dot.default) in _described  # kept for the next trace
    op = torch.ops.aten.dot
    saved = _registry[op]
    _registry[op] = (lambda *args, **kwargs: 7, "matmul")
    try:
        with Tracer(tmp_path / "replaced"):
            torch.dot(a, a)
    finally:
        _registry[op] = saved
    with Tracer(tmp_path / "restored"):
        torch.dot(a, a)
    flops = [int(pd.read_parquet(tmp_path / name)["flops"].iloc[0]) for name in ("first", "replaced", "restored")]
    assert flops == [6, 7, 6]  # 2 * 3 = 6 for a dot of two 3-vectors; the replacing formula says 7
