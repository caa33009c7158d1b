"""Child programs run as forks of a Python that has imported torch: `run(code, ...)`.

A test that needs its program in a process of its own (a signal, a fork, `-W error`, a patched module, a kill) ran
it as a fresh `python`, and each paid torch's import and the first Tracer's imports (Dynamo, DTensor): about 2.5
CPU-s on the 2-core VM. Here one child Python per set of flags (the "parent", started on first use and kept for the
test process's life) imports those once, then forks one process per case, one at a time. Each case starts as a
fresh interpreter would have at its first line after `import torch` (no module of the checkout imported, no op
run, no thread started, the signal dispositions and `-W` options the parent was started with, its sys.path the
parent's: the checkout first, as PYTHONPATH put it), runs as
`python FLAGS -c CODE ARGS` or `python FLAGS SCRIPT ARGS` would, in its own directory and environment, with its own
stdout and stderr, and ends as Python ends: SystemExit's code, a traceback and status 1, an uncaught
KeyboardInterrupt ending it by SIGINT, or a signal's own action; it ends through the interpreter's own finalization
(the non-daemon threads joined, atexit's functions, the modules and their objects finalized: a finalizer's warning or
"Exception ignored" reaches its stderr as it would a fresh `python`'s), but for an uncaught KeyboardInterrupt, whose
exit steps are run by hand before the SIGINT (modules are not finalized). What a case does to its process
(handlers, filters, patches, forks) ends with it; the parent runs nothing between the forks.

Where there is no os.pidfd_open (not Linux) each runs as a fresh `python`, as before.
Not for a program whose test talks to it while it runs (a pipe, a signal from outside: subprocess.Popen), one that
checks which modules a fresh interpreter imports, or one that needs a fresh import of torch itself.
"""

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading

from tests.helpers import ROOT

_PARENT = r"""
import json, os, select, signal, sys
import torch  # noqa: F401  once, for every case; with what the first Tracer.__enter__ imports (Dynamo, DTensor)
import torch._dynamo, torch.distributed.tensor  # noqa: F401

def case(spec):
    import atexit, runpy, threading, traceback, types
    for fd, name in ((1, spec["stdout"]), (2, spec["stderr"])):
        handle = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(handle, fd)
        os.close(handle)
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    sys.argv = list(spec["argv"])
    status, interrupted = 0, False
    try:
        if spec["script"] is not None:  # `python SCRIPT`: its folder first on sys.path, run as __main__
            sys.path[0] = os.path.dirname(os.path.abspath(spec["script"]))
            runpy.run_path(spec["script"], run_name="__main__")
        else:  # `python -c CODE`: a __main__ module of its own
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(spec["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException as exc:  # as Python's PyErr_Print: sys.last_* set, sys.excepthook from the first frame
        tb = exc.__traceback__.tb_next  # from the program's first frame: not this one's, not runpy's
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_globals.get("__name__") == "runpy":
            tb = tb.tb_next
        exc.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        try:
            sys.excepthook(type(exc), exc, tb)
        except BaseException:
            traceback.print_exception(type(exc), exc, tb)
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = 1
    if interrupted:  # as Python ends on an uncaught KeyboardInterrupt: its exit steps, then by SIGINT itself
        threading._shutdown()  # the non-daemon threads joined, then atexit's functions
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status  # else the interpreter's own end (below): threads joined, atexit, modules and objects finalized

requests, answers = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the pipes of requests and answers are no case's stdin or stdout
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
pid = None
for line in requests:  # one case per line, one answer per line; the end of input ends the parent
    spec = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        requests.close()  # through their objects: the interpreter's end finalizes them
        answers.close()
        break
    ready = os.pidfd_open(pid)
    if select.select([ready], [], [], spec["timeout"])[0]:
        answer = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        answer = None
    os.close(ready)
    answers.write(json.dumps(answer) + "\n")
    answers.flush()
if pid == 0:  # a case: its program, then the end of this interpreter as `python` ends (Py_FinalizeEx), its status
    sys.exit(case(spec))
"""

_parents = {}  # flags -> the parent's Popen, for this test process
_lock = threading.Lock()


def _parent(flags):
    parent = _parents.get(flags)
    if parent is None or parent.poll() is not None:
        log = tempfile.TemporaryFile()
        parent = subprocess.Popen(
            [sys.executable, *flags, "-c", _PARENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        parent.log = log
        _parents[flags] = parent
    return parent


@atexit.register
def close():
    """End the parents (tests.conftest.pytest_unconfigure: a pytest-xdist worker may end without atexit's functions),
    each waited for, so that their CPU time is counted as this process's children's."""
    while _parents:
        _, parent = _parents.popitem()
        parent.stdin.close()  # its loop ends
        parent.wait(timeout=60)
        parent.stdout.close()
        parent.log.close()


def run(code=None, args=(), *, script=None, flags=(), cwd=None, env=None, timeout=120, check=False):
    """`python FLAGS -c CODE ARGS` (or `python FLAGS SCRIPT ARGS`) from `cwd` with environment `env` (os.environ's
    when None), as a fork of the parent for FLAGS (see above). Returns a subprocess.CompletedProcess as
    subprocess.run(..., capture_output=True, text=True) gives it (returncode -N: ended by signal N); raises
    subprocess.TimeoutExpired after `timeout` seconds (the case killed), CalledProcessError for `check` and a
    status other than 0."""
    program = [str(script)] if script is not None else ["-c", code]
    shown = [sys.executable, *flags, *program, *map(str, args)]
    if not hasattr(os, "pidfd_open"):  # not Linux: a fresh Python, as before
        return subprocess.run(shown, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=check)
    with tempfile.TemporaryDirectory(prefix="forked-") as outputs:
        spec = {
            "code": code,
            "script": None if script is None else str(script),
            "argv": [program[0], *map(str, args)],
            "cwd": str(os.getcwd() if cwd is None else cwd),
            "env": dict(os.environ if env is None else env),
            "stdout": os.path.join(outputs, "out"),
            "stderr": os.path.join(outputs, "err"),
            "timeout": timeout,
        }
        with _lock:
            parent = _parent(tuple(flags))
            parent.stdin.write(json.dumps(spec) + "\n")
            parent.stdin.flush()
            answer = parent.stdout.readline()
        if not answer:
            parent.log.seek(0)
            raise RuntimeError(f"the forking parent ended: {parent.log.read()[-4000:].decode(errors='replace')}")
        status = json.loads(answer)
        if status is None:
            raise subprocess.TimeoutExpired(shown, timeout)
        with open(spec["stdout"]) as out, open(spec["stderr"]) as err:
            done = subprocess.CompletedProcess(shown, status, out.read(), err.read())
    if check:
        done.check_returncode()
    return done
