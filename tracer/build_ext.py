"""Build the compiled collector and dispatch hook (tracer/_collector.cpp, tracer/_dispatch.cpp) into the package, at install time.

    python -m tracer.build_ext        # the Makefile runs this after installing optrace

Compiled with torch's own extension tooling (`torch.utils.cpp_extension.load`, g++ and
ninja) against the installed torch, in a temporary directory; the module is copied to
`tracer/_collector.so` beside this file. Nothing is downloaded, and nothing is written
at run time: `tracer/native.py` only imports what this wrote. A failed build leaves no
module, and optrace runs its pure-Python path (the run metadata's `collector` says which
ran). Exit status 0 either way unless `--strict`: a machine without a compiler still
installs optrace.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# and their headers, _collector.h and _dispatch.h
SOURCES = [os.path.join(HERE, name) for name in ("_collector.cpp", "_dispatch.cpp", "_where.cpp", "_native_flops.cpp")]
TARGET = os.path.join(HERE, "_collector.so")


def build(verbose=False):
    """Compile the collector into TARGET; returns the seconds it took. Raises on failure."""
    import torch
    from torch.utils import cpp_extension

    with tempfile.TemporaryDirectory(prefix="optrace-build-") as tmp:
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when the build fails")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if os.path.exists(TARGET):
            os.remove(TARGET)  # a module built for another torch must not stay behind a failed build
        build(args.verbose)
    except Exception as exc:  # the Python path still works: say so and go on
        print(f"optrace: the compiled hook was not built ({type(exc).__name__}: {str(exc)[-2000:]}); "
              "optrace will run its pure-Python path", file=sys.stderr)
        return 1 if args.strict else 0
    print(f"optrace: built the compiled hook {os.path.relpath(TARGET)} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
