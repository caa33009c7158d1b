"""Review of what `optrace compare` prints: keys that would collide with the whole-run "total" row.

A model whose child module is named `total` (an attribute `self.total = nn.Linear(8, 4)`) gives the
compare-by-module key "total", the name of each run's whole-run row.
"""

import json

import pytest
import torch
from torch import nn

from reports.compare import compare
from reports.loading.load import load
from reports.output.cli import main
from tracer import Tracer


class _Totals(nn.Module):
    def __init__(self):
        super().__init__()
        self.total = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.total(x)


def _trace(path, batch):
    torch.manual_seed(0)
    model = _Totals()
    with Tracer(path, model=model, tokens=batch):
        model(torch.randn(batch, 8)).sum().backward()
    return path


@pytest.fixture(scope="module")
def totals(tmp_path_factory):
    root = tmp_path_factory.mktemp("review")
    return [_trace(root / "b2.parquet", 2), _trace(root / "b4.parquet", 4)]


def test_a_module_named_total_is_its_own_key(totals):
    table = compare(load(totals), by="module")
    whole = table[table["module"] == "total"]
    module = table[table["module"] == "total (module)"]
    assert list(whole["run"]) == ["b2", "b4"] and list(module["run"]) == ["b2", "b4"]
    # the Linear's forward mm: 2 * batch * 8 * 4 FLOPs = 128 (batch 2), 256 (batch 4); its weight gradient
    # mm in the backward is as many (the input needs no gradient): 256 and 512 per step, x 2.0
    assert list(module["flops_per_step"]) == [256.0, 512.0]
    assert list(module["flops_ratio"]) == [1.0, 2.0]
    # the whole run adds the sum (2 * 4 = 8 and 4 * 4 = 16 FLOPs): 264 and 528
    assert list(whole["flops_per_step"]) == [264.0, 528.0]


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_the_cli_compares_a_module_named_total(totals, capsys, engine):
    main(["compare", *map(str, totals), "--by", "module", "--json", "--engine", engine])
    rows = json.loads(capsys.readouterr().out)["rows"]
    module = [r for r in rows if r["module"] == "total (module)"]
    assert [r["flops_per_step"] for r in module] == [256, 512]  # as above
