"""reports.tables on a small traced model: sums, the module tree, several runs, empty input, errors."""

import pandas as pd
import pytest
import torch
from torch import nn

from reports.errors import ReportError
from reports.loading.load import load
from reports.tables import by_dtype, by_module, by_op, by_phase, by_step, row_dtypes

B, D, H = 4, 8, 16  # tokens per step, width, hidden width


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, H)
        self.fc2 = nn.Linear(H, D)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    """Two residual blocks in a ModuleList (which never runs itself) and a head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(D, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().mean()


def trace_net(path, steps=1, run_name=None):
    from tracer import Tracer

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(B, D)
    with Tracer(path, model=model, tokens=B, run_name=run_name):
        for _ in range(steps):
            model(x).backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    return trace_net(tmp_path_factory.mktemp("tables") / "net", steps=2)


@pytest.fixture(scope="module")
def df(net):
    return load(net)


def test_by_module_rolls_children_up(df):
    t = by_module(df).set_index("module")
    own_total = t.drop(index="")["flops"].sum()
    # The root's subtree is everything that ran inside the model: all module rows' own FLOPs.
    assert t.loc["Net", "subtree_flops"] == own_total
    assert t.loc["Net", "subtree_flops"] + t.loc["", "flops"] == df["flops"].sum()
    # Every parent's subtree = its own + its children's subtrees (for ops, bytes and time too).
    for name, row in t.drop(index="").iterrows():
        children = t[t["parent"] == name]
        for col in ("ops", "flops", "bytes_allocated"):
            assert row[f"subtree_{col}"] == row[col] + children[f"subtree_{col}"].sum(), (name, col)
        assert row["subtree_duration_us"] == pytest.approx(row["duration_us"] + children["subtree_duration_us"].sum())
    # The ModuleList ran no op itself but is a node of the tree.
    assert t.loc["blocks", "ops"] == 0 and t.loc["blocks", "subtree_ops"] > 0
    assert t.loc["blocks", "subtree_flops"] == t.loc["blocks.0", "subtree_flops"] + t.loc["blocks.1", "subtree_flops"]
    assert dict(t["depth"][["Net", "blocks", "blocks.0", "blocks.0.fc1", "head", ""]]) == {
        "Net": 0,
        "blocks": 1,
        "blocks.0": 2,
        "blocks.0.fc1": 3,
        "head": 1,
        "": 0,
    }
    # Tree order: depth first, children in the order they ran; ops outside any module last.
    assert list(t.index[:5]) == ["Net", "blocks", "blocks.0", "blocks.0.fc1", "blocks.0.fc2"]
    assert t.index[-1] == ""


def test_by_module_phase_golden(df):
    fwd = by_module(df, phase="forward").set_index("module")
    # fc1 forward, per step: addmm [4, 8] @ [8, 16] = 2 * 4 * 8 * 16 = 1,024 FLOPs (the bias add is
    # not counted); two steps traced: 2,048.
    assert fwd.loc["blocks.0.fc1", "flops"] == 2 * (2 * B * D * H)
    # fc2: [4, 16] @ [16, 8] = 1,024 per step too; the block adds the residual: 4 * 8 = 32 per step.
    assert fwd.loc["blocks.0", "subtree_flops"] == 2 * (1024 + 1024 + 32 + B * H)  # + relu, 4 * 16 = 64


def test_by_module_unknown_phase(df):
    with pytest.raises(ReportError, match=r"by_module: unknown phase\(s\) \['fwd'\]; phases are"):
        by_module(df, phase="fwd")


def test_by_op_phase_step_dtype_add_up(df):
    total = df["flops"].sum()
    for table in (by_op(df), by_phase(df), by_dtype(df)):
        assert table["flops"].sum() == total
        assert table["ops"].sum() == len(df)
        assert table["flops_pct"].sum() == pytest.approx(100)
    ops = by_op(df).set_index("op")
    # Five Linear layers (2 blocks x 2 + head), forward, two steps: 10 addmm.
    assert ops.loc["aten.addmm.default", "ops"] == 10
    assert ops.loc["aten.addmm.default", "flop_kind"] == "matmul"
    assert by_op(df)["flops"].is_monotonic_decreasing
    assert list(by_phase(df)["phase"]) == ["forward", "backward", "optimizer"]


def test_by_step(df):
    steps = by_step(df)
    assert list(steps["step"]) == [0, 1]
    assert steps["flops"].iloc[0] == steps["flops"].iloc[1]  # the same step twice
    phases = steps[["flops_forward", "flops_backward", "flops_optimizer", "flops_other"]].sum(axis=1)
    assert (phases == steps["flops"]).all()
    assert (steps["live_bytes_peak"] > 0).all()


def test_by_dtype(df):
    t = by_dtype(df).set_index("dtype")
    matmul = df.loc[df["flop_kind"] == "matmul", "flops"].sum()
    assert t.loc["float32", "matmul_flops"] == matmul
    assert t["matmul_flops"].sum() == matmul


def test_several_runs_keep_a_run_column(net, tmp_path):
    other = trace_net(tmp_path / "other", steps=1, run_name="one_step")
    both = load([net, other])
    assert "run" not in by_op(load(net)).columns
    for fn in (by_op, by_module, by_phase, by_step, by_dtype):
        t = fn(both)
        assert t.columns[0] == "run", fn.__name__
        assert list(pd.unique(t["run"])) == ["net", "one_step"], fn.__name__
    steps = by_step(both)
    assert len(steps[steps["run"] == "one_step"]) == 1
    phase = by_phase(both)
    for run, rows in phase.groupby("run"):
        assert rows["flops_pct"].sum() == pytest.approx(100)
    mods = by_module(both).set_index(["run", "module"])
    assert mods.loc[("net", "Net"), "subtree_flops"] == 2 * mods.loc[("one_step", "Net"), "subtree_flops"]


@pytest.mark.parametrize("fn", [by_op, by_module, by_phase, by_step, by_dtype])
def test_empty_keeps_columns_and_dtypes(df, fn):
    full, empty = fn(df), fn(df.iloc[0:0])
    assert len(empty) == 0
    assert list(empty.columns) == list(full.columns)
    assert dict(empty.dtypes) == dict(full.dtypes)


@pytest.mark.parametrize(
    "fn, column",
    [
        (by_op, "flops"),
        (by_phase, "duration_ns"),
        (by_step, "live_bytes"),
        (by_dtype, "input_dtypes"),
        (by_module, "module"),
    ],
)
def test_missing_column_message(df, fn, column):
    with pytest.raises(
        ReportError, match=rf"{fn.__name__}: the trace lacks column\(s\) \['{column}'\]; load it with them"
    ):
        fn(df.drop(columns=[column]))


@pytest.mark.parametrize("lists", ["objects", "arrow"])
def test_row_dtypes_are_the_first_input_dtype_else_the_first_output(tmp_path, lists):
    from tracer import Tracer

    with Tracer(tmp_path / "casts"):
        x = torch.ones(4, 4)  # a factory: no inputs, its output's dtype
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = nn.functional.linear(x, torch.ones(4, 4))  # casts, then a bf16 matmul
        y.float().sum()
    frame = load(tmp_path / "casts", lists=lists)
    plain = load(tmp_path / "casts")
    expected = [
        str(i[0]) if len(i) else str(o[0]) if len(o) else ""
        for i, o in zip(plain["input_dtypes"], plain["output_dtypes"])
    ]
    assert list(row_dtypes(frame)) == expected
    assert expected[0] == "float32" and "bfloat16" in expected  # ones: its output; the matmul: bf16 inputs


def test_by_module_of_an_arrow_table_hangs_the_tree_on_the_root_its_metadata_names(net, df):
    """An Arrow table of a part with the run metadata in its schema (tracer.schema.read_part) names its root module
    (`root_module` "Net"): the tree is the loaded frame's, where without the root each of Net's children was a root of
    its own (blocks at depth 0, Net's subtree its own ops alone)."""
    from tracer.schema import part_paths, read_part

    (part,) = part_paths(net)  # 2 steps of this small Net fit one part
    got = by_module(read_part(part)).set_index("module")
    want = by_module(df).set_index("module")
    assert dict(got["depth"][["Net", "blocks", "blocks.0", "head", ""]]) == {
        "Net": 0,
        "blocks": 1,
        "blocks.0": 2,
        "head": 1,
        "": 0,
    }
    assert got.loc["Net", "subtree_flops"] == want.loc["Net", "subtree_flops"] == want.drop(index="")["flops"].sum()
    pd.testing.assert_frame_equal(got, want)


def test_by_module_of_an_arrow_table_keeps_the_phases_asked_for(net, df):
    """`phase=` over an Arrow table keeps the rows of those phases, as over the loaded frame (it raised
    AttributeError: 'pyarrow.lib.Table' object has no attribute 'attrs'); a table without `phase` gets reports.load's
    one line."""
    from tracer.schema import part_paths, read_part

    (part,) = part_paths(net)
    table = read_part(part)
    got = by_module(table, phase="forward").set_index("module")
    # fc1 forward: 2 steps of [4, 8] @ [8, 16], 2 * 4 * 8 * 16 = 1,024 FLOPs each: 2,048
    assert got.loc["blocks.0.fc1", "flops"] == 2 * (2 * B * D * H) == 2048
    pd.testing.assert_frame_equal(got, by_module(df, phase="forward").set_index("module"))
    with pytest.raises(ReportError, match=r"by_module: the trace lacks column\(s\) \['phase'\]; load it with them"):
        by_module(table.drop_columns(["phase"]), phase="forward")
