"""A torch.compile'd module called while optrace's global module hooks are on: PyTorch warns at each such call
(torch/_dynamo/eval_frame.py, OptimizedModule.__call__), so under `python -W error` the traced program raised
where it ran untraced. optrace leaves its own hooks out of PyTorch's question while they are on
(tracer/safety.py `GlobalModuleHook`); tests/tracer/safety/test_werror_loops.py has the filter cases that led there."""

import warnings

import torch

from tests.tracer.safety.test_fork_signals import run
from tracer import Tracer
from tracer.safety import GlobalModuleHook


def test_a_compiled_module_in_a_trace_under_w_error_runs_on(tmp_path):
    """Before: UserWarning "Using `torch.compile(module)` when there are global hooks" raised at `m(x)`."""
    proc = run(
        tmp_path,
        f"""
    import warnings, torch
    from tracer import Tracer
    torch.manual_seed(0)
    m = torch.compile(torch.nn.Linear(4, 2), backend="eager")
    x = torch.randn(3, 4)
    before = list(warnings.filters)
    m(x)
    with Tracer({str(tmp_path / "t")!r}, model=m):
        m(x).sum().backward()
    assert warnings.filters == before, "a filter was left behind"
    m(x)  # after the trace, as before it
    print("after the with block")
    """,
        "-W",
        "error",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "after the with block\n" and "global hooks" not in proc.stderr


def test_the_meter_s_global_hooks_under_w_error(tmp_path):
    """The Meter's own global hooks: the root finder (no model=) during untraced warm-up steps, and the module
    count of a root call without grad (an evaluation) with a compiled module inside."""
    proc = run(
        tmp_path,
        f"""
    import warnings, torch
    from tracer.metering.meter import Meter
    torch.manual_seed(0)
    inner = torch.compile(torch.nn.Linear(4, 4), backend="eager")
    net = torch.nn.Sequential(inner, torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    before = list(warnings.filters)
    m = Meter({str(tmp_path / "m")!r}, warmup=1, tokens=3, peak_flops=1e9)
    for _ in range(4):
        net(x).sum().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            net(x)  # an evaluation inside the step: the meter counts its modules
        m.step()
    m.close()
    assert warnings.filters == before, "a filter was left behind"
    print("done", m.errors)
    """,
        "-W",
        "error",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done 0\n" and "global hooks" not in proc.stderr


def test_only_the_program_s_hooks_count_while_optrace_s_are_on():
    """PyTorch's question "is any global module hook set?" leaves optrace's hooks out while one is on, counts a
    hook of the program's, and is PyTorch's own again when the last of optrace's comes off."""
    module = torch.nn.modules.module
    original = module._has_any_global_hook
    first = GlobalModuleHook(module.register_module_forward_pre_hook, lambda *a: None)
    second = GlobalModuleHook(module.register_module_forward_hook, lambda *a: None, always_call=True)
    assert module._has_any_global_hook is not original and not module._has_any_global_hook()
    mine = module.register_module_forward_hook(lambda *a: None)
    assert module._has_any_global_hook()  # the program's own hook: warned about as untraced
    mine.remove()
    first.remove()
    assert module._has_any_global_hook is not original and not module._has_any_global_hook()
    second.remove()
    second.remove()  # twice: nothing more happens
    assert module._has_any_global_hook is original and not original()


def test_a_trace_leaves_the_filters_as_it_found_them(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    with Tracer(
        tmp_path / "warm", model=net
    ):  # the first trace imports what torch imports lazily (sympy adds a filter)
        net(torch.randn(2, 4)).sum().backward()
    before = list(warnings.filters)
    with Tracer(tmp_path / "t", model=net):
        assert warnings.filters == before  # no filter: the hooks are left out of PyTorch's question instead
        assert not torch.nn.modules.module._has_any_global_hook()
        net(torch.randn(2, 4)).sum().backward()
    assert warnings.filters == before
