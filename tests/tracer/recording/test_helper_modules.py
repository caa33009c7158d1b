"""Modules built inside the forward: named in the subtree of the module that called them, the same in every step.

Model code makes modules on the fly that are not registered under the model: a kernel-hub
wrapper turning a helper function into a module (a state-space mixer's causal conv and scan),
a loss module made anew in each forward. Each is named under its caller by class, the second
of a class in one call of the caller with `~1` (tracer.recording.modules.ModuleNames), on both collector
paths, forward and backward; a module outside the model run outside every module keeps its
`<Class>#<k>` name, the same k for a loss module made anew in each step.

The model: 2 blocks, each a mixer: proj = Linear(8, 8) without bias, then Func(conv)(h, w) =
h @ w with w the mixer's (8, 8) parameter, then Func(scan)(h) = (h @ hᵀ) @ h; T = 4 rows of
D = 8; the root applies a CrossEntropyLoss made in its forward to 8 classes.
"""

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import reports
from tracer import Tracer, read_metadata
from tracer.native import loader as native

T, D = 4, 8
MM = 2 * T * D * D  # a [4, 8] @ [8, 8] product: 2·4·8·8 = 512
SCAN = 2 * T * D * T + 2 * T * T * D  # h @ hᵀ: 2·4·8·4 = 256, then [4, 4] @ [4, 8]: 2·4·4·8 = 256; 512
# the scan's backward: 2 products per forward product, 4 · 256 = 1,024, + h used three times: its
# gradients added twice, 2 · 4·8 = 64
SCAN_BACKWARD = 4 * T * D * T * 2 + 2 * T * D  # 1,088
LOSS = 5 * T * D + T  # log_softmax 5 per element, 5·4·8 = 160, + nll_loss 1 per target, 4: 164
LOSS_BACKWARD = T + 4 * T * D  # nll_loss_backward 1 per target, 4, + log_softmax backward 4·4·8 = 128: 132
PER_STEP = {  # (module, phase) -> FLOPs in every step
    ("layers.0.mixer.proj", "forward"): MM,
    ("layers.0.mixer.proj", "backward"): MM,  # dW only: the input needs no gradient
    ("layers.0.mixer.Func", "forward"): MM,  # the conv
    ("layers.0.mixer.Func", "backward"): 2 * MM,  # dh and dw: 1,024
    ("layers.0.mixer.Func~1", "forward"): SCAN,
    ("layers.0.mixer.Func~1", "backward"): SCAN_BACKWARD,
    ("layers.1.mixer.proj", "forward"): MM,
    ("layers.1.mixer.proj", "backward"): 2 * MM,  # dW and dX: 1,024
    ("layers.1.mixer.Func", "forward"): MM,
    ("layers.1.mixer.Func", "backward"): 2 * MM,
    ("layers.1.mixer.Func~1", "forward"): SCAN,
    ("layers.1.mixer.Func~1", "backward"): SCAN_BACKWARD,
    ("CrossEntropyLoss", "forward"): LOSS,
    ("CrossEntropyLoss", "backward"): LOSS_BACKWARD,
}


class Func(nn.Module):
    """A kernel-hub wrapper: a helper function made a module."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def conv(h, w):
    return h @ w


def scan(h):
    return (h @ h.transpose(0, 1)) @ h


class Mixer(nn.Module):
    def __init__(self, shared=None):
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.w = nn.Parameter(torch.randn(D, D) / D)
        self.shared = shared  # a plain list: the wrappers it holds are no submodules

    def forward(self, x):
        h = self.proj(x)
        if self.shared:  # wrappers made once and called by every mixer
            return self.shared[1](self.shared[0](h, self.w))
        return Func(scan)(Func(conv)(h, self.w))  # made anew in every call


class Block(nn.Module):
    def __init__(self, shared=None, checkpointed=False):
        super().__init__()
        self.mixer = Mixer(shared)
        self.checkpointed = checkpointed

    def forward(self, x):
        if self.checkpointed:
            return checkpoint(self.mixer, x, use_reentrant=False)
        return self.mixer(x)


class Net(nn.Module):
    def __init__(self, shared=None, checkpointed=False):
        super().__init__()
        self.layers = nn.ModuleList([Block(shared, checkpointed) for _ in range(2)])

    def forward(self, x, y):
        for layer in self.layers:
            x = layer(x)
        return nn.CrossEntropyLoss()(x, y)  # a loss module made in every forward


def _train(tmp_path, name, model, monkeypatch, collector="compiled", steps=3):
    monkeypatch.setenv(native.ENV, collector)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(T, D, generator=g), torch.randint(0, D, (T,), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Tracer(tmp_path / name, model=model):
        for _ in range(steps):
            model(x, y).backward()
            opt.step()
            opt.zero_grad()
    return reports.load(tmp_path / name), read_metadata(tmp_path / name)


def _per_module(df, step):
    rows = df[(df["step"] == step) & (df["module"] != "") & df["phase"].isin(["forward", "backward"])]
    table = rows.groupby(["module", "phase"], observed=True)["flops"].sum()
    return {key: int(v) for key, v in table.items()}


def _compiled_collector():
    if native.choose()[0] is None:
        pytest.skip("no compiled collector")


def test_helpers_built_in_a_layers_forward_are_its_own_every_step_on_both_paths(tmp_path, monkeypatch):
    _compiled_collector()
    frames = {}
    for collector in ("compiled", "python"):
        torch.manual_seed(0)
        frames[collector], meta = _train(tmp_path, collector, Net(), monkeypatch, collector)
        df = frames[collector]
        assert sorted(df["step"].unique()) == [0, 1, 2]
        for step in range(3):  # before: Func#1..#12 and CrossEntropyLoss#1..#3, a new name in every step
            assert _per_module(df, step) == PER_STEP, (collector, step)
        assert meta["storage_roles"]["external_parameter"] == []  # the wrappers hold no parameter
    compiled, python = frames["compiled"], frames["python"]
    for column in ("op", "module", "phase", "step", "flops"):
        assert compiled[column].tolist() == python[column].tolist(), column


def test_the_module_table_gives_each_mixer_its_own_scan(tmp_path, monkeypatch):
    torch.manual_seed(0)
    df, meta = _train(tmp_path, "tree", Net(), monkeypatch)
    df.attrs["runs"] = {"tree": meta}
    df["run"] = "tree"
    tree = reports.by_module(df).set_index("module")
    mixer = 3 * (2 * MM + 3 * MM + SCAN + SCAN_BACKWARD)  # proj 512 + 512, conv 512 + 1,024, scan 512 + 1,088: 3 steps
    assert tree.loc["layers.0.mixer", "subtree_flops"] == mixer == 3 * 4_160
    assert tree.loc["layers.0.mixer.Func~1", "parent"] == "layers.0.mixer"
    assert tree.loc["layers.0.mixer.Func~1", "subtree_flops"] == 3 * (SCAN + SCAN_BACKWARD)  # 3 · 1,600 = 4,800
    assert tree.loc["CrossEntropyLoss", "parent"] == "Net"
    assert tree.loc["CrossEntropyLoss", "subtree_flops"] == 3 * (LOSS + LOSS_BACKWARD)  # 3 · 296 = 888
    # the root holds every module's FLOPs and none of its own (before: 31% of them, the rest in 15 external roots)
    modules = df[df["module"] != ""]["flops"].sum()
    assert tree.loc["Net", "subtree_flops"] == modules == 3 * (2 * 4_160 + MM + 296)  # + layer 1's proj dX 512: 27,384


def test_wrappers_shared_by_every_mixer_are_named_by_each_caller(tmp_path, monkeypatch):
    torch.manual_seed(0)
    shared = [Func(conv), Func(scan)]  # made once (a kernel hub's cache), called by both mixers
    df, _ = _train(tmp_path, "shared", Net(shared), monkeypatch)
    for step in range(3):  # before: Func#1 and Func#2 for both layers
        assert _per_module(df, step) == PER_STEP


def test_a_checkpointed_mixer_re_runs_its_helpers_under_the_same_names(tmp_path, monkeypatch):
    torch.manual_seed(0)
    df, _ = _train(tmp_path, "checkpointed", Net(checkpointed=True), monkeypatch)
    recompute = df[df["recompute"] == 1]
    # each step re-runs both mixers' forwards in the backward: proj and conv, 512 each, and the scan's first
    # product, 256 (the re-run stops once it has made the last tensor the backward saved: the second product's
    # inputs)
    re_run = {"proj": MM, "Func": MM, "Func~1": T * D * T * 2}
    expected = {f"layers.{i}.mixer.{name}": 3 * flops for i in range(2) for name, flops in re_run.items()}
    assert recompute.groupby("module")["flops"].sum().to_dict() == expected
    for step in range(3):  # the backward is the same as without the checkpoint
        figures = _per_module(df[df["recompute"] == 0], step)
        assert figures == PER_STEP


def test_a_loss_module_made_each_step_outside_the_model_keeps_its_name(tmp_path):
    torch.manual_seed(0)
    model, teacher = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Tracer(tmp_path / "loop", model=model):
        for _ in range(3):
            with torch.no_grad():
                target = teacher(x)  # kept alive across steps: Linear#1 throughout
            loss = nn.MSELoss()(model(x), target) + nn.MSELoss()(model(x), y)  # two made anew in each step
            loss.backward()
            opt.step()
            opt.zero_grad()
    df = pd.read_parquet(tmp_path / "loop")
    loss = df[df["op"] == "aten.mse_loss.default"]
    # before: MSELoss#1 ... MSELoss#6, a new name for each
    assert loss.groupby("step")["module"].apply(list).tolist() == [["MSELoss#1", "MSELoss#2"]] * 3
    assert set(df.loc[df["op"] == "aten.mm.default", "module"]) == {"Linear#1", "Linear"}
    assert df[df["op"] == "aten.mse_loss.default"]["flops"].tolist() == [T * D] * 6  # 4·8 = 32 each


def test_a_helper_with_parameters_keeps_them_external(tmp_path):
    torch.manual_seed(0)
    head = nn.Linear(D, D, bias=False)  # made outside the model, called in its forward: no parameter of the model

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(D, D, bias=False)

        def forward(self, x):
            return head(self.proj(x)).sum()

    model = Model()
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    with Tracer(tmp_path / "head", model=model):
        model(x).backward()
    df, meta = pd.read_parquet(tmp_path / "head"), read_metadata(tmp_path / "head")
    mm = df[df["op"] == "aten.mm.default"]
    # forward: proj, then head, 512 each; backward: head's dX and dW, then proj's dW (x needs no gradient)
    assert mm[["module", "phase", "flops"]].values.tolist() == [
        ["proj", "forward", MM],
        ["Linear", "forward", MM],
        ["Linear", "backward", MM],
        ["Linear", "backward", MM],
        ["proj", "backward", MM],
    ]
    assert meta["params"]["total"] == D * D  # the model's 64 weights only (before: the head was Linear#1)
    external = set(meta["storage_roles"]["external_parameter"])
    assert len(external) == 1 and external <= set(mm.loc[mm["module"] == "Linear", "input_storage_ids"].explode())


class ScanBlock(nn.Module):
    """proj, then two scans made and called by a checkpointed function, outside every module it re-runs."""

    def __init__(self, reentrant):
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(lambda h: Func(scan)(Func(scan)(h)), self.proj(x), use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
def test_helpers_a_checkpointed_function_calls_are_re_run_under_their_forward_names(tmp_path, reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(ScanBlock(reentrant), ScanBlock(reentrant))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    with Tracer(tmp_path / "scan", model=model):
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    df = pd.read_parquet(tmp_path / "scan")
    rows = df[df["module"].str.contains("Func")]
    table = rows.groupby(["step", "module", "phase", "recompute"])["flops"].sum()
    # the second scan's re-run stops after its first product (256) without the reentrant variant, which re-runs all
    last = SCAN if reentrant else T * D * T * 2
    per_step = {}
    for i in range(2):  # before: the re-run named them Func~2 and Func~3 in their block (Func#5... at first)
        per_step |= {(f"{i}.Func", "forward", False): SCAN, (f"{i}.Func", "backward", False): SCAN_BACKWARD,
                     (f"{i}.Func", "backward", True): SCAN,
                     (f"{i}.Func~1", "forward", False): SCAN, (f"{i}.Func~1", "backward", False): SCAN_BACKWARD,
                     (f"{i}.Func~1", "backward", True): last}  # fmt: skip
    for step in range(2):
        assert {key[1:]: int(v) for key, v in table.items() if key[0] == step} == per_step


def test_a_compiled_helper_shares_its_name_with_the_module_it_wraps(tmp_path):
    torch._dynamo.reset()
    torch.manual_seed(0)
    compiled_scan = torch.compile(Func(scan), backend="eager")  # compiled once, called by both blocks: runs eagerly

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(D, D, bias=False)

        def forward(self, x):
            return compiled_scan(self.proj(x))

    model = nn.Sequential(Block(), Block())
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    with Tracer(tmp_path / "compiled", model=model) as tr:
        for _ in range(2):
            model(x).sum().backward()
            tr.step()
    df = pd.read_parquet(tmp_path / "compiled")
    assert set(df["module"]) == {"0.proj", "0.Func", "1.proj", "1.Func", ""}  # the wrapper and its module: one name
    scans = df[df["module"].str.endswith("Func")].groupby(["step", "module", "phase"])["flops"].sum()
    assert {key: int(v) for key, v in scans.items()} == {
        (step, f"{i}.Func", phase): flops
        for step in range(2)
        for i in range(2)
        for phase, flops in (("forward", SCAN), ("backward", SCAN_BACKWARD))
    }
    assert read_metadata(tmp_path / "compiled")["compiled_ran_eagerly"]


def test_the_boundaries_kept_hold_one_name_object_per_module_name(tmp_path, monkeypatch):
    """The module boundaries kept for the backward (Attribution._event_names, up to _EVENTS_KEPT) point at one str per
    name: a helper is named per call, and an equal name made anew at each call cost its own str at each boundary."""
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(T, D, generator=g), torch.randint(0, D, (T,), generator=g)
    with Tracer(tmp_path / "t", model=model) as tr:
        for _ in range(50):
            model(x, y).backward()
        names = tr._attr._event_names
        distinct = set(names)
        # the helper names: layers.{0,1}.mixer.Func and Func~1, CrossEntropyLoss, each a boundary in 50 steps
        assert {"layers.0.mixer.Func", "layers.1.mixer.Func~1", "CrossEntropyLoss"} <= distinct
        # 8 names ('', the 2 projs, the 4 helpers, CrossEntropyLoss): before, 204 str objects over these 50 steps,
        # about 4 new ones a step (the helpers' boundaries), none freed until _EVENTS_KEPT boundaries
        assert len(distinct) == 8 and len({id(n) for n in names}) == 8
