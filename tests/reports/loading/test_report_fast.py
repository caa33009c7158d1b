"""The fast report path gives exactly the figures of the reference path.

Reference: `reports.load(path)` (every list cell a numpy array, pandas' own conversion)
and the report functions. Fast: `load(path, lists="arrow")` (list columns kept as
Arrow arrays), what `optrace report --engine pandas` and `optrace compare --engine pandas`
use; the CLI's default, the SQL engine, is compared with the reference here too. Every
table must be equal to the last bit (assert_frame_equal with check_exact), on traces
of several steps, under bf16 autocast with tied weights and a fused attention kernel,
with activation checkpointing, without model= and tokens=, and on several runs at once.
"""

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step
from torch import nn
from torch.utils.checkpoint import checkpoint

import reports
from reports.compare import columns as compare_columns
from reports.errors import ReportError
from reports.loading.columns import cell_lists
from reports.output import cli
from reports.output.compare_text import compare_json
from reports.output.headline import assemble
from reports.output.report_text import print_report
from reports.output.source import Source
from tracer import Tracer
from tracer.schema import part_paths, read_part

FAST = ("arrow",)


class Checkpointed(nn.Module):
    """Two Linear layers, the first re-run in the backward by activation checkpointing."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(checkpoint(lambda t: torch.relu(self.a(t)), x, use_reentrant=False)).square().mean()


def _gpt(path, steps, described=True, dtype=None, **config):
    """A tiny GPT traced for `steps` AdamW steps (under autocast to `dtype` when given)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=1, n_head=2, d_model=16, **config)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, 2)
    facts = {"model": model, "tokens": 2 * cfg.seq_len} if described else {}
    with Tracer(path, run_name=path.name, **facts):
        for _ in range(steps):
            train_step(model, opt, idx, targets, dtype=dtype)
    return path


def _flag_recompute(path):
    """Mark the checkpointed layer's re-run forward (the addmm in the backward) as recompute rows."""
    for part in part_paths(path):
        table = read_part(part)
        frame = table.to_pandas()
        flags = (frame["phase"] == "backward") & (frame["op"] == "aten.addmm.default")
        table = table.set_column(table.schema.get_field_index("recompute"), "recompute", pa.array(flags.to_numpy()))
        pq.write_table(table, part)


def _checkpointed(path):
    torch.manual_seed(0)
    model = Checkpointed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with Tracer(path, model=model, tokens=4, run_name=path.name):
        for _ in range(2):
            model(x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    _flag_recompute(path)
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast")
    return {
        "gpt_3_steps": _gpt(root / "gpt_3_steps", 3),
        "gpt_sdpa_tied": _gpt(root / "gpt_sdpa_tied", 2, attention="sdpa", tie_weights=True),
        "checkpointed": _checkpointed(root / "checkpointed"),
        "no_model_no_tokens": _gpt(root / "no_model_no_tokens", 2, described=False),
    }


@pytest.fixture(scope="module")
def autocast(tmp_path_factory):
    """The tied sdpa GPT under bf16 autocast."""
    path = tmp_path_factory.mktemp("fast_bf16") / "gpt_bf16"
    return _gpt(path, 2, dtype=torch.bfloat16, attention="sdpa", tie_weights=True)


def _tables(df):
    """Every report of the frame: {name: DataFrame, list of lines, or the ReportError's message}."""
    calls = {
        "by_op": reports.by_op,
        "by_module": reports.by_module,
        "by_phase": reports.by_phase,
        "by_step": reports.by_step,
        "by_dtype": reports.by_dtype,
        "breakdown": reports.breakdown,
        "breakdown_total": lambda d: reports.breakdown(d, n="total"),
        "explain": reports.explain,
        "mfu": lambda d: reports.mfu(d, step_time_s=0.01),
        "peak": reports.peak,
        "timeline": reports.timeline,
        "by_category": reports.by_category,
        "by_category_max": lambda d: reports.by_category(d, at="max"),
        "storages": reports.storages,
        "memory_by_dtype": reports.memory_by_dtype,
        "views": reports.views,
        "copies": reports.copies,
    }
    out = {}
    for name, fn in calls.items():
        try:
            out[name] = fn(df)
        except ReportError as exc:
            out[name] = f"ReportError: {exc}"
    return out


def _same(reference, fast):
    assert reference.keys() == fast.keys()
    for name, want in reference.items():
        got = fast[name]
        if isinstance(want, pd.DataFrame):
            pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)
        else:
            assert got == want, name


@pytest.mark.parametrize("name", ["gpt_3_steps", "gpt_sdpa_tied", "checkpointed", "no_model_no_tokens"])
@pytest.mark.parametrize("lists", FAST)
def test_every_table_is_identical(traces, name, lists):
    path = traces[name]
    reference = _tables(reports.load(path))
    _same(reference, _tables(reports.load(path, lists=lists)))
    if name == "no_model_no_tokens":  # the reports that need N and T say why, the rest report
        assert reference["breakdown"].startswith("ReportError: run 'no_model_no_tokens' has no parameter metadata")
    else:
        assert len(reference["explain"]) >= 3 and reference["breakdown"]["flops"].iloc[-1] > 0


def test_autocast_tables_are_identical(autocast):
    reference = _tables(reports.load(autocast))
    assert "bfloat16" in set(reference["by_dtype"]["dtype"])  # the matmuls ran in bf16
    for lists in FAST:
        _same(reference, _tables(reports.load(autocast, lists=lists)))


def test_checkpointed_trace_has_recompute_rows(traces):
    df = reports.load(traces["checkpointed"], lists="arrow")
    assert df["recompute"].any()
    assert reports.mfu(df, step_time_s=0.01)["recompute_flops_per_step"].iloc[0] > 0


def test_several_runs_are_identical(traces, autocast):
    paths = [traces["gpt_3_steps"], autocast, traces["checkpointed"]]
    reference = _tables(reports.load(paths))
    for lists in FAST:
        _same(reference, _tables(reports.load(paths, lists=lists)))


@pytest.mark.parametrize("by", ["phase", "op", "module"])
def test_compare_on_the_columns_it_reads(traces, autocast, by):
    paths = [traces["gpt_3_steps"], autocast]
    want = reports.compare(reports.load(paths), by=by)
    got = reports.compare(reports.load(paths, columns=compare_columns(by), lists="arrow"), by=by)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert want["mfu_pct"].isna().all()  # no untraced step time in these traces: MFU N/A, not 0


def _cli(argv):
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(argv) == 0
    return out.getvalue()


@pytest.mark.parametrize("name", ["gpt_3_steps", "gpt_sdpa_tied", "checkpointed", "no_model_no_tokens"])
def test_cli_report_prints_the_reference_figures(traces, name):
    path = str(traces[name])
    args = cli._parser().parse_args(["report", path])
    reference = io.StringIO()
    src = Source(_loaded(path))  # the views over the rows the reference loader read
    print_report(src, assemble(src, depth=args.depth, top=args.top, explain=False), args, reference)
    assert _cli(["report", path]) == reference.getvalue()
    assert json.loads(_cli(["report", path, "--json"])) == json.loads(json.dumps(cli.summary(_loaded(path))))


def _loaded(path):
    """A Trace over every row and column reports.load reads of `path` (list cells as numpy arrays)."""
    from reports.sql.frame import memory_trace

    df = reports.load(path)
    return memory_trace(df, "report", [], list(df.columns), grains=True)


def test_cli_compare_prints_the_reference_figures(traces, autocast):
    paths = [str(traces["gpt_3_steps"]), str(autocast)]
    want = reports.compare(reports.load(paths), by="op")
    runs = list(reports.load(paths).attrs["runs"])
    assert (
        json.loads(_cli(["compare", *paths, "--by", "op", "--json"]))["rows"]
        == json.loads(json.dumps(compare_json(want, runs, "op")))["rows"]
    )


def test_arrow_lists_stay_arrow_and_a_bad_mode_is_one_line(traces):
    df = reports.load(traces["gpt_3_steps"], lists="arrow")
    assert isinstance(df["input_storage_ids"].dtype, pd.ArrowDtype)
    moved = df[df["phase"] == "backward"].reset_index(drop=True)
    assert (
        cell_lists(moved, "output_shapes", np.arange(3), pa.list_(pa.int64())).to_pylist()
        == moved["output_shapes"].iloc[:3].tolist()
    )
    with pytest.raises(ReportError, match=r"load: lists must be one of \['objects', 'arrow'\], got 'deferred'"):
        reports.load(traces["gpt_3_steps"], lists="deferred")


def test_flattened_id_lists_are_shared_while_their_frame_lives_and_dropped_with_it(tmp_path):
    """reports.loading.columns.flat keeps its last results for the frames' Arrow columns (roles and storage lifetimes
    share them), read-only, and forgets them once the frame is gone."""
    import gc

    from reports.loading import columns

    path = tmp_path / "t"
    with Tracer(path):
        x = torch.randn(4, 4, requires_grad=True)
        (x @ x).sum().backward()
    df = reports.load(path, lists="arrow")
    first = columns.flat(df["input_storage_ids"])
    again = columns.flat(df["input_storage_ids"])
    assert again[0] is first[0] and again[1] is first[1]
    assert not first[1].flags.writeable and not first[0].flags.writeable
    expected = [i for cell in df["input_storage_ids"].tolist() for i in cell]
    assert first[1].tolist() == expected and int(first[0][-1]) == len(expected)
    assert np.array_equal(np.diff(first[0]), [len(cell) for cell in df["input_storage_ids"].tolist()])
    held = len(columns._FLAT_CACHE)
    assert held >= 1
    del df, first, again
    gc.collect()
    assert len(columns._FLAT_CACHE) == held - 1


def test_first_items_of_stored_dictionary_lists_match_python():
    """reports.loading.columns.first_items reads the first item of list<dictionary> cells from the offsets: empty and
    null lists, null items, a sliced chunk and chunks with different dictionaries give what Python gives."""
    from reports.loading.columns import first_codes, first_items

    cells = [["float32", "int64"], [], None, ["bfloat16"], [None, "float32"], ["int64"], ["float32"]]
    kind = pa.list_(pa.dictionary(pa.int32(), pa.string()))
    one = pa.array(cells, type=pa.list_(pa.string())).cast(kind)
    other = pa.array([["bool"], ["float32", "bool"]], type=pa.list_(pa.string())).cast(kind)
    chunked = pa.chunked_array([one.slice(1), other])
    expected = [(c[0] or "") if c else "" for c in cells[1:] + [["bool"], ["float32", "bool"]]]
    assert first_items(chunked).tolist() == expected
    assert first_items(pa.array(cells[1:] + [["bool"], ["float32", "bool"]])).tolist() == expected  # plain strings
    codes, words = first_codes(chunked, ["", "bool"])
    assert words[:2] == ["", "bool"] and [words[c] for c in codes] == expected


def test_each_load_reads_every_part_footer_once_and_keeps_none_for_the_next(tmp_path, monkeypatch):
    """A load opens each part's footer once (check, read); a later load reads them again,
    since a trace re-written in place can keep its size, inode and (on coarse file systems) mtime."""
    import reports.loading.integrity as integrity

    path = tmp_path / "t"
    with Tracer(path, flush_rows=7):
        x = torch.randn(4, 4, requires_grad=True)
        (x @ x).relu().sum().backward()
    parts = sorted(path.glob("part-*.parquet"))
    assert len(parts) >= 3
    opened = []
    real = integrity.read_footer
    monkeypatch.setattr(integrity, "read_footer", lambda part: opened.append(part) or real(part))
    for loads in (1, 2):
        df = reports.load(path, lists="arrow")
        assert df["seq"].is_monotonic_increasing and len(df) > 7  # the rows of every part
        assert sorted(opened) == sorted([str(p) for p in parts] * loads)
