"""torch.compile'd code under the tracer runs eagerly, whatever its fullgraph setting, and is counted.

Before: a block compiled with fullgraph=True raised under the tracer (the compiled hook: Dynamo compiled the
tracer's own Python, `Unsupported`; the Python path: "torch.compile with fullgraph=True found no compiled
frames"), and a compiled plain function ran eagerly with nothing said. The tracer now sets torch.compile's
stance to force_eager while it records (tracer.recording.compiled `EagerCompiled`): every compiled region runs its
eager code, is counted in the metadata (`compiled_regions_eager`) and the report, and runs its compiled graph
again after the trace, none compiled twice.
"""

import json

import pytest
import torch
import torch.nn.functional as F

import reports
from reports.output.cli import main
from tests.helpers import unwrapped
from tests.tracer.recording.test_compiled_after import (
    _counting,  # a backend that counts the graphs compiled and their runs
)
from tests.tracer.safety.test_fork_signals import run
from tracer import Meter, Tracer, read_metadata
from tracer.native import loader as native

pytestmark = pytest.mark.skipif(not hasattr(torch.compiler, "set_stance"), reason="torch.compile has no stance")

NOTE = "traced numerics can differ from compiled ones in the last bits"


class Net(torch.nn.Module):
    """Two blocks, each compiled with fullgraph=True as a training framework compiles them (backend None: eager)."""

    def __init__(self, backend):
        super().__init__()
        blocks = [torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)]
        if backend is not None:
            blocks = [torch.compile(block, fullgraph=True, backend=backend) for block in blocks]
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x):
        return self.blocks[1](torch.relu(self.blocks[0](x)))


def loss_fn(out, target):
    return F.mse_loss(out, target)


def _setup(backend):
    torch.manual_seed(0)
    net = Net(backend)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(4, 16), torch.randn(4, 16)

    def step(loss=lambda out: out.sum()):
        loss(net(x)).backward()
        opt.step()
        opt.zero_grad()

    return net, step, x, y


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_fullgraph_blocks_are_traced_eagerly_and_stay_compiled(tmp_path, monkeypatch, path):
    torch._dynamo.reset()
    monkeypatch.setenv(native.ENV, path)
    calls, backend = _counting()
    net, step, x, _ = _setup(backend)
    step()  # compiled here, before the trace: one graph per block
    assert calls == {"graphs": 2, "runs": 2}
    with Tracer(tmp_path / "t", model=net):
        step()
    assert calls == {"graphs": 2, "runs": 2}  # eager under the tracer: no graph run, none compiled
    step()
    assert calls == {"graphs": 2, "runs": 4}  # the graphs compiled before the trace, not new ones
    meta = read_metadata(tmp_path / "t")
    assert meta["collector"]["path"] == path
    assert meta["compiled_regions_eager"] == {"calls": 2, "names": {"Linear": 2}, "other_calls": 0}
    assert meta["compiled_ran_eagerly"] is True and meta["complete"] is True
    df = reports.load(tmp_path / "t")
    fwd = df[(df["phase"] == "forward") & (df["op"] == "aten.addmm.default")]
    assert dict(zip(fwd["module"], fwd["flops"])) == {
        "blocks.0": 4096,
        "blocks.1": 4096,
    }  # 2·4·16·32 = 2·4·32·16 = 4,096
    bwd = df[(df["phase"] == "backward") & (df["op"] == "aten.mm.default")]
    # blocks.1: dX 2·4·16·32 and dW 2·16·4·32, 4,096 each; blocks.0: dW 2·32·4·16 = 4,096 (x needs no gradient)
    assert bwd.groupby("module")["flops"].sum().to_dict() == {"blocks.0": 4096, "blocks.1": 8192}


def test_a_compiled_function_is_counted_and_reported(tmp_path, capsys):
    """An eager model with a compiled loss: before, nothing said that the loss ran eagerly."""
    torch._dynamo.reset()
    calls, backend = _counting()
    net, step, x, y = _setup(None)
    compiled_loss = torch.compile(loss_fn, backend=backend)
    untraced = compiled_loss(net(x), y)  # compiled here: the loss's graph
    assert calls == {"graphs": 1, "runs": 1}
    with Tracer(tmp_path / "t", model=net):
        traced = compiled_loss(net(x), y)
        step(lambda out: compiled_loss(out, y))
    assert calls == {"graphs": 1, "runs": 1}
    assert torch.allclose(traced, untraced)
    meta = read_metadata(tmp_path / "t")
    assert meta["compiled_regions_eager"] == {"calls": 2, "names": {"loss_fn": 2}, "other_calls": 0}
    assert meta["compiled_ran_eagerly"] is True
    df = reports.load(tmp_path / "t")
    assert df[df["op"] == "aten.mse_loss.default"]["flops"].tolist() == [
        64,
        64,
    ]  # a reduction: 1 per element, 4·16 = 64
    for engine in ("pandas", "sql"):
        assert main(["report", str(tmp_path / "t"), "--engine", engine]) == 0
        out = unwrapped(capsys.readouterr().out)  # the caveat, wrapped to the width
        assert (
            "- compiled_ran_eagerly: torch.compile'd code ran eagerly under the tracer (2 calls of compiled regions: "
            "loss_fn 2); the figures describe the eager program."
        ) in out and NOTE in out
        assert main(["report", str(tmp_path / "t"), "--json", "--engine", engine]) == 0
        found = json.loads(capsys.readouterr().out)
        assert found["compiled_ran_eagerly"] is True and NOTE in found["compiled_note"]
        assert found["compiled_regions_eager"] == {"calls": 2, "names": {"loss_fn": 2}, "other_calls": 0}


def _metered(tmp_path, net, step, compiled_loss, y):
    """Five steps under a Meter (warmup 1): step 0 untraced warm-up (compiles), step 1 traced, 2 to 4 metered."""
    meter = Meter(tmp_path / "m", model=net, warmup=1, tokens=4, peak_flops=1e12)
    try:
        for _ in range(5):
            step(lambda out: compiled_loss(out, y))
            meter.step()
    finally:
        meter.close()
    return meter


def test_the_meter_meters_fullgraph_steps_compiled(tmp_path):
    """The Meter traces one step and meters the others: those run the compiled graphs (the counting backend's
    runs), and a compiled function in the step (eager and so with more graph nodes in the traced step) does
    not make each untraced step a new signature to trace."""
    torch._dynamo.reset()
    calls, backend = _counting()
    net, step, x, y = _setup(backend)
    meter = _metered(tmp_path, net, step, torch.compile(loss_fn, backend=backend), y)
    assert meter.errors == 0
    assert calls == {"graphs": 3, "runs": 12}  # 3 graphs (2 blocks, the loss) run in 4 untraced steps: 3·4 = 12
    assert meter.table()["steps"]["traced"] == [False, True, False, False, False]
    assert read_metadata(tmp_path / "m")["compiled_regions_eager"]["calls"] == 3  # one traced step: 2 blocks + loss


def test_the_meter_traces_one_step_of_an_eager_model_with_a_compiled_loss(tmp_path):
    """The traced step runs the loss eagerly: more autograd nodes than an untraced step, which runs its graph.
    Before, the Meter took each untraced step for a new signature and traced the next one (steps 1, 3 traced)."""
    torch._dynamo.reset()
    calls, backend = _counting()
    net, step, x, y = _setup(None)
    meter = _metered(tmp_path, net, step, torch.compile(loss_fn, backend=backend), y)
    assert meter.errors == 0
    assert meter.table()["steps"]["traced"] == [False, True, False, False, False]
    assert calls == {"graphs": 1, "runs": 4}  # the loss's graph in the 4 untraced steps


def test_the_stance_found_at_entry_comes_back(tmp_path):
    """force_eager while the trace records, the program's own stance (here eager_on_recompile) after it."""
    from torch._dynamo import eval_frame

    net = torch.nn.Linear(4, 2)
    with torch.compiler.set_stance("eager_on_recompile"):
        with Tracer(tmp_path / "t", model=net):
            assert eval_frame._stance.stance == "force_eager"
            net(torch.randn(3, 4))
        assert eval_frame._stance.stance == "eager_on_recompile"
    assert eval_frame._stance.stance == "default"
    assert "compiled_regions_eager" not in read_metadata(tmp_path / "t")  # no compiled region ran


def test_a_compiled_flex_attention_traced_under_w_error_runs_on(tmp_path):
    """Run eagerly, flex_attention warned "called without torch.compile()" (once per process; untraced, Dynamo's
    tracing notes it shown and gives none): under `python -W error` the traced program raised there."""
    proc = run(
        tmp_path,
        f"""
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    from tracer import Tracer, read_metadata
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    attend = torch.compile(flex_attention, backend="eager")
    before = attend(q, k, v)
    with Tracer({str(tmp_path / "t")!r}):
        traced = attend(q, k, v)
    print(torch.equal(traced, before), read_metadata({str(tmp_path / "t")!r})["compiled_regions_eager"]["names"])
    """,
        "-W",
        "error",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "True {'flex_attention': 1}\n"
