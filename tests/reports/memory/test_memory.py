"""reports.memory on traces of a tiny MLP trained with AdamW: golden byte counts.

The model: Linear(4, 8) -> ReLU -> Linear(8, 2) on a batch x of 3 rows, loss = mean(y ** 2).
P = 4*8 + 8 + 8*2 + 2 = 58 parameters in 4 tensors, all float32 (4 bytes each).
"""

import functools
import gc
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from torch import nn

from reports.errors import ReportError
from reports.loading.load import load
from reports.memory.memory import CATEGORIES, by_category, by_dtype, peak, storages, timeline
from reports.output.cli import main
from tests.helpers import unwrapped
from tracer import Tracer
from tracer.recording.metadata import LIVE_OPTIMIZERS
from tracer.schema import read_metadata

P = 4 * 8 + 8 + 8 * 2 + 2  # 58 parameters
TENSORS = 4  # weight and bias of two Linear layers


def trace_mlp(path, steps=1, dtype=None, run_name=None):
    """Trace `steps` AdamW steps of the MLP (forward under CPU autocast when `dtype` is given)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    with Tracer(path, model=model, run_name=run_name) as tracer:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            if steps > 1:
                opt.zero_grad()
        tracer.set_step_time(0.01)
    return path


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    return load(trace_mlp(tmp_path_factory.mktemp("mem") / "one.parquet"))


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    return load(trace_mlp(tmp_path_factory.mktemp("mem") / "two.parquet", steps=2))


@pytest.fixture(scope="module")
def fp32_bf16(tmp_path_factory):
    d = tmp_path_factory.mktemp("mem")
    return load(
        [
            trace_mlp(d / "fp32.parquet", run_name="fp32"),
            trace_mlp(d / "bf16.parquet", dtype=torch.bfloat16, run_name="bf16"),
        ]
    )


def categories(df, at):
    table = by_category(df, at)
    return dict(zip(table["category"], table["bytes"]))


def test_parameters_gradients_activations_after_one_step(one_step):
    most = categories(one_step, "max")
    assert most["parameters"] == 4 * P == 232
    assert most["gradients"] == 4 * P == 232
    # Alive when the backward begins: relu's output [3, 8] (relu and the second Linear save it),
    # the second Linear's output [3, 2] (pow saves it), the loss [] and backward()'s ones_like seed [].
    assert most["activations"] == 4 * (3 * 8 + 3 * 2 + 1 + 1) == 128
    assert most["activations"] > 0
    end = categories(one_step, "end")  # no zero_grad: the gradients are still there
    assert end["parameters"] == 232 and end["gradients"] == 232


def test_optimizer_state_after_one_step(one_step):
    # AdamW: exp_avg and exp_avg_sq like every parameter (2 * 4 * P) + one float32 `step` scalar per tensor.
    assert categories(one_step, "end")["optimizer_state"] == 2 * 4 * P + 4 * TENSORS == 480


def test_zero_redundancy_optimizers_state_is_optimizer_state(tmp_path):
    """ZeroRedundancyOptimizer keeps its state in the inner optimizer (`.optim`): it was 0 bytes of
    optimizer_state, its AdamW moments counted as temporaries (and the plan scaled them with the batch)."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=0.1)
        x = torch.randn(3, 4)
        with Tracer(tmp_path / "zero", model=model):
            for _ in range(2):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
    finally:
        dist.destroy_process_group()
    df = load(tmp_path / "zero")
    # the state the first step made: exp_avg and exp_avg_sq of every parameter and a float32 step per tensor
    assert categories(df, "end")["optimizer_state"] == 2 * 4 * P + 4 * TENSORS == 480
    roles = next(iter(df.attrs["runs"].values()))["storage_roles"]
    assert len(roles["optimizer_state"]) == 3 * TENSORS  # 12 storages
    assert next(iter(df.attrs["runs"].values()))["optimizer_params"] == P  # the inner AdamW's, this rank's shard


def test_categories_at_the_end_of_the_first_of_two_steps(two_steps):
    last = int(two_steps.loc[two_steps["step"] == 0, "seq"].max())  # zero_grad frees the gradients in step 1
    at = categories(two_steps, last)
    assert at["parameters"] == 4 * P == 232
    assert at["gradients"] == 4 * P == 232
    assert at["optimizer_state"] == 2 * 4 * P + 4 * TENSORS == 480
    assert at["activations"] == 4  # the loss, still held by the loop's variable
    assert at["inputs"] == 3 * 4 * 4 == 48  # x
    assert sum(at.values()) == int(two_steps.loc[two_steps["seq"] == last, "live_bytes"].iloc[0])


def test_activations_with_gradient_accumulation(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with Tracer(tmp_path / "accum.parquet", model=model):
        for _ in range(2):  # two micro-batches, one step
            model(x).pow(2).mean().backward()
    line = timeline(load(tmp_path / "accum.parquet"))
    backward = (line["phase"] == "backward").to_numpy()
    begins = np.flatnonzero(backward & ~np.r_[False, backward[:-1]])
    assert len(begins) == 2
    for begin in begins:  # each backward finds its micro-batch's relu output [3, 8] and Linear output [3, 2] alive
        assert line["activations_bytes"].iloc[begin - 1] >= 4 * (3 * 8 + 3 * 2)


@pytest.mark.parametrize("trace", ["one_step", "two_steps", "fp32_bf16"])
def test_timeline_categories_add_up_to_live_bytes(trace, request):
    df = request.getfixturevalue(trace)
    line = timeline(df)
    assert len(line) == len(df)
    parts = line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1)
    assert (parts == line["live_bytes"]).all()
    assert (line["live_bytes"].to_numpy() == df["live_bytes"].to_numpy()).all()


def test_storages(one_step):
    s = storages(one_step).set_index("storage_id")
    params = s[s["category"] == "parameters"]
    assert sorted(params["nbytes"]) == [4 * 2, 4 * 8, 4 * 8 * 2, 4 * 4 * 8]  # b2, b1, W2, W1
    assert (params["alloc_seq"] == -1).all() and params["free_seq"].isna().all()
    relu = s[s["op"] == "aten.relu.default"].iloc[0]
    assert (relu["nbytes"], relu["dtype"], relu["category"], relu["phase"]) == (
        3 * 8 * 4,
        "float32",
        "activations",
        "forward",
    )
    x = s[s["category"] == "inputs"]
    assert x["nbytes"].sum() == 3 * 4 * 4  # the batch, made before the trace
    assert s.loc[s["allocated"], "nbytes"].sum() == one_step["bytes_allocated"].sum()
    steps = s[(s["category"] == "optimizer_state") & ~s["allocated"]]  # AdamW's torch.tensor(0.0) step counters
    assert list(steps["nbytes"]) == [4] * TENSORS and set(steps["op"]) == {"aten.lift_fresh.default"}


def test_peak(two_steps):
    top = peak(two_steps)
    assert list(top.columns) == ["run", "peak_live_bytes", "seq", "step", "phase", "module", "op"]
    row = two_steps.loc[two_steps["live_bytes"].idxmax()]
    assert top["peak_live_bytes"].iloc[0] == row["live_bytes"] and top["seq"].iloc[0] == row["seq"]
    at_peak = by_category(two_steps)
    assert at_peak["bytes"].sum() == row["live_bytes"] and (at_peak["seq"] == row["seq"]).all()


def test_by_dtype_bf16_halves_the_matmul_outputs(fp32_bf16):
    table = by_dtype(fp32_bf16)
    assert set(table.loc[table["run"] == "fp32", "dtype"]) == {"float32"}
    assert table.loc[(table["run"] == "bf16") & (table["dtype"] == "bfloat16"), "bytes_allocated"].iloc[0] > 0
    totals = table.groupby("run")["bytes_allocated"].sum()
    traced = fp32_bf16.groupby("run", observed=True)["bytes_allocated"].sum()
    assert totals.to_dict() == traced.to_dict()
    s = storages(fp32_bf16)
    addmm = s[(s["op"] == "aten.addmm.default") & s["allocated"]].groupby("run")["nbytes"].apply(list).to_dict()
    assert addmm == {"fp32": [3 * 8 * 4, 3 * 2 * 4], "bf16": [3 * 8 * 2, 3 * 2 * 2]}


def test_empty_results_keep_their_dtypes(one_step):
    empty = one_step.iloc[0:0]
    for fn in (storages, timeline, peak, by_category, by_dtype):
        out, full = fn(empty), fn(one_step)
        assert len(out) == 0 and len(full) > 0
        assert out.dtypes.to_dict() == full.dtypes.to_dict(), fn.__name__


def test_errors(one_step, tmp_path):
    with pytest.raises(
        ReportError,
        match=r"by_category: at must be one of \['peak', 'end', 'max'\] or an op's seq \(int\), got 'middle'",
    ):
        by_category(one_step, "middle")
    with pytest.raises(
        ReportError, match=r"by_category: run 'one' has no op with seq 100000 \(its seq runs 0\.\.\d+\)"
    ):
        by_category(one_step, 100000)
    path = trace_mlp(tmp_path / "few.parquet")
    few = load(path, columns=["seq", "step", "op", "phase", "module", "live_bytes"])
    assert len(peak(few)) == 1
    for fn in (storages, timeline, by_category, by_dtype):
        with pytest.raises(ReportError, match=rf"{fn.__name__}: the trace lacks column\(s\) \['input_storage_ids'"):
            fn(few)
    with pytest.raises(ReportError, match=r"peak: the trace lacks column\(s\) \['live_bytes'\]"):
        peak(few.drop(columns="live_bytes"))
    with pytest.raises(ReportError, match=r"expected a DataFrame returned by reports.load"):
        timeline(pd.DataFrame(one_step))


def _synthetic(n):
    """n rows of 1 KiB ops: op i reads storage i+9, allocates storage i+10 and (from op 1) frees storage i+8."""
    steps = np.arange(n + 1, dtype=np.int32)

    def per_row(values, kind=None):  # one value per row, as a column of 1-element lists
        return pa.ListArray.from_arrays(pa.array(steps), pa.array(values, type=kind))

    def same(value):  # every row holds the same list object
        one = np.empty(1, dtype=object)
        one[0] = value
        return np.repeat(one, n)

    ids = np.arange(n, dtype=np.int64) + 10
    shape = same(np.array([np.array([256])], dtype=object))  # [[256]]: one tensor of 256 elements
    freed = pa.ListArray.from_arrays(pa.array(np.r_[0, steps[:-1]], type=pa.int32()), pa.array(ids[1:] - 2))
    df = pd.DataFrame(
        {
            "run": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), ["big"]),
            "seq": np.arange(n, dtype=np.int64),
            "step": np.arange(n, dtype=np.int64) // 1000,
            "op": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), ["aten.exp.default"]),
            "phase": pd.Categorical.from_codes((np.arange(n) % 1000 >= 500).astype(np.int8), ["forward", "backward"]),
            "module": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), [""]),
            "input_storage_ids": per_row(ids - 1).to_pandas(),
            "input_shapes": shape,
            "input_strides": same(np.array([np.array([1])], dtype=object)),
            "input_dtypes": same(np.array(["float32"], dtype=object)),
            "output_storage_ids": per_row(ids).to_pandas(),
            "output_shapes": shape,
            "output_dtypes": same(np.array(["float32"], dtype=object)),
            "freed_storage_ids": freed.to_pandas(),
            "bytes_allocated": np.full(n, 1024, dtype=np.int64),
            "live_bytes": np.full(n, 2048, dtype=np.int64),  # the op's input and its output
        }
    )
    df.attrs["runs"] = {"big": {"parameters": {}, "storage_roles": {}}}
    return df


def test_a_million_rows():
    df = _synthetic(1_000_000)
    line = timeline(df)  # its time is a benchmark's (benchmarks/long_run.py, report_engines.py), not a test's
    assert len(line) == 1_000_000
    parts = line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1)
    assert (parts == line["live_bytes"]).all()


def test_a_trace_entered_after_a_warm_up_step_counts_the_state_from_row_0(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    model(x).pow(2).mean().backward()
    opt.step()  # warm-up: AdamW's state exists, the gradients are kept (no zero_grad)
    with Tracer(tmp_path / "warm", model=model):
        model(x).pow(2).mean().backward()
        opt.step()
    df = load(tmp_path / "warm")
    line = timeline(df)
    assert (line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1) == line["live_bytes"]).all()
    first = line.iloc[0]
    assert first["parameters_bytes"] == 4 * P == 232
    assert first["gradients_bytes"] == 4 * P == 232  # accumulated into in place: the same storages all step
    assert first["optimizer_state_bytes"] == 2 * 4 * P + 4 * TENSORS == 480
    assert (line["optimizer_state_bytes"] == 480).all() and (line["gradients_bytes"] == 232).all()
    # parameters, gradients and state are all that was registered at entry: 232 + 232 + 480 = 944 bytes
    assert sum(nbytes for _, nbytes in df.attrs["runs"]["warm"]["storage_roles"]["at_entry"]) == 944
    assert (
        int(df["live_bytes"].iloc[0])
        == 944 + first["inputs_bytes"] + first["temporaries_bytes"] + first["activations_bytes"]
    )
    assert -1 not in set(storages(df)["storage_id"])  # nothing live at the start is left unnamed


def test_checkpointed_run_adds_up(tmp_path):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with Tracer(tmp_path / "ckpt", model=model):
        checkpoint(model, x, use_reentrant=False).pow(2).mean().backward()
    df = load(tmp_path / "ckpt")
    assert df["recompute"].any()
    line = timeline(df)
    assert (line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1) == line["live_bytes"]).all()
    # the checkpoint keeps only its input x (an input, made before the trace): no Linear output is saved
    assert categories(df, "max")["activations"] == 4 * (
        3 * 2 + 1 + 1
    )  # model output [3, 2] for pow, the loss and its seed


def test_a_storage_resized_in_place_is_followed(tmp_path):
    buffer = torch.zeros(4)  # 16 bytes, made before the trace
    with Tracer(tmp_path / "resize", run_name="r"):
        buffer.add_(1.0)
        buffer.resize_(16)  # 64 bytes from this op on
        buffer.mul_(2.0)
    df = load(tmp_path / "resize")
    line = timeline(df)
    assert line["live_bytes"].tolist() == [16, 64, 64]
    assert (line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1) == line["live_bytes"]).all()
    resized = df.attrs["runs"]["r"]["storage_roles"]["resized"]
    assert resized == [[1, 0, 64]]  # [seq, storage id, bytes]
    assert storages(df).set_index("storage_id")["nbytes"].to_dict() == {0: 64}  # its largest size


def test_a_v2_trace_without_entry_facts_reads_as_before(one_step):
    old = one_step.copy()
    meta = dict(one_step.attrs["runs"]["one"])
    meta["storage_roles"] = {k: v for k, v in meta["storage_roles"].items() if k not in ("at_entry", "resized")}
    old.attrs["runs"] = {"one": meta}
    assert categories(old, "max") == categories(one_step, "max")
    line = timeline(old)
    assert (line[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1) == line["live_bytes"]).all()


def test_optimizers_at_entry_are_found_by_their_class_at_any_depth():
    """tracer.recording.metadata finds the live optimizers of the model's parameters from Optimizer's subclass tree: a
    subclass of a subclass defined here, Optimizer itself, and not one holding other parameters."""
    from tracer.recording.metadata import _optimizers

    class Inner(torch.optim.SGD):
        pass

    class Outer(Inner):
        pass

    torch.manual_seed(0)
    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    deep = Outer(model.parameters(), lr=0.1)
    base = torch.optim.Optimizer([model.weight], {})
    elsewhere = torch.optim.AdamW(other.parameters())
    found = list(_optimizers({id(p) for p in model.parameters()}))
    assert {id(o) for o in found} == {id(deep), id(base)} and len(found) == 2
    assert elsewhere not in found


def _adamw_stepped(model, x, opt=None, make=torch.optim.AdamW):
    opt = opt or make(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    return opt


def _traced_step(path, model, x, opt):
    gc.collect()  # an earlier test's optimizer freed by the collector meanwhile would move a class's count
    passes = LIVE_OPTIMIZERS.passes
    with Tracer(path, model=model):
        _adamw_stepped(model, x, opt)
    return LIVE_OPTIMIZERS.passes - passes, read_metadata(path)["storage_roles"]


def test_the_optimizers_found_at_entry_are_kept_until_one_is_made_or_freed(tmp_path):
    """tracer.recording.metadata LiveOptimizers: one pass over the live objects finds the optimizers, and later traces reuse
    what it found until an optimizer is made or freed. The state found at entry is the same either way: AdamW on
    Linear(4, 4) keeps exp_avg and exp_avg_sq per parameter and a step tensor each: 2 * 3 = 6 storages."""
    torch.manual_seed(0)
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    first = _adamw_stepped(model, x)
    roles = [_traced_step(tmp_path / f"t{i}", model, x, first) for i in range(3)]
    assert [passes for passes, _ in roles] == [1, 0, 0]  # 0: the instances kept
    assert [len(r["optimizer_state"]) for _, r in roles] == [6, 6, 6]
    second = _adamw_stepped(model, x)  # made after the pass: a pass again, and both optimizers' state at entry
    passes, roles = _traced_step(tmp_path / "made", model, x, second)
    assert passes == 1 and len(roles["optimizer_state"]) == 12  # 6 + 6
    del first
    passes, roles = _traced_step(tmp_path / "freed", model, x, second)
    assert passes == 1 and len(roles["optimizer_state"]) == 6
    assert _traced_step(tmp_path / "again", model, x, second)[0] == 0


def test_an_optimizer_a_kept_pass_cannot_see_is_named_at_its_step(tmp_path, capsys):
    """The one case the kept instances miss: an optimizer made while another reference to its class is dropped (here a
    functools.partial of AdamW, used once). Its state, alive at entry but found only at its step, is warned about:
    exp_avg and exp_avg_sq of weight 4 * 4 * 4 = 64 bytes each, of bias 4 * 4 = 16 each, two 4-byte steps: 168. Also
    in the metadata (optimizer_state_found_late), a note of the report and its --json."""
    torch.manual_seed(0)
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    first = _adamw_stepped(model, x)
    factory = functools.partial(torch.optim.AdamW, lr=0.1)
    assert _traced_step(tmp_path / "t0", model, x, first)[0] == 1  # the partial moved AdamW's count: a pass
    second = _adamw_stepped(model, x, make=factory)
    del factory  # AdamW's count is back where the pass left it, with one more instance
    with pytest.warns(
        UserWarning,
        match=r"optimizer AdamW \(168 bytes in 6 storage\(s\)\) was alive when the "
        r"Tracer was entered but was not found then",
    ):
        passes, roles = _traced_step(tmp_path / "t1", model, x, second)
    assert passes == 0 and len(roles["optimizer_state"]) == 12  # registered at its step: both roles known
    assert read_metadata(tmp_path / "t1")["optimizer_state_found_late"] == 168
    assert read_metadata(tmp_path / "t0")["optimizer_state_found_late"] == 0
    capsys.readouterr()
    main(["report", str(tmp_path / "t1")])
    assert (
        "- optimizer_state_found_late: 168 bytes of optimizer state were alive when the Tracer was entered but found "
        "only at their optimizer's step"
    ) in unwrapped(capsys.readouterr().out)
    main(["report", str(tmp_path / "t1"), "--json"])
    assert json.loads(capsys.readouterr().out)["optimizer_state_found_late"] == 168
