"""Every report's per-step figures: a trace of 3 identical steps gives exactly the figures of 1 step.

The model has what the reports account separately: an input projection whose input
needs no gradient (explain's "input gradients never computed"), an embedding, a
fused attention kernel (its backward recomputes the scores: mfu's recompute), a
weight matmul head, a loss, gradient clipping (phase "other") and a plain SGD step
(no momentum, so no optimizer state: every step does the same ops on the same sizes).
Totals (by_op, by_module, ...) must be exactly 3x; per-step figures exactly equal.
"""

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import reports
from reports.output.cli import main
from reports.steps import count_steps, per_step, per_step_of, phase_steps, steps_of
from tracer import Tracer

B, S, FEAT, E, H, V = 2, 8, 4, 8, 2, 16  # batch, sequence, input features, width, heads, vocabulary
DH = E // H
T = B * S  # 16 tokens per step


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.proj = nn.Linear(FEAT, E, bias=False)  # its input is data: dL/dx never computed
        self.qkv = nn.Linear(E, 3 * E, bias=False)
        self.head = nn.Linear(E, V)

    def forward(self, idx, feats):
        x = self.emb(idx) + self.proj(feats)
        q, k, v = self.qkv(x).view(B, S, 3, H, DH).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, E)
        return F.cross_entropy(self.head(a).view(T, V), idx.view(T))


def _trace(path, steps, name):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0, foreach=True)
    idx, feats = torch.randint(0, V, (B, S)), torch.randn(B, S, FEAT)

    def train_step():  # the loss is local: nothing of one step outlives it
        opt.zero_grad(set_to_none=True)
        model(idx, feats).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    with Tracer(path, model=model, tokens=T, run_name=name):
        for _ in range(steps):
            train_step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("per_step")
    one, three = _trace(root / "one", 1, "one"), _trace(root / "three", 3, "three")
    return {"one": reports.load(one), "three": reports.load(three), "paths": (one, three)}


def _align(a, b, key):
    """Both tables indexed and sorted by `key` (rows tied on FLOPs are ordered by traced time, which varies)."""
    return a.set_index(key).sort_index(), b.set_index(key).sort_index()


def _same(a, b, columns):
    """Exactly equal columns, NaN equal to NaN."""
    for c in columns:
        pd.testing.assert_series_equal(a[c], b[c], check_exact=True, check_names=False, check_index=False, obj=c)


def _triple(a, b, columns):
    for c in columns:
        pd.testing.assert_series_equal(3 * a[c], b[c], check_exact=True, check_names=False, check_index=False, obj=c)


def test_the_traces_have_1_and_3_steps(runs):
    one, three = runs["one"], runs["three"]
    assert count_steps(one) == 1 and count_steps(three) == 3
    assert phase_steps(three) == {"forward": 3, "backward": 3, "other": 3, "optimizer": 3}
    assert len(three) == 3 * len(one)  # the same ops every step
    for s in range(3):
        assert three[three["step"] == s]["op"].astype(str).tolist() == one["op"].astype(str).tolist()


def test_breakdown(runs):
    a, b = reports.breakdown(runs["one"]), reports.breakdown(runs["three"])
    _same(a, b, [c for c in a.columns if c != "steps"])
    assert a["steps"].tolist() == [1] * 5 and b["steps"].tolist() == [3] * 5
    # forward weight matmuls: emb is looked up, proj 2·16·4·8 = 1,024, qkv 2·16·8·24 = 6,144, head 2·16·8·16 = 4,096
    assert b.set_index("phase").loc["forward", "weight_matmul_flops"] == 1024 + 6144 + 4096


def test_explain(runs):
    a, b = reports.explain(runs["one"]), reports.explain(runs["three"])
    assert "(1 step traced;" in a[0] and "(3 steps traced;" in b[0]
    assert [a[0].replace("one: ", "").replace("1 step ", "")] + a[1:] == [
        b[0].replace("three: ", "").replace("3 steps ", "")
    ] + b[1:]
    text = " ".join(b)
    # proj's dL/dx = dL/dy @ Wᵀ is never computed: 2·16·8·4 = 1,024 FLOPs per step (not 1,024 / 3)
    assert "1,024 FLOPs of input gradients" in text
    # fused attention forward 4·b·h·s²·d = 4·2·2·64·4 = 4,096; backward 2.5x = 10,240, of which 2,048 recompute
    assert "(10,240 vs 4,096 FLOPs)" in text and "2,048 FLOPs of recomputation" in text


def test_mfu(runs):
    a = reports.mfu(runs["one"], step_time_s=0.01, peak_flops=1e12)
    b = reports.mfu(runs["three"], step_time_s=0.01, peak_flops=1e12)
    _same(a, b, [c for c in a.columns if c not in ("run", "steps")])
    assert b["recompute_flops_per_step"].iloc[0] == 2048  # one fifth of the 10,240-FLOP attention backward


def test_summary_tables_are_3x(runs):
    one, three = runs["one"], runs["three"]
    totals = ["ops", "flops", "bytes_allocated", "bytes_read", "bytes_written"]
    for table, key in ((reports.by_op, "op"), (reports.by_phase, "phase"), (reports.by_dtype, "dtype")):
        a, b = _align(table(one), table(three), key)
        assert list(a.index) == list(b.index)
        _triple(a, b, totals + (["matmul_flops"] if key == "dtype" else []))
        _same(a, b, ["flops_pct"])
    a, b = reports.by_module(one), reports.by_module(three)
    _same(a, b, ["module", "depth", "parent", "subtree_flops_pct"])
    _triple(a, b, ["ops", "flops", "bytes_allocated", "subtree_ops", "subtree_flops", "subtree_bytes_allocated"])


def test_by_step_rows_equal_the_one_step_row(runs):
    a, b = reports.by_step(runs["one"]), reports.by_step(runs["three"])
    columns = [c for c in a.columns if c not in ("step", "duration_us")]
    for s in range(3):
        assert b.loc[s, columns].tolist() == a.loc[0, columns].tolist()


def test_memory(runs):
    one, three = runs["one"], runs["three"]
    a, b = reports.peak(one), reports.peak(three)
    _same(a, b, ["peak_live_bytes", "seq", "step", "phase", "module", "op"])
    _same(reports.by_category(one), reports.by_category(three), ["category", "bytes", "seq", "live_pct"])
    a, b = reports.memory_by_dtype(one), reports.memory_by_dtype(three)
    _same(a, b, ["dtype", "peak_live_bytes"])
    _triple(a, b, ["storages", "bytes_allocated"])
    a, b = reports.storages(one), reports.storages(three)
    for cat in ("activations", "gradients", "temporaries"):
        x, y = a[a["category"] == cat], b[b["category"] == cat]
        assert 3 * len(x) == len(y) and 3 * x["nbytes"].sum() == y["nbytes"].sum(), cat
    for cat in ("parameters", "inputs"):
        assert a.loc[a["category"] == cat, "nbytes"].sum() == b.loc[b["category"] == cat, "nbytes"].sum(), cat


def test_timeline_repeats_step_by_step(runs):
    a, b = reports.timeline(runs["one"]), reports.timeline(runs["three"])
    values = [c for c in a.columns if c.endswith("_bytes")] + ["phase"]
    first = b[b["step"] == 0].reset_index(drop=True)
    _same(a, first, values + ["seq"])  # the first step of three is the one-step trace
    later = [b[b["step"] == s].reset_index(drop=True) for s in (1, 2)]
    _same(later[0], later[1], values)  # and every later step repeats the one before


def test_views_and_copies_are_3x(runs):
    a, b = _align(reports.views(runs["one"]), reports.views(runs["three"]), ["kind", "op"])
    assert list(a.index) == list(b.index) and len(a) > 3
    _same(a, b, ["allocated_pct"])
    _triple(a, b, ["ops", "bytes_allocated", "bytes_written"])
    a, b = _align(reports.copies(runs["one"]), reports.copies(runs["three"]), ["module", "phase", "op"])
    assert list(a.index) == list(b.index) and len(a) > 1
    _triple(a, b, ["ops", "casts", "bytes_allocated", "bytes_written"])


def test_compare_lines_up_one_step_and_three(runs):
    table = reports.compare(list(runs["paths"]), by="op")
    one, three = table[table["run"] == "one"].reset_index(), table[table["run"] == "three"].reset_index()
    _same(one, three, ["op", "ops_per_step", "flops_per_step", "bytes_allocated_per_step"])
    # peak_live_bytes is a highest value, not a per-step one: the run's peak is the same, but the batch counts
    # towards live_bytes from its first use, so ops before that use in step 0 see less live than in later steps
    assert one.loc[0, "op"] == "total" and one.loc[0, "peak_live_bytes"] == three.loc[0, "peak_live_bytes"]
    # the same figures per step: no change (the ratio 1.0 before)
    assert three["flops_change_pct"].eq(0.0).all() and three["bytes_allocated_change_pct"].eq(0.0).all()
    assert three["steps"].eq(3).all() and one["steps"].eq(1).all()


def test_cli_json(runs):
    out = []
    for path in runs["paths"]:
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert (
                main(["report", str(path), "--json", "--step-time", "0.01", "--peak-tflops", "1", "--top", "100"]) == 0
            )
        out.append(json.loads(buf.getvalue()))
    a, b = out
    assert (a.pop("run"), b.pop("run")) == ("one", "three")
    assert (a.pop("steps"), b.pop("steps")) == (1, 3)
    # the headline's top module is a total over the traced steps, as the top-modules table: three times the one's
    (ha, hb) = (a.pop("headline"), b.pop("headline"))
    assert (ha.pop("steps_traced"), hb.pop("steps_traced")) == (1, 3)
    assert 3 * ha["top_module"].pop("flops") == hb["top_module"].pop("flops")
    assert ha == hb
    # sections that are totals over the traced steps (their `unit` says so): three times the one-step run's
    (ma, mb), (va, vb) = (a.pop("top_modules"), b.pop("top_modules")), (a.pop("views"), b.pop("views"))
    assert [3 * r["subtree_flops"] for r in ma["rows"]] == [r["subtree_flops"] for r in mb["rows"]]
    assert [3 * k["ops"] for k in va["kinds"]] == [k["ops"] for k in vb["kinds"]]
    ca, cb = a.pop("collector"), b.pop("collector")  # the path that traced each run, with its rows: a total too
    assert ca["path"] == cb["path"] and 3 * ca.get("compiled_rows", 0) == cb.get("compiled_rows", 0)
    assert a["roofline"]["available"] is False  # no bandwidth recorded: N/A in both, so equal below
    for run in (a, b):  # every op (--top 100): ops tied on FLOPs come in order of traced time, which varies
        run["top_ops"]["rows"].sort(key=lambda r: (-r["flops_per_step"], r["op"]))
    ea, eb = a["breakdown"].pop("explain"), b["breakdown"].pop("explain")  # they name the run and its steps
    assert [line.split(": ", 1)[1].replace("(1 step traced", "(3 steps traced") for line in ea[:1]] == [
        line.split(": ", 1)[1] for line in eb[:1]
    ] and ea[1:] == eb[1:]
    assert a == b


def test_per_step_sums_before_it_divides():
    # 3 steps of the same three rows; row by row a/3 would not add up to exactly 0.1 + 0.2 + 0.7
    rows = pd.DataFrame(
        {
            "step": np.repeat([0, 1, 2], 3),
            "phase": ["forward", "backward", "other"] * 3,
            "flops": [1, 2, 7] * 3,
            "m": ["a", "b", "a"] * 3,
        }
    )
    assert per_step(rows) == 1.0 + 2.0 + 7.0
    assert per_step(rows, by="m").to_dict() == {"a": 8.0, "b": 2.0}
    assert per_step(rows, mask=rows["phase"] == "other") == 7.0
    # a phase is averaged over the steps it ran in: a backward in 2 of 3 steps is not divided by 3
    cut = rows.iloc[:-2]  # step 2 lost its backward and other rows
    assert per_step(cut, mask=cut["phase"] == "backward") == 2.0
    # "other" runs in the step it follows (a loop's next batch after the optimizer): it is averaged over at
    # least the run's 3 training steps (tests/reports/test_compare.py)
    assert phase_steps(cut) == {"forward": 3, "backward": 2, "other": 3}


def test_per_step_of_by_keys_in_order_of_first_appearance_among_the_rows_summed():
    names = np.array(["forward", "backward"], dtype=object)
    phases = steps_of(np.array([0, 0, 1, 1, 0, 1]), names, np.array([0, 0, 0, 1, 1, 1]))  # each phase in 2 steps
    values = np.array([10, 20, 30, 40, 50, 60])
    by = (np.array([2, 0, 2, 1, -1, 0]), np.array(["a", "b", "c"], dtype=object))  # row 4: no key
    mask = np.array([False, True, True, True, True, True])
    keys, figures = per_step_of(values, phases, mask, by)
    # row 0 left out: a first (row 1), then c (row 2), b (row 3); a = 20/2 + 60/2, c = 30/2, b = 40/2
    assert keys.tolist() == ["a", "c", "b"] and figures.tolist() == [40.0, 15.0, 20.0]
    keys, figures = per_step_of(values, phases, None, by)
    assert keys.tolist() == ["c", "a", "b"] and figures.tolist() == [20.0, 40.0, 20.0]  # c = 10/2 + 30/2
