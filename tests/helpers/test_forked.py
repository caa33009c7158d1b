"""tests.helpers.forked runs the harm tests' child programs: each must end as a fresh `python` of the same program
ends, finalization included (a finalizer's exception or warning at the interpreter's end is what an -W error test
looks for)."""

import subprocess
import sys

import pytest

from tests.helpers import forked

PROGRAMS = {
    "exit status and atexit": "import atexit, sys; atexit.register(lambda: print('bye')); sys.exit(3)",
    "uncaught exception": "raise ValueError('boom')",
    "Ctrl-C": "raise KeyboardInterrupt",
    "finalizer at the end": (
        "import builtins, warnings\n"
        "class A:\n"
        "    def __del__(self):\n"
        "        warnings.warn('late', ResourceWarning)\n"
        "builtins.kept = A()\n"
    ),
}


@pytest.mark.parametrize("flags", [(), ("-W", "error")], ids=["plain", "-W error"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_forked_child_ends_as_a_fresh_python_does(name, flags):
    code = PROGRAMS[name]
    got = forked.run(code, flags=flags)
    fresh = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True)
    assert (got.returncode, got.stdout) == (fresh.returncode, fresh.stdout)
    assert got.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]  # the addresses in the lines above differ
