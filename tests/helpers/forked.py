"""Child programs run as forks of one Python that has imported torch: `run_forked(cases)`.

A test that needs its program in a process of its own (a signal, a fork, `-W error`, a patched module) ran it as a
fresh `python`, and each paid torch's import (about 1.5 CPU-s on the 2-core VM). Here one child Python (the
"parent") imports torch once (and torch._dynamo and torch.distributed.tensor, which the first Tracer.__enter__
imports: 1.1 CPU-s more), then forks one process per case, one after another: each case starts as a fresh
interpreter would have at its first line after `import torch` (no other module of the checkout imported, no op run,
no thread started, the signal dispositions and `-W` options it was started with), runs as `python -c CODE ARGS` or `python SCRIPT ARGS`
would, in its own directory and environment, with its own stdout and stderr, and ends as Python ends: SystemExit's
code, a traceback and status 1, an uncaught KeyboardInterrupt ending it by SIGINT, or a signal's own action; the
interpreter's exit steps (the non-daemon threads joined, atexit's functions, stdout and stderr flushed) run before it
ends. What one case does to its process (handlers, filters, patches, forks) ends with it.

Not for a program that needs its own `__main__` file to be found again (a `spawn` or `forkserver` worker imports it)
or a fresh import of torch itself: those run `python` as before.
"""

import json
import os
import subprocess
import sys
import tempfile

_PARENT = r"""
import json, os, select, signal, sys, time
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
    except KeyboardInterrupt as exc:  # the traceback from the program's first frame, as Python shows it
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        interrupted = True
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        status = 1
    threading._shutdown()  # what Python does at its end: the non-daemon threads joined, then atexit's functions
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if interrupted:  # as Python ends on an uncaught KeyboardInterrupt: by SIGINT itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)

results = []
for spec in json.loads(sys.argv[1]):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            case(spec)
        finally:
            os._exit(70)  # not reached
    ready = os.pidfd_open(pid)
    if not select.select([ready], [], [], spec["timeout"])[0]:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        results.append(None)
    else:
        results.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    os.close(ready)
print(json.dumps(results))
"""


def run_forked(cases, flags=(), env=None, timeout=120):
    """Run `cases` as forks of one Python started as `python FLAGS` with environment `env` (os.environ when None).
    Each case is a dict: `code` (run as `python -c`) or `script` (a file, run as `python SCRIPT`), `args` (its argv
    after the program), `cwd`, `env` (its whole environment; the parent's when missing). Returns one
    subprocess.CompletedProcess per case, in order: returncode as subprocess gives it (-N: ended by signal N),
    stdout and stderr as text. A case still running after `timeout` seconds is killed and raises here."""
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="forked-") as outputs:
        specs = []
        for i, case in enumerate(cases):
            script = case.get("script")
            program = [str(script)] if script is not None else ["-c", case["code"]]
            specs.append(
                {
                    "code": case.get("code"),
                    "script": None if script is None else str(script),
                    "argv": [program[0] if script is not None else "-c", *map(str, case.get("args", ()))],
                    "cwd": str(case.get("cwd", os.getcwd())),
                    "env": dict(case.get("env", env)),
                    "stdout": os.path.join(outputs, f"{i}.out"),
                    "stderr": os.path.join(outputs, f"{i}.err"),
                    "timeout": timeout,
                    "shown": [sys.executable, *flags, *program, *map(str, case.get("args", ()))],
                }
            )
        done = subprocess.run(
            [sys.executable, *flags, "-c", _PARENT, json.dumps(specs)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout * len(specs) + 60,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        codes = json.loads(done.stdout.splitlines()[-1])
        procs = []
        for spec, code in zip(specs, codes):
            if code is None:
                raise subprocess.TimeoutExpired(spec["shown"], timeout)
            with open(spec["stdout"]) as out, open(spec["stderr"]) as err:
                procs.append(subprocess.CompletedProcess(spec["shown"], code, out.read(), err.read()))
        return procs
