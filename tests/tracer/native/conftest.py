"""Fixtures of the compiled collector's tests."""

import shutil

import pytest

from tracer.native import loader as native


@pytest.fixture
def compiled(monkeypatch):
    """The compiled collector; fails where a C++ compiler exists but nothing was built (make builds it)."""
    monkeypatch.delenv(native.ENV, raising=False)
    module, facts = native.choose()
    if module is None:
        if shutil.which("c++") or shutil.which("g++"):
            pytest.fail(
                f"the compiled collector is not available ({facts['reason']}): run `python -m tracer.native.build_ext`"
            )
        pytest.skip(f"no C++ compiler, so no compiled collector ({facts['reason']})")
    return module
