"""SIGTERM (what torchrun, SLURM and Kubernetes send before they kill): the rows buffered since the last part are
written and the trace says which signal stopped it, then the signal does what it does untraced (tracer.recording.signals).
Each case runs a child that sends itself the signal, traced and untraced, and compares."""

import json
import os
import signal
import textwrap

import pytest
import torch

import reports
from tests import helpers
from tests.helpers import forked, unwrapped
from tracer import Tracer, read_metadata

ROOT = str(helpers.ROOT)

CHILD = textwrap.dedent("""
    import os, signal, sys, torch
    from tracer import Tracer
    traced, handler, path = sys.argv[1] == "traced", sys.argv[2], sys.argv[3]
    ran = []
    if handler == "exit3":
        def on_term(signum, frame):
            ran.append(signum)
            print("handler", len(ran), flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)

    def work():
        a = torch.zeros(1)
        for i in range(9):
            a = a + 1
            if i == 6:  # after zeros and 7 adds: 8 ops
                os.kill(os.getpid(), signal.SIGTERM)
        print("after the signal", flush=True)

    if traced:
        with Tracer(path, flush_rows=int(sys.argv[4])):
            work()
    else:
        work()
""")


def _child(tmp_path, code, *args, collector="compiled"):
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("OPTRACE_COLLECTOR", None)
    if collector == "python":
        env["OPTRACE_COLLECTOR"] = "python"
    return forked.run(code, args, cwd=tmp_path, env=env, timeout=120)  # a fork of a Python that imported torch


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """CHILD run once per (traced, handler, collector) in this module, whichever tests ask: (the process, the trace's
    path). A test only reads them; sharing them saves 6 of 13 children."""
    done = {}

    def run(traced, handler, collector="compiled"):
        key = (traced, handler, collector)
        if key not in done:
            root = tmp_path_factory.mktemp("sigterm")
            path = root / ("t" if traced else "u")
            flush = [16384] if traced else []
            done[key] = (_child(root, CHILD, traced, handler, path, *flush, collector=collector), path)
        return done[key]

    return run


@pytest.mark.parametrize("collector", ["compiled", "python"])
def test_sigterm_without_a_handler_writes_the_buffered_rows_then_ends_the_process(runs, collector):
    untraced, _ = runs("untraced", "none")
    assert untraced.returncode == -signal.SIGTERM  # the default action: ended by the signal
    traced, path = runs("traced", "none", collector)
    assert traced.returncode == untraced.returncode == -15 and "after the signal" not in traced.stdout
    assert traced.stderr == ""
    with pytest.warns(UserWarning, match=r"trace is incomplete \(stopped by SIGTERM\); reporting the 8 rows it has"):
        df = reports.load(path)
    assert df["seq"].tolist() == list(range(8))  # zeros + 7 adds, all buffered (flush_rows 16,384): before, 0 parts
    meta = read_metadata(path)
    assert meta["signal"] == "SIGTERM" and not meta.get("complete")


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_the_report_names_the_signal(runs, capsys, engine):
    from reports.output.cli import main

    (_, none), (_, exit3) = runs("traced", "none"), runs("traced", "exit3")
    assert main(["report", str(none), "--engine", engine]) == 0
    out, err = capsys.readouterr()
    assert "(8 ops, 1 step(s), " in out and ", INCOMPLETE (stopped by SIGTERM))" in out.splitlines()[0]
    assert "- incomplete: INCOMPLETE (stopped by SIGTERM): figures cover the rows it has" in unwrapped(out)
    assert f"note: {none}: trace is incomplete (stopped by SIGTERM); reporting the 8 rows it has" in err
    assert main(["report", str(exit3), "--engine", engine]) == 0
    out, _ = capsys.readouterr()
    said = "- incomplete: INCOMPLETE: the traced code raised SystemExit: 3 after SIGTERM; figures cover the rows it has"
    assert said in unwrapped(out)
    assert main(["report", str(none), "--engine", engine, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["complete"] is False and found["signal"] == "SIGTERM"


def test_sigterm_after_some_parts_keeps_those_and_the_buffered_rows(tmp_path):
    path = tmp_path / "t"
    traced = _child(tmp_path, CHILD, "traced", "none", path, 3)
    assert traced.returncode == -15
    with pytest.warns(UserWarning, match="stopped by SIGTERM"):
        assert reports.load(path)["seq"].tolist() == list(range(8))  # parts of 3, 3, then the 2 buffered


@pytest.mark.parametrize("collector", ["compiled", "python"])
def test_the_programs_own_handler_runs_once_after_the_rows_are_written(runs, collector):
    untraced, _ = runs("untraced", "exit3")
    traced, path = runs("traced", "exit3", collector)
    assert traced.returncode == untraced.returncode == 3
    assert traced.stdout == untraced.stdout == "handler 1\n"
    meta = read_metadata(path)
    assert meta["signal"] == "SIGTERM" and meta["complete"] is False and meta["error"] == "SystemExit: 3"
    with pytest.warns(UserWarning, match="stopped by SIGTERM"):
        assert len(reports.load(path)) == 8


def test_a_sigterm_inside_a_flop_formula_is_held_until_the_row_is_whole(tmp_path):
    code = textwrap.dedent("""
        import os, signal, sys, torch, tracer
        lib = torch.library.Library("optrace_sigterm_test", "DEF")
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")

        @tracer.register_flop_formula(torch.ops.optrace_sigterm_test.twice, kind="elementwise")
        def formula(x_shape, out_shape=None, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # mid-row: in the tracer's _record
            return 5

        with tracer.Tracer(sys.argv[1]):
            a = torch.ones(2) + 1
            torch.ops.optrace_sigterm_test.twice(a)
            print("after the signal", flush=True)
    """)
    path = tmp_path / "t"
    proc = _child(tmp_path, code, path)
    assert proc.returncode == -15 and proc.stdout == ""
    with pytest.warns(UserWarning, match="stopped by SIGTERM"):
        df = reports.load(path)
    assert df["op"].tolist() == ["aten.ones.default", "aten.add.Tensor", "optrace_sigterm_test.twice.default"]
    assert df["flops"].iloc[2] == 5  # the row whose formula sent the signal, whole


def test_the_previous_handler_comes_back_at_exit(tmp_path):
    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with Tracer(tmp_path / "a"):
            assert signal.getsignal(signal.SIGTERM) is not mine  # optrace's, which hands on to mine
            torch.ones(1)
        assert signal.getsignal(signal.SIGTERM) is mine
        other = lambda signum, frame: None  # noqa: E731
        with Tracer(tmp_path / "b"):
            signal.signal(signal.SIGTERM, other)  # the program's own, set inside the block
        assert signal.getsignal(signal.SIGTERM) is other  # stays
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with Tracer(tmp_path / "c"):
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # ignored: left alone
    finally:
        signal.signal(signal.SIGTERM, before)
    assert read_metadata(tmp_path / "a")["complete"] is True and "signal" not in read_metadata(tmp_path / "a")


METERED = textwrap.dedent("""
    import os, signal, sys, torch
    from torch import nn
    from tracer.metering.meter import Meter
    torch.manual_seed(0)
    net = nn.Linear(4, 2, bias=False)
    meter = Meter(sys.argv[1], model=net, peak_flops=1e12)
    for i in range(int(sys.argv[2])):
        net(torch.ones(1, 4)).sum().backward()
        net.zero_grad()
        meter.step()
    os.kill(os.getpid(), getattr(signal, sys.argv[3]))
""")


@pytest.mark.parametrize("sig, kept", [("SIGKILL", 6), ("SIGTERM", 11)])
def test_a_metered_run_killed_early_keeps_at_least_half_its_steps(tmp_path, sig, kept):
    path = tmp_path / "m"
    proc = _child(tmp_path, METERED, path, 11, sig)
    assert proc.returncode == -getattr(signal, sig)
    steps = read_metadata(path)["meter"]["steps"]["step"]
    # 11 steps (0 and 1 traced): written at the traced steps, then when 3 and 6 steps were in the table (the next at
    # 12); SIGKILL keeps 6 >= 11 / 2 (before: 1, the table written with step 1's trace); SIGTERM writes all 11
    assert steps == list(range(kept))
    assert json.loads(json.dumps(read_metadata(path).get("signal"))) == ("SIGTERM" if sig == "SIGTERM" else None)


def test_a_forked_child_ends_by_sigterm_as_untraced_and_writes_nothing(tmp_path):
    code = textwrap.dedent("""
        import os, signal, sys, torch
        from tracer import Tracer
        with Tracer(sys.argv[1]):
            a = torch.ones(2) + 1
            pid = os.fork()
            if pid == 0:  # the child: its copy of the tracer is inert
                b = a * 3
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(0)  # not reached
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status), flush=True)
            a - 1
    """)
    path = tmp_path / "t"
    proc = _child(tmp_path, code, path)
    assert proc.returncode == 0 and proc.stdout == "-15\n"  # the child ended by the signal, as untraced
    meta = read_metadata(path)
    assert meta["complete"] is True and "signal" not in meta
    assert reports.load(path)["op"].tolist() == ["aten.ones.default", "aten.add.Tensor", "aten.sub.Tensor"]


def test_no_handler_from_another_thread_and_a_row_held_on_another_thread_is_acted_on_in_the_main_one(tmp_path):
    import threading
    import time

    seen = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:

        def traced_elsewhere():
            with Tracer(tmp_path / "thread"):
                seen.append(signal.getsignal(signal.SIGTERM) is before_thread)

        before_thread = signal.getsignal(signal.SIGTERM)
        worker = threading.Thread(target=traced_elsewhere)
        worker.start()
        worker.join()
        assert seen == [True]  # entered on a thread that cannot set signals: nothing installed
        seen.clear()
        with Tracer(tmp_path / "t") as tr:
            torch.ones(2) + 1
            tr._term.pending = (signal.SIGTERM, None)  # as if held while an engine thread made a row (recording())
            tr._term_pending = True
            worker = threading.Thread(target=tr._term.due, args=(None,))
            worker.start()
            worker.join()  # due() on that thread hands the signal to the main thread (_thread.interrupt_main)
            for _ in range(100):  # the main thread runs the handler at its next check
                if seen:
                    break
                time.sleep(0.01)
            assert seen == [signal.SIGTERM]  # the program's handler, once, on the main thread
            assert tr._term.pending is None
    finally:
        signal.signal(signal.SIGTERM, before)
    meta = read_metadata(tmp_path / "t")
    assert meta["signal"] == "SIGTERM" and meta["complete"] is False
    with pytest.warns(UserWarning, match="stopped by SIGTERM"):
        assert len(reports.load(tmp_path / "t")) == 2  # ones, add: written at the signal, nothing lost at close


def test_a_sigterm_while_a_pause_takes_the_hooks_off_waits_for_the_pause(tmp_path):
    class Stop(Exception):
        pass

    def on_term(signum, frame):
        raise Stop

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        with Tracer(tmp_path / "t") as tr:
            torch.ones(2) + 1
            remove = tr._attr.remove

            def remove_with_a_signal():  # the signal comes while tracer.recording.hooks.Hooks.remove takes the hooks off
                tr._attr.remove = remove
                os.kill(os.getpid(), signal.SIGTERM)
                remove()

            tr._attr.remove = remove_with_a_signal
            with pytest.raises(Stop):
                tr._pause()  # as a Meter pauses after its traced step
            # the pause finished before the program's handler ran: compiled code runs compiled again (before: the
            # handler's exception left _pause after the module hooks, with torch.compile's stance still force_eager)
            assert tr._eager.active is False
            assert tr._mode not in torch.utils._python_dispatch._get_current_dispatch_mode_stack()
            tr._resume()
            torch.ones(2) * 3
    finally:
        signal.signal(signal.SIGTERM, before)
    with pytest.warns(UserWarning, match="stopped by SIGTERM"):
        # ones, add (written at the signal); ones, mul after the resume: 4 rows
        assert reports.load(tmp_path / "t")["op"].tolist() == [
            "aten.ones.default",
            "aten.add.Tensor",
            "aten.ones.default",
            "aten.mul.Tensor",
        ]
