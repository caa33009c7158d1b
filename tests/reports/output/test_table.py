"""reports.output.table.render prints what DataFrame.to_string(index=False, ...) prints, byte for byte: on the tables
`optrace report` and `optrace compare` print (with their formatters, na_rep and headers) and on the values where
pandas' rules turn (NaN and None, floats past 1e6 or under 1e-6, bools, an empty table)."""

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from reports.output.table import render
from reports.output.text import column_formatters, human_bytes
from reports.sql import tables
from reports.sql.engine import Trace
from reports.tables import by_module


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    import torch
    from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step

    from tracer import Tracer

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, 2)
    path = tmp_path_factory.mktemp("table") / "gpt"
    with Tracer(path, model=model, tokens=16):
        for _ in range(2):
            train_step(model, opt, idx, targets)
    return Trace(path)


def _same(frame, formatters=None, na_rep="NaN", header=None):
    want = frame.to_string(index=False, formatters=formatters, na_rep=na_rep, header=True if header is None else header)
    got = render(pa.Table.from_pandas(frame, preserve_index=False), formatters, na_rep, header)
    assert got == want


def test_the_report_tables_print_as_pandas_prints_them(gpt):
    top = tables.top_ops(gpt, 8)
    mods = by_module(gpt).head(8)[["module", "subtree_flops", "subtree_flops_pct"]]
    views = tables.views(gpt)
    kinds = views.groupby("kind", sort=False)[["ops", "bytes_allocated"]].sum().reset_index()
    uncounted = tables.uncounted(gpt)
    shown = uncounted.assign(time_pct=uncounted["time_pct"].map(lambda v: f"{v:.1f}%"))[["op", "ops", "time_pct"]]
    for frame in (top, mods, kinds, shown, tables.by_op(gpt), tables.by_step(gpt), tables.by_dtype(gpt), views):
        assert len(frame) or frame is shown  # every op of the GPT has a formula: that table is empty
        _same(frame, column_formatters(frame))
        _same(frame)  # pandas' own number formats: ints, floats of 6 decimals trimmed, e-notation


def test_compare_and_roofline_shapes():
    """compare's: keys repeated per run, ratios NaN (na_rep N/A) and inf, short headers; the roofline's: a float
    column without a formatter (intensity) and a per-column formatter."""
    frame = pd.DataFrame({"phase": ["total", "total", "forward", "forward"], "run": ["a", "b", "a", "b"],
                          "flops_per_step": [1.5e9, 3e9, np.nan, 2e9], "flops_ratio": [1.0, 2.0, np.nan, math.inf],
                          "peak_live_bytes": [2.0**20, 3.5 * 2**20, np.nan, 1.0]})  # fmt: skip
    header = ["phase", "run", "flops/step", "flops_x", "peak_live"]
    _same(frame, column_formatters(frame), "N/A", header)
    roof = pd.DataFrame(
        {"op": ["mm.default", "add.Tensor"], "intensity": [12.34, 0.5], "bytes_per_step": [1e6, 2048.0]}
    )
    _same(roof, {**column_formatters(roof), "bytes_per_step": human_bytes}, "N/A")


@pytest.mark.parametrize("values", [
    [1.0, 2.5, 3.25], [0.1, 0.2], [1e-7, 1.0], [1234567.891, 2.0], [1e7, 1.0], [math.nan, 1.5], [math.inf, 1.0],
    [-1.5, 2.0], [0.0, 0.0], [100.0, 2.0], [123456.0, 0.5],
])  # fmt: skip
def test_floats_without_a_formatter(values):
    _same(pd.DataFrame({"x": values, "n": np.arange(len(values)), "name": ["a\tb"] + ["c"] * (len(values) - 1)}))


def test_none_bools_and_an_empty_table():
    _same(pd.DataFrame({"parent": [None, "GPT"], "flag": [True, False], "s": ["x", None]}), na_rep="")
    _same(pd.DataFrame({"parent": [None, "GPT"]}), {"parent": str})
    _same(pd.DataFrame({"kind": pd.Series(dtype=object), "ops": pd.Series(dtype="int64")}))
