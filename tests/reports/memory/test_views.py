"""reports.views on the lecture's storage facts: views are free, copies cost numel x element size.

x = [[1, 2, 3], [4, 5, 6]] in float32: 6 elements, 24 bytes. Each line runs as its own module,
so the trace's module column names the line.
"""

import json
import re

import pandas as pd
import pytest
import torch
from torch import nn

from reports.errors import ReportError
from reports.loading.load import load
from reports.memory.views import copies, is_copy, views
from reports.output.cli import main
from tracer import Tracer


class Line(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _copy_into(x):
    y = torch.empty(2, 3)  # aten.empty: 24 new bytes, then copy_ writes 24 bytes into them
    return y.copy_(x)


LINES = {
    "row": lambda x: x[0],  # aten.select
    "transpose": lambda x: x.t(),  # aten.t
    "view": lambda x: x.view(3, 2),  # aten.view
    "contiguous": lambda x: x.t().contiguous(),  # aten.t + aten.clone: 2 * 3 * 4 = 24 bytes
    "reshape": lambda x: x.t().reshape(6),  # aten.t + aten.clone (24 bytes) + aten._unsafe_view
    "to_double": lambda x: x.to(torch.float64),  # aten._to_copy: 6 * 8 = 48 bytes, a cast
    "copy_into": _copy_into,
    "cat": lambda x: torch.cat([x, x]),  # aten.cat: 12 * 4 = 48 bytes
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("views") / "lines.parquet"
    lines = nn.ModuleDict({name: Line(fn) for name, fn in LINES.items()})
    x = torch.tensor([[1.0, 2, 3], [4, 5, 6]])
    keep = []  # keep every output alive
    with Tracer(path, model=lines, run_name="lines"):
        for line in lines.values():
            keep.append(line(x))
    return load(path)


def test_views_are_free(trace):
    table = views(trace)
    assert list(table.columns) == ["run", "kind", "op", "ops", "bytes_allocated", "bytes_written", "allocated_pct"]
    v = table[table["kind"] == "view"].set_index("op")
    # x[0], x.t() (in transpose, contiguous, reshape), x.view(3, 2), reshape's _unsafe_view
    assert v["ops"].to_dict() == {
        "aten.t.default": 3,
        "aten.select.int": 1,
        "aten.view.default": 1,
        "aten._unsafe_view.default": 1,
    }
    assert (v["bytes_allocated"] == 0).all() and (v["bytes_written"] == 0).all()


def test_copies_cost_numel_times_element_size(trace):
    c = views(trace)
    c = c[c["kind"] == "copy"].set_index("op")
    assert c.loc["aten.clone.default", "ops"] == 2  # .contiguous() and .reshape() of the transpose
    assert c.loc["aten.clone.default", "bytes_allocated"] == 2 * (2 * 3 * 4)  # 48
    assert c.loc["aten._to_copy.default", "bytes_allocated"] == 2 * 3 * 8  # float64: 48
    assert c.loc["aten.cat.default", "bytes_allocated"] == 4 * 3 * 4  # 48
    # copy_ writes into the tensor aten.empty made: it moves 24 bytes and allocates none
    assert (c.loc["aten.copy_.default", "bytes_allocated"], c.loc["aten.copy_.default", "bytes_written"]) == (0, 24)
    everything = trace["bytes_allocated"].sum()  # the copies + aten.empty's 24 bytes
    assert everything == 48 + 48 + 48 + 24
    assert c.loc["aten.clone.default", "allocated_pct"] == pytest.approx(100 * 48 / everything)


def test_copies_per_module(trace):
    table = copies(trace)
    assert list(table.columns) == ["run", "module", "phase", "op", "ops", "casts", "bytes_allocated", "bytes_written"]
    rows = {(r.module, r.op): (r.ops, r.casts, r.bytes_allocated, r.bytes_written) for r in table.itertuples()}
    assert rows == {
        ("contiguous", "aten.clone.default"): (1, 0, 24, 24),
        ("reshape", "aten.clone.default"): (1, 0, 24, 24),
        ("to_double", "aten._to_copy.default"): (1, 1, 48, 48),
        ("copy_into", "aten.copy_.default"): (1, 0, 0, 24),
        ("cat", "aten.cat.default"): (1, 0, 48, 48),
    }
    assert list(table["bytes_allocated"]) == sorted(table["bytes_allocated"], reverse=True)


@pytest.mark.parametrize(
    "op, expected",
    [
        ("aten.clone.default", True),
        ("aten._to_copy.default", True),
        ("aten.copy_.default", True),
        ("aten.cat.default", True),
        ("aten.stack.default", True),
        ("aten.view_copy.default", True),
        ("aten.lift_fresh_copy.default", True),
        ("aten._foreach_copy_.default", True),
        ("aten.view.default", False),
        ("aten._unsafe_view.default", False),
        ("aten.add.Tensor", False),
        ("aten.mm.default", False),
        ("aten.empty.memory_format", False),
    ],
)
def test_is_copy(op, expected):
    assert is_copy(op) is expected


def test_empty_results_keep_their_dtypes(trace):
    for fn in (views, copies):
        out, full = fn(trace.iloc[0:0]), fn(trace)
        assert len(out) == 0 and out.dtypes.to_dict() == full.dtypes.to_dict()


def test_errors(trace):
    with pytest.raises(ReportError, match=r"views: the trace lacks column\(s\) \['is_view'\]"):
        views(trace.drop(columns="is_view"))
    with pytest.raises(ReportError, match=r"copies: the trace lacks column\(s\) \['module'\]"):
        copies(trace.drop(columns="module"))
    with pytest.raises(ReportError, match=r"expected a DataFrame returned by reports.load"):
        views(pd.DataFrame(trace))


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_views_and_copies_say_they_are_totals(loops, capsys, engine):
    # the 2-step loop: per step 9 t + 6 detach + 2 view + 1 expand = 18 views; the section sums all steps,
    # 18 * 2 = 36, so its title and --json say "totals over all 2 step(s)" as the top modules' do
    main(["report", str(loops[0]), "--engine", engine])
    out = capsys.readouterr().out
    assert "\nViews (no new memory) vs copies, totals over all 2 step(s)\n" in out
    assert re.search(r"^view\s+36\s+0 B$", out, re.M)
    main(["report", str(loops[0]), "--json", "--engine", engine])
    views = json.loads(capsys.readouterr().out)["views"]
    assert views["unit"] == "totals over all traced steps"
    assert views["kinds"] == [{"kind": "view", "ops": 36, "bytes_allocated": 0}]
