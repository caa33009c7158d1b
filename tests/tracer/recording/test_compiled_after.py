"""A torch.compile'd module after a trace runs compiled again. Dynamo skips every frame it is called on while a
dispatch mode is active and marks the frame's code to be skipped for good, so a module traced once used to run
eagerly for the rest of the program: slower, and with eager numerics. The tracer now turns Dynamo off while it
records (tracer.recording.compiled `EagerCompiled`: torch.compile's stance force_eager), so Dynamo marks nothing; where a
torch has no stance it notes the codes Dynamo skips for its mode and gives them back at exit (`DynamoSkips`):
either way the graphs compiled before the trace run again, none is compiled twice."""

import torch

from tracer import Meter, Tracer, read_metadata


def _counting():
    calls = {"graphs": 0, "runs": 0}

    def backend(gm, example_inputs):
        calls["graphs"] += 1

        def run(*args):
            calls["runs"] += 1
            return gm.forward(*args)

        return run

    return calls, backend


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_a_module_compiled_before_the_trace_runs_its_graph_after_it(tmp_path):
    torch._dynamo.reset()
    calls, backend = _counting()
    compiled = torch.compile(_mlp(), backend=backend)
    x = torch.randn(4, 8)
    compiled(x)
    assert calls == {"graphs": 1, "runs": 1}
    with Tracer(tmp_path / "t", model=compiled):
        traced = compiled(x)  # eager under the mode: the trace records its ops
    assert calls == {"graphs": 1, "runs": 1}
    after = compiled(x)
    assert calls == {"graphs": 1, "runs": 2}  # the graph compiled before the trace, not a new one
    assert torch.equal(after, compiled(x)) and torch.allclose(traced, after)
    meta = read_metadata(tmp_path / "t")
    # torch.compile's stance is force_eager while tracing: Dynamo saw no frame, skipped none, so none is given back
    assert meta["compiled_ran_eagerly"] and "compiled_codes_given_back" not in meta
    assert meta["compiled_regions_eager"] == {"calls": 1, "names": {"Sequential": 1}, "other_calls": 0}


def test_a_module_first_called_in_the_trace_compiles_after_it(tmp_path):
    torch._dynamo.reset()
    calls, backend = _counting()
    compiled = torch.compile(_mlp(), backend=backend)
    x = torch.randn(4, 8)
    with Tracer(tmp_path / "t", model=compiled):
        compiled(x).sum().backward()
    assert calls == {"graphs": 0, "runs": 0}
    compiled(x)
    compiled(x)
    assert calls == {"graphs": 1, "runs": 2}  # compiled at its first call outside the trace, as untraced


def test_metered_steps_run_compiled_between_traced_ones(tmp_path):
    torch._dynamo.reset()
    calls, backend = _counting()
    model = _mlp()
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = Meter(tmp_path / "m", model=compiled, warmup=1, peak_flops=1e12)
    try:
        for _ in range(5):  # step 0 untraced warm-up (compiles), step 1 traced, 2 to 4 metered (its signature)
            compiled(torch.ones(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            meter.step()
    finally:
        meter.close()
    assert meter.errors == 0
    # the warm-up step and the three metered steps (step 2 was traced too while the compiled step's graph node count,
    # one per compiled graph, was in the signature: the traced step, run eagerly, made one per op)
    assert calls["graphs"] == 1 and calls["runs"] == 4
