"""tracer.native.build_ext: progress while the compiled hook builds; --strict and --check fail, in one line, where CI must."""

import io
import time
import types

import pytest

from tracer.native import build_ext
from tracer.native import loader as native


@pytest.fixture
def target(tmp_path, monkeypatch):
    """build_ext's TARGET in tmp_path: main() removes the module it is about to rebuild."""
    path = tmp_path / "_collector.so"
    monkeypatch.setattr(build_ext, "TARGET", str(path))
    return path


def failing_build(verbose=False, start=None):
    raise RuntimeError("Error building extension '_collector'\n/bin/sh: 1: c++: not found\nninja: build stopped")


@pytest.mark.parametrize(
    "argv, rc, outcome",
    [
        ([], 0, "optrace will run its pure-Python path"),  # make demo: a machine without a compiler still runs optrace
        (["--strict"], 1, "exit 1 (--strict)"),  # .ci/run
    ],
)
def test_a_failed_build_says_so_in_its_last_line(target, monkeypatch, capsys, argv, rc, outcome):
    monkeypatch.setattr(build_ext, "build", failing_build)
    assert build_ext.main(argv) == rc
    out, err = capsys.readouterr()
    assert out.startswith("optrace: building the compiled hook ") and "(about a minute" in out
    assert err.splitlines()[-1] == (
        f"optrace: the compiled hook was not built (RuntimeError: ninja: build stopped); {outcome}"
    )
    assert "c++: not found" in err  # the compiler's own words come before it


def test_strict_fails_when_the_module_built_does_not_load(target, monkeypatch, capsys):
    monkeypatch.setattr(build_ext, "build", lambda verbose=False, start=None: target.write_bytes(b"a module"))
    monkeypatch.setattr(native, "_import", lambda: (None, "built for torch 2.12.0, running 2.13.0"))
    assert build_ext.main([]) == 0
    assert build_ext.main(["--strict"]) == 1
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("was built but does not load (built for torch 2.12.0, running 2.13.0); exit 1 (--strict)")
    )


def test_check_builds_nothing_and_says_why_the_module_does_not_load(target, monkeypatch, capsys):
    target.write_bytes(b"a module")
    monkeypatch.setattr(build_ext, "build", failing_build)
    why = "not built (cannot import name '_collector'\n from 'tracer')"  # on two lines: the check prints one
    monkeypatch.setattr(native, "_import", lambda: (None, why))
    assert build_ext.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and target.read_bytes() == b"a module"
    assert err.startswith(
        f"optrace: the compiled hook {build_ext.os.path.relpath(target)} does not load (not built "
        "(cannot import name '_collector' from 'tracer')): without it optrace, and its tests, run "
        "only the pure-Python path"
    )
    module = types.ModuleType("_collector")
    module.__file__ = str(target)
    monkeypatch.setattr(native, "_import", lambda: (module, None))
    assert build_ext.main(["--check"]) == 0
    assert capsys.readouterr().out.endswith("_collector.so loads\n")
    module.__file__ = "/elsewhere/tracer/_collector.so"  # the checkout an editable install came from
    assert build_ext.main(["--check"]) == 1
    assert f"(imported /elsewhere/tracer/_collector.so, not {target})" in capsys.readouterr().err


def test_progress_prints_each_source_compiled_and_what_still_runs(tmp_path):
    out = io.StringIO()
    progress = build_ext.Progress(
        tmp_path, ["src/_collector.cpp", "src/_dispatch.cpp"], start=100.0, out=out, every=30.0
    )
    progress.tick(110.0)  # nothing compiled yet, 10 s without a line: silent
    (tmp_path / "_dispatch.o").write_bytes(b"")
    progress.tick(141.0)
    progress.tick(170.0)  # 29 s since the last line
    progress.tick(171.0)  # 30 s
    (tmp_path / "_collector.o").write_bytes(b"")
    progress.tick(180.0)
    progress.tick(212.0)
    assert out.getvalue().splitlines() == [
        "  compiled _dispatch.cpp (1 of 2, 41 s)",  # 141 - 100
        "  compiling _collector.cpp (71 s)",  # 171 - 100
        "  compiled _collector.cpp (2 of 2, 80 s)",
        "  linking (112 s)",  # 212 - 180 = 32 s without a line; 212 - 100 = 112
    ]


def test_progress_runs_beside_the_build_and_stops_with_it(tmp_path):
    out = io.StringIO()
    with build_ext.Progress(tmp_path, ["a.cpp"], start=0.0, out=out, poll=0.01) as progress:
        (tmp_path / "a.o").write_bytes(b"")
        deadline = time.monotonic() + 30  # the thread polls every 10 ms; a loaded machine may hold it back
        while progress.waiting and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not progress.thread.is_alive()
    assert out.getvalue().startswith("  compiled a.cpp (1 of 1, ")


def test_progress_names_the_sources_compiled_since_its_last_poll_when_the_build_ends(tmp_path):
    """The last object file and the link can come between two polls: the build printed 3 of its 4 sources."""
    out = io.StringIO()
    with build_ext.Progress(tmp_path, ["a.cpp"], start=time.perf_counter(), out=out, poll=3600):
        (tmp_path / "a.o").write_bytes(b"")
    assert out.getvalue() == "  compiled a.cpp (1 of 1, 0 s)\n"
