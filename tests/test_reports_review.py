"""Review of what `optrace compare` prints: keys that would collide with the whole-run "total" row.

A model whose child module is named `total` (an attribute `self.total = nn.Linear(8, 4)`) gives the
compare-by-module key "total", the name of each run's whole-run row.
"""

import json
import re
import shutil

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


def _loop(path, steps, batch):
    """The usual loop: the batch made at the top of each iteration (phase other, in the step before)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(path, model=model, tokens=batch):
        for _ in range(steps):
            model(torch.randn(batch, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    root = tmp_path_factory.mktemp("loops")
    return [_loop(root / "s2.parquet", 2, 4), _loop(root / "s3.parquet", 3, 8)]


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_the_data_of_each_iteration_is_one_per_step_whatever_the_steps_traced(loops, capsys, engine):
    # k iterations make k randn batches; the step rule puts the first two in step 0 (the second runs after
    # step 0's optimizer, before step 1's forward), so "other" has rows in k - 1 steps. Per step it must be
    # one randn, not k / (k - 1) of one (2 at k = 2, 1.5 at k = 3, as it was).
    main(["compare", *map(str, loops), "--json", "--engine", engine])
    rows = {(r["phase"], r["run"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["other", "s2"]["ops_per_step"] == 1 and rows["other", "s3"]["ops_per_step"] == 1
    # randn(4, 8) and randn(8, 8) in float32: 4 * 8 * 4 = 128 and 8 * 8 * 4 = 256 bytes, x 2.0
    assert rows["other", "s2"]["bytes_allocated_per_step"] == 128 and rows["other", "s3"]["bytes_allocated_per_step"] == 256
    assert rows["other", "s3"]["bytes_allocated_ratio"] == 2
    # a step is 34 ops at either batch and step count: 1 randn + 8 forward + 21 backward + 4 SGD add_
    assert rows["total", "s2"]["ops_per_step"] == 34 and rows["total", "s3"]["ops_per_step"] == 34


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


def test_pftrace_cumulative_flops_past_int64(tmp_path):
    # test_overflow's 405B-shaped matmuls on meta tensors: 400 x 29,273,397,577,908,224 FLOPs; the running
    # total passes int64 at the 316th (316 x 29,273,397,577,908,224 = 9,250,393,634,618,998,784 > 2**63 - 1),
    # which Perfetto's int64 counter_value cannot hold: that value and the later ones go as double_counter_value
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace
    from tests.reports.test_overflow import PER_MATMUL, TOKENS, D, Matmuls

    from reports.output.export import export_trace

    model = Matmuls()
    with Tracer(tmp_path / "t", model=model, tokens=TOKENS):
        model(torch.empty(TOKENS, D, device="meta"))
    out = tmp_path / "t.pftrace"
    export_trace(tmp_path / "t", out)
    events = [p.track_event for p in Trace.FromString(out.read_bytes()).packet if p.HasField("track_event")]
    values = [e.counter_value if e.HasField("counter_value") else e.double_counter_value
              for e in events if e.HasField("counter_value") or e.HasField("double_counter_value")]
    flops = [v for v in values if v >= PER_MATMUL]  # the cumulative FLOPs counter (live bytes stay far below)
    assert len(flops) == 400 and flops[314] == 315 * PER_MATMUL  # exact while it fits int64
    assert flops[-1] == float(400 * PER_MATMUL)  # 11,709,359,031,163,289,600, as a double


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_export_refuses_to_write_inside_the_trace(loops, tmp_path, capsys, name):
    # a file left in the trace directory makes the trace unreadable ("not an optrace part ... move it out")
    trace = tmp_path / "copy"
    shutil.copytree(loops[0], trace)
    assert main(["export", str(trace), "-o", str(trace / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"optrace export: error: the output {str(trace / name)!r} is inside the trace {str(trace)!r}, "
                   "which holds only the tracer's files: write it elsewhere")
    assert sorted(p.name for p in trace.iterdir()) == sorted(p.name for p in loops[0].iterdir())  # nothing added
