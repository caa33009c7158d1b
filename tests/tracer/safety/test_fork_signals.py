"""The traced program's process: forked children, DataLoader workers, Ctrl-C and warnings as errors.

Each case runs in a process of its own (a fork, a signal and `-W error` must not reach pytest's own
process: tests.helpers.forked) and checks what the program printed, its exit status and the trace on disk.
"""

import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from tests import helpers
from tests.helpers import DEFAULT_SIGINT, forked
from tracer import read_metadata
from tracer.schema import MARKER_NAME, marker_facts

ROOT = str(helpers.ROOT)


def run(tmp_path, code, *flags):
    """Run `code` as a script file (spawned workers import it) as `python FLAGS program.py` would, in a fork of a
    Python that imported torch (tests.helpers.forked), with Python's own SIGINT handler (conftest.DEFAULT_SIGINT)
    however the suite was started."""
    script = tmp_path / "program.py"
    script.write_text(DEFAULT_SIGINT + textwrap.dedent(code))
    return forked.run(script=script, flags=flags, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)


# ------------------------------------------------------------------ forked children record and write nothing
DATALOADER = """
    import sys, torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    from tracer import Tracer

    class Augmented(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            x = torch.full((4,), float(i)).flip(0)  # the worker's augmentation: 8 ops per item
            for _ in range(3):
                x = x * 2 + 1
            modes = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
            return x, int(modes == ["_InertMode"]) + 2 * int(modes == [])  # 1: inert copy (fork), 2: none

    def train(path, method):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        workers = {"multiprocessing_context": method, "num_workers": WORKERS} if method else {}
        loader = torch.utils.data.DataLoader(Augmented(), batch_size=8, **workers)
        data = loader if method else list(loader)  # no workers: the batches are made before the trace
        seen = set()
        with Tracer(path, model=model, flush_rows=4):  # parts of 4 rows: a worker would fill some
            for x, mode in data:
                seen.update(mode.tolist())
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
        return seen, model.weight.detach().clone()
"""


def _parent_rows(path):
    df = pd.read_parquet(path)
    assert df["seq"].tolist() == list(range(len(df)))  # every row of the parent, in order, nothing replaced
    plumbing = {  # the parent's own DataLoader work: the iterator's seed, rebuilding each batch from shared memory
        "aten.random_.default",
        "aten._local_scalar_dense.default",
        "aten.empty.memory_format",
        "aten.set_.source_Storage_storage_offset",
    }
    return df[~df["op"].isin(plumbing)].reset_index(drop=True), df


def test_dataloader_workers_forked_inside_the_trace_add_nothing_to_it(tmp_path):
    proc = run(
        tmp_path,
        DATALOADER
        + f"""
    WORKERS = 2
    if __name__ == "__main__":
        _, w0 = train({str(tmp_path / "ref")!r}, None)
        seen, w2 = train({str(tmp_path / "fork")!r}, "fork")
        print(sorted(seen), torch.equal(w0, w2))
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[1] True"  # every worker's tracer was inert; the same training
    ref, _ = _parent_rows(tmp_path / "ref")
    model_rows, df = _parent_rows(tmp_path / "fork")
    assert not {"aten.flip.default", "aten.full.default"} & set(df["op"])  # no worker op in the trace
    columns = ["step", "op", "phase", "module", "flops"]
    assert model_rows[columns].astype(str).values.tolist() == ref[columns].astype(str).values.tolist()
    assert len(ref) == 30  # 2 steps of 15 ops
    # per step: addmm 2*8*4*2 = 128, sum 8*2 = 16, dW mm 2*2*8*4 = 128, bias grad sum 16,
    # SGD _foreach_add_ 4*2 + 2 = 10: 128 + 16 + 128 + 16 + 10 = 298, in both runs (no worker FLOPs)
    assert df.groupby("step")["flops"].sum().tolist() == [298, 298]
    meta = read_metadata(tmp_path / "fork")
    assert (
        meta["complete"] is True and meta["parts"] == len(os.listdir(tmp_path / "fork")) - 1
    )  # every part the parent's


def test_spawned_and_forkserver_workers_run_no_optrace(tmp_path):
    proc = run(
        tmp_path,
        DATALOADER
        + f"""
    WORKERS = 1
    if __name__ == "__main__":
        _, w0 = train({str(tmp_path / "ref")!r}, None)
        for method in ("spawn", "forkserver"):
            seen, w = train({str(tmp_path)!r} + "/" + method, method)
            print(method, sorted(seen), torch.equal(w0, w))
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["spawn [2] True", "forkserver [2] True"]  # no mode at all in the worker
    ref, _ = _parent_rows(tmp_path / "ref")
    for method in ("spawn", "forkserver"):
        rows, _ = _parent_rows(tmp_path / method)
        assert rows[["op", "flops"]].astype(str).values.tolist() == ref[["op", "flops"]].astype(str).values.tolist()
        assert read_metadata(tmp_path / method)["complete"] is True


def test_a_forked_child_runs_its_ops_untraced_and_leaves_the_trace_and_lock_alone(tmp_path):
    path = tmp_path / "t"
    proc = run(
        tmp_path,
        f"""
    import json, os, sys, torch
    from tracer import Tracer

    path = {str(path)!r}
    with Tracer(path, flush_rows=2) as tr:
        a = torch.ones(2) + 1  # 2 rows: part 0
        before = sorted(os.listdir(path)), open(os.path.join(path, {MARKER_NAME!r}), "rb").read()
        for leave in ("through the with block", "os._exit"):
            pid = os.fork()
            if pid == 0:
                b = torch.ones(3)
                for _ in range(5):
                    b = b * 2  # 6 ops: 3 parts' worth, none written
                tr.step()
                if leave == "os._exit":
                    os._exit(int(b.tolist() != [32.0] * 3))
                sys.exit(int(b.tolist() != [32.0] * 3))  # SystemExit unwinds through Tracer.__exit__
            _, status = os.waitpid(pid, 0)
            after = sorted(os.listdir(path)), open(os.path.join(path, {MARKER_NAME!r}), "rb").read()
            print(leave, os.waitstatus_to_exitcode(status), after == before)
        c = a * 3  # the parent goes on tracing
    tr.set_step_time(0.5)  # after the block: one empty part
    print(c.tolist())
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["through the with block 0 True", "os._exit 0 True", "[6.0, 6.0]"]
    df = pd.read_parquet(path)
    assert df["op"].tolist() == ["aten.ones.default", "aten.add.Tensor", "aten.mul.Tensor"]  # the parent's 3 ops only
    assert df["seq"].tolist() == [0, 1, 2] and df["step"].tolist() == [0, 0, 0]  # the child's step() was its own
    assert sorted(os.listdir(path)) == [
        MARKER_NAME,
        "part-000000.parquet",
        "part-000001.parquet",
        "part-000002.parquet",
    ]
    meta = read_metadata(path)
    assert meta["complete"] is True and meta["rows"] == 3 and meta["step_time"]["median_s"] == 0.5
    assert marker_facts(path)["rows"] == 3


def test_a_forked_child_outliving_a_killed_writer_does_not_keep_its_lock(tmp_path):
    # the lock is the writer's open lock file; a child forked inside the trace closes its copy at the fork, so the
    # writer's death releases the lock while the child still runs, and the next writer is not refused
    path = tmp_path / "t"
    proc = run(
        tmp_path,
        f"""
    import os, signal, torch
    from tracer import Tracer

    path = {str(path)!r}
    r, w = os.pipe()
    writer = os.fork()
    if writer == 0:
        tr = Tracer(path)
        tr.__enter__()
        torch.ones(2)
        if os.fork() == 0:  # the child outlives the writer: it runs until this program ends (the pipe's end)
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)  # the writer is killed inside its with block
    os.close(r)
    os.waitpid(writer, 0)
    with Tracer(path):
        y = torch.ones(2) + 1
    print(y.tolist())
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[2.0, 2.0]\n"
    assert read_metadata(path)["complete"] is True and len(pd.read_parquet(path)) == 2  # ones, add


# ------------------------------------------------------------------ Ctrl-C is never swallowed
@pytest.mark.parametrize("prelude, out", [("", "went on\n"), (DEFAULT_SIGINT, "")])
def test_the_children_take_a_ctrl_c_however_the_suite_was_started(prelude, out):
    """A suite started with SIGINT ignored (`sh -c 'make test &'`; here `trap "" INT`, as such a shell does) passed
    that on to the programs of the Ctrl-C tests below, which then went on past their interrupt and failed; run()
    starts each with conftest.DEFAULT_SIGINT."""
    code = prelude + "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nprint('went on')\n"
    proc = subprocess.run(
        ["sh", "-c", 'trap "" INT; exec "$0" -c "$1"', sys.executable, code], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout == out
    # an uncaught KeyboardInterrupt ends Python by SIGINT itself, as a shell expects: status -2
    assert (proc.returncode, proc.stderr.splitlines()[-1:]) == ((-2, ["KeyboardInterrupt"]) if prelude else (0, []))


INTERRUPT_AT_FREE = """
    import _thread, operator, signal, weakref, torch
    from tracer import Tracer

    class Interrupt(weakref.ref):
        __getitem__ = _thread.interrupt_main  # a builtin: trips the SIGINT flag, runs no bytecode

    def interrupt_when_freed(storage):
        # weakref callbacks run newest first: registered after the tracer's, this one runs just
        # before it, so the interrupt is pending while the tracer's finaliser runs
        return Interrupt(storage, operator.itemgetter(signal.SIGINT))
"""


def test_ctrl_c_arriving_while_the_tracer_notes_a_free_reaches_the_program(tmp_path):
    proc = run(
        tmp_path,
        INTERRUPT_AT_FREE
        + f"""
    import gc

    def python_finaliser(ref):  # what the tracer's finaliser was: Python code
        pass

    for case in ("control", "storage", "module"):
        try:
            with Tracer({str(tmp_path)!r} + "/" + case):
                t = torch.ones(4)  # the tracer registers t's storage
                loss = torch.nn.L1Loss()
                loss(t, t)  # the tracer names the module, holding it weakly
                if case == "control":
                    keep = weakref.ref(t.untyped_storage(), python_finaliser)  # runs after the interrupt
                hook = interrupt_when_freed(loss if case == "module" else t.untyped_storage())
                del t, loss
                gc.collect()
                print("went on", flush=True)
                torch.zeros(2)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    # the control shows the hook delivers the interrupt inside a finaliser: a Python one swallows it;
    # the tracer's (a bound list.append, for storages and for module names) cannot
    assert proc.stdout.split("\n")[:3] == ["went on", "KeyboardInterrupt", "KeyboardInterrupt"]
    assert proc.stderr.count("Exception ignored in: <function python_finaliser") == 1
    assert proc.stderr.count("Exception ignored") == 1  # none from optrace
    for case in ("storage", "module"):
        assert read_metadata(tmp_path / case)["error"] == "KeyboardInterrupt: "
    df = pd.read_parquet(tmp_path / "control")  # the control traced on: the free is in the next row
    assert df["op"].tolist() == [
        "aten.ones.default",
        "aten.sub.Tensor",
        "aten.abs.default",
        "aten.mean.default",
        "aten.zeros.default",
    ]
    # t (16 bytes), l1_loss's sub and abs (16 each) and mean (4): 52 live; all four freed before zeros (8)
    assert [list(f) for f in df["freed_storage_ids"]] == [[], [], [], [], [2, 1, 3, 0]]
    assert df["live_bytes"].tolist() == [16, 32, 48, 52, 8]  # 52 - 16 - 16 - 4 - 16 + 8 = 8


def test_the_tracers_finaliser_is_c_code(tmp_path):
    import torch

    from tracer import Tracer

    with Tracer(tmp_path / "t"):
        t = torch.ones(2)
        callbacks = [ref.__callback__ for ref in __import__("weakref").getweakrefs(t.untyped_storage())]
    assert [type(cb).__name__ for cb in callbacks] == ["builtin_function_or_method"]  # list.append, no bytecode


# ------------------------------------------------------------------ warnings as errors never raise into the program
def test_a_failing_flop_formula_under_w_error(tmp_path):
    path = tmp_path / "t"
    proc = run(
        tmp_path,
        f"""
    import torch, tracer
    from tracer import Tracer

    torch.library.define("optrace_test::twice", "(Tensor x) -> Tensor")
    torch.library.impl("optrace_test::twice", "CPU")(lambda x: x * 2)

    @tracer.register_flop_formula(torch.ops.optrace_test.twice, kind="elementwise")
    def broken(x, out_shape=None):
        raise ValueError("formula bug")

    with Tracer({str(path)!r}):
        y = torch.ones(2)
        for _ in range(3):
            y = torch.ops.optrace_test.twice(y)
    print(y.tolist())
    """,
        "-W",
        "error",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[8.0, 8.0]\n"
    assert proc.stderr == (
        "UserWarning: optrace: could not record optrace_test.twice.default "
        "(ValueError: formula bug); the op ran normally\n"
    )  # once, on stderr
    meta = read_metadata(path)
    assert meta["record_errors"] == 3 and meta["complete"] is True
    assert pd.read_parquet(path)["op"].tolist() == ["aten.ones.default"]  # the 3 failed rows are missing, counted


def test_a_full_disk_under_w_error_lets_training_finish(tmp_path):
    path = tmp_path / "t"
    proc = run(
        tmp_path,
        f"""
    import errno, warnings, torch
    from tracer import Tracer
    from tracer.store import writer

    warnings.filterwarnings("error")
    real, calls = writer.write_table, []

    def full(table, file):  # the first part fits, then the disk is full
        calls.append(file)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(table, file)

    writer.write_table = full
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer({str(path)!r}, model=model, flush_rows=8):
        for step in range(6):
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    print("trained", step + 1, "steps")
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "trained 6 steps\n"
    lines = proc.stderr.splitlines()
    assert lines == [
        f"UserWarning: optrace: could not write {path}/part-000001.parquet (OSError: [Errno 28] No space left on device; "
        "the disk is full); its 8 rows are lost, the program goes on and the trace will say so",
        f"UserWarning: optrace: trace '{path}' is incomplete: 88 rows lost to write errors "
        "(first: part-000001.parquet: OSError: [Errno 28] No space left on device)",
    ]
    meta = read_metadata(
        path
    )  # 6 steps of 16 ops (ones, 4 forward, 9 backward, 2 SGD adds) = 96 rows; 96 - 8 = 88 lost
    assert meta["rows"] == 8 and meta["lost_rows"] == 88 and meta["complete"] is False  # rows: written
    assert len(pd.read_parquet(path)) == 8


def test_a_soft_file_lock_warning_under_w_error(tmp_path):
    # where the file system has no flock (ENOSYS), filelock decides: it warns and takes a soft lock; that warning
    # must not stop the Tracer under -W error
    path = tmp_path / "t"
    proc = run(
        tmp_path,
        f"""
    import errno, fcntl, torch
    from tracer import Tracer

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")
    fcntl.flock = no_flock

    with Tracer({str(path)!r}):
        y = torch.ones(2) + 1
    print(y.tolist())
    """,
        "-W",
        "error",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[2.0, 2.0]\n"
    assert proc.stderr == (
        f"UserWarning: optrace: trace {str(path)!r}: flock not supported on this filesystem, falling back to SoftFileLock\n"
    )


# ------------------------------------------------------------------ Ctrl-C while the tracer starts or closes
INTERRUPT_IN = """
    import signal, threading
    import torch
    from torch import nn
    from torch.nn.modules import module as _module
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    import tracer.recording.attribution as attribution
    import tracer.recording.hooks as hooks
    import tracer.recording.mode as mode
    from tracer import Tracer

    def interrupting(owner, name, times=1):
        original = getattr(owner, name)
        def wrapped(*args, **kwargs):
            for _ in range(times):
                signal.raise_signal(signal.SIGINT)  # a Ctrl-C lands inside optrace's set-up or clean-up
            return original(*args, **kwargs)
        setattr(owner, name, wrapped)
        return lambda: setattr(owner, name, original)

    def left():
        hooks = len(_module._global_forward_hooks) + len(_module._global_forward_pre_hooks)
        return mode.Tracer._active is not None, len(_get_current_dispatch_mode_stack()), hooks

    model = nn.Linear(4, 4)
"""


def test_a_ctrl_c_while_the_trace_closes_comes_after_it_is_closed(tmp_path):
    proc = run(
        tmp_path,
        INTERRUPT_IN
        + f"""
    restore = interrupting(hooks.Hooks, "_give_back_compiled", times=3)  # after the mode is left, before the rest
    try:
        with Tracer({str(tmp_path / "t")!r}, model=model):
            model(torch.ones(2, 4)).sum().backward()
        print("no interrupt")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    restore()
    print(left())
    with Tracer({str(tmp_path / "t")!r}):  # the path's lock was given back
        torch.ones(1) + 1
    print("traced again")
    """,
    )
    assert proc.returncode == 0, proc.stderr
    # three Ctrl-Cs are one KeyboardInterrupt, after the clean-up: no Tracer active, no mode, no hook left on
    # (before: Tracer._active stayed set, every later Tracer was refused, 2 global hooks stayed on)
    assert proc.stdout.split("\n")[:3] == ["KeyboardInterrupt", "(False, 0, 0)", "traced again"]


def test_a_ctrl_c_while_the_trace_starts_ends_it_before_the_block(tmp_path):
    proc = run(
        tmp_path,
        INTERRUPT_IN
        + f"""
    restore = interrupting(attribution.Attribution, "install")  # after the lock and the hooks, before the mode
    try:
        with Tracer({str(tmp_path / "t")!r}, model=model):
            print("the block ran")
        print("no interrupt")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    restore()
    print(left())
    for _ in range(20):
        torch.ones(1) + 1  # nothing records these (a mode left on the stack wrote them as parts)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["KeyboardInterrupt", "(False, 0, 0)"]
    assert read_metadata(tmp_path / "t")["error"] == "KeyboardInterrupt: "
    assert sorted(os.listdir(tmp_path / "t")) == ["_optrace.parquet", "part-000000.parquet"]


def test_a_tracer_left_on_another_thread_stops_recording_and_does_not_raise(tmp_path):
    proc = run(
        tmp_path,
        INTERRUPT_IN
        + f"""
    tracer = Tracer({str(tmp_path / "t")!r})
    tracer.__enter__()
    torch.ones(1) + 1
    done = []
    thread = threading.Thread(target=lambda: done.append(tracer.__exit__(None, None, None)))
    thread.start(); thread.join()
    for _ in range(50):
        torch.ones(1) + 1
    print(done, left())
    """,
    )
    assert proc.returncode == 0, proc.stderr
    # the mode stays on the entering thread's stack (a thread cannot pop another's), inert: 1 mode, no hook, no Tracer
    assert proc.stdout == "[False] (False, 1, 0)\n"
    assert "was left on another thread than the one that entered it" in proc.stderr
    assert pd.read_parquet(tmp_path / "t")["op"].tolist() == ["aten.ones.default", "aten.add.Tensor"]


def test_the_tracer_never_swaps_the_process_warning_filters():
    """The directory lock swapped the process's warning filters (catch_warnings) for a moment: a warning another
    thread raised as an error under filterwarnings("error") was shown instead (375,752 times of 3.5M while the main
    thread entered Tracers). No code of tracer/ may set or swap them: they are every thread's."""
    import ast

    swaps = {"catch_warnings", "simplefilter", "filterwarnings", "resetwarnings"}
    found = []
    for name in sorted(os.listdir(os.path.join(ROOT, "tracer"))):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(ROOT, "tracer", name)).read())
            found += [
                f"{name}:{node.lineno}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr in swaps
            ]
    assert not found
