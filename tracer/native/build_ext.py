"""Build the compiled collector and dispatch hook (tracer/native/_collector.cpp, tracer/native/_dispatch.cpp) into the package, at install time.

    python -m tracer.native.build_ext        # the Makefile runs this after installing optrace

Compiled with torch's own extension tooling (`torch.utils.cpp_extension.load`, g++ and
ninja) against the installed torch, in a temporary directory; the module is copied to
`tracer/native/_collector.so` beside this file. Nothing is downloaded, and nothing is written
at run time: `tracer.native.loader` only imports what this wrote. A failed build leaves no
module, and optrace runs its pure-Python path (the run metadata's `collector` says which
ran). Exit status 0 either way unless `--strict`: a machine without a compiler still
installs optrace. The build prints a line as each source is compiled (`Progress`); it takes
about a minute on a 2-core machine, several when the machine is loaded.

    python -m tracer.native.build_ext --strict   # CI: exit 1 when it cannot be built or does not load
    python -m tracer.native.build_ext --check    # build nothing: exit 1, with the reason, when it does not load
"""

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# and their headers, _collector.h and _dispatch.h
SOURCES = [os.path.join(HERE, name) for name in ("_collector.cpp", "_dispatch.cpp", "_where.cpp", "_native_flops.cpp")]
TARGET = os.path.join(HERE, "_collector.so")


class Progress:
    """While the build runs, a line as each source's object file appears in ninja's build directory
    (`  compiled _dispatch.cpp (2 of 4, 41 s)`), and one every `every` seconds without one, so that a build of a
    minute or more is not silent."""

    def __init__(self, directory, sources, start, out=None, poll=1.0, every=30.0):
        self.directory, self.start, self.out, self.poll, self.every = directory, start, out, poll, every
        self.waiting = [os.path.basename(source) for source in sources]
        self.total, self.last = len(self.waiting), start
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="optrace-build-progress", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        if exc[0] is None:
            self.tick(time.perf_counter())  # the sources compiled since the last poll

    def _run(self):
        while not self.done.wait(self.poll):
            self.tick(time.perf_counter())

    def tick(self, now):
        """Print what was compiled since the last tick (cpp_extension names each object file <stem>.o), or, after
        `every` seconds without a line, what is still running."""
        for name in list(self.waiting):
            if os.path.exists(os.path.join(self.directory, os.path.splitext(name)[0] + ".o")):
                self.waiting.remove(name)
                self._say(
                    f"  compiled {name} ({self.total - len(self.waiting)} of {self.total}, {now - self.start:.0f} s)",
                    now,
                )
        if now - self.last >= self.every:
            self._say(
                f"  {'compiling ' + ', '.join(self.waiting) if self.waiting else 'linking'} ({now - self.start:.0f} s)",
                now,
            )

    def _say(self, line, now):
        print(line, file=self.out or sys.stdout, flush=True)
        self.last = now


def build(verbose=False, start=None):
    """Compile the collector into TARGET, printing progress (Progress). Raises on failure."""
    import torch
    from torch.utils import cpp_extension

    start = time.perf_counter() if start is None else start
    with tempfile.TemporaryDirectory(prefix="optrace-build-") as tmp, Progress(tmp, SOURCES, start):
        module = cpp_extension.load(
            name="_collector",
            sources=SOURCES,
            build_directory=tmp,
            extra_cflags=["-O2", f"'-DOPTRACE_TORCH_VERSION=\"{torch.__version__}\"'"],
            verbose=verbose,
            is_python_module=True,
        )
        built = module.__file__
        partial = TARGET + ".tmp"
        shutil.copyfile(built, partial)
        os.replace(partial, TARGET)  # never a half-written module at TARGET


def loads():
    """None when TARGET imports and was built for the running torch from the current source (tracer.native.loader's own
    test, whatever OPTRACE_COLLECTOR says), else why not, in one line. A module found elsewhere (an editable
    install's finder falls back to the checkout it was installed from) is not TARGET."""
    from tracer.native import loader as native

    module, reason = native._import()
    if module is None:
        return " ".join(str(reason).split())
    found = getattr(module, "__file__", None)
    if found is None or os.path.realpath(found) != os.path.realpath(TARGET):
        return f"imported {found}, not {TARGET}"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when the build fails or the module it built does not load"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="build nothing: exit 1, with one line saying why, when tracer/native/_collector.so does not load "
        "(CI: the tests would run only the pure-Python path)",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    where = os.path.relpath(TARGET)
    if args.check:
        reason = loads()
        if reason is None:
            print(f"optrace: the compiled hook {where} loads")
            return 0
        print(
            f"optrace: the compiled hook {where} does not load ({reason}): without it optrace, and its tests, run "
            "only the pure-Python path; build it with `python -m tracer.native.build_ext --strict`",
            file=sys.stderr,
        )
        return 1
    start = time.perf_counter()
    print(
        f"optrace: building the compiled hook {where} from {len(SOURCES)} C++ sources "
        "(about a minute, several on a loaded machine)",
        flush=True,
    )
    try:
        if os.path.exists(TARGET):
            os.remove(TARGET)  # a module built for another torch must not stay behind a failed build
        build(args.verbose, start)
    except Exception as exc:  # the Python path still works: say so and go on
        detail = str(exc).strip()
        if "\n" in detail:  # the compiler's own output, then the line that says what happened
            print(detail[-2000:], file=sys.stderr)
        last = detail.splitlines()[-1] if detail else ""
        outcome = "exit 1 (--strict)" if args.strict else "optrace will run its pure-Python path"
        print(f"optrace: the compiled hook was not built ({type(exc).__name__}: {last}); {outcome}", file=sys.stderr)
        return 1 if args.strict else 0
    print(f"optrace: built the compiled hook {where} in {time.perf_counter() - start:.1f} s")
    if args.strict and (reason := loads()) is not None:
        print(
            f"optrace: the compiled hook {where} was built but does not load ({reason}); exit 1 (--strict)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
