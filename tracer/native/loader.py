"""Which path records an op: the compiled one (tracer/native/_collector.cpp, tracer/native/_dispatch.cpp) or Python.

Both append the same integers to the same buffers (tests/tracer/native/test_collector.py compares the
traces column by column). The compiled one is the dispatch hook itself for the common op
(tracer/native/_dispatch.cpp), and reads the tensors in one call for the ops it hands to
`Tracer._record` (tracer/native/_collector.cpp). It is used when
`tracer/native/_collector.so` (built at install time by tracer.native.build_ext) imports and was built
for the running torch, and `OPTRACE_COLLECTOR` is not `python`. The run metadata's
`collector` says which ran, and why the Python path did.
"""

import os

import torch

from tracer.errors import TraceError

ENV = "OPTRACE_COLLECTOR"  # "python" forces the Python path; "compiled" (or unset) uses the compiled one when it loads
CHOICES = ("compiled", "python")
FUNCTIONS = ("collect", "extend", "Dispatch", "dispatch_for")  # what tracer.recording.start calls on the module


def _import():
    """(the compiled module or None, why not); imported once per process."""
    try:
        from tracer.native import _collector
    except ImportError as exc:  # not built (no compiler at install time), or a broken build
        return None, f"not built ({exc})" if "_collector" in str(exc) else f"import failed ({exc})"
    if _collector.torch_version != torch.__version__:
        return None, f"built for torch {_collector.torch_version}, running {torch.__version__}"
    missing = [name for name in FUNCTIONS if not hasattr(_collector, name)]
    if missing:  # built from an older _collector.cpp: the same torch, fewer functions
        return None, f"built from an older source (no {', '.join(missing)}): run `python -m tracer.native.build_ext`"
    return _collector, None


_imported = None


def wanted():
    """The collector OPTRACE_COLLECTOR asks for ("compiled" when unset); TraceError for another value."""
    value = os.environ.get(ENV) or "compiled"
    if value not in CHOICES:
        raise TraceError(f"Tracer: {ENV} must be one of {', '.join(map(repr, CHOICES))} or unset, got {value!r}")
    return value


def choose():
    """(the compiled module or None, the run metadata's `collector`) for a Tracer being entered:
    {"path": "compiled"} or {"path": "python", "reason": why}. Reads OPTRACE_COLLECTOR each time."""
    global _imported
    if wanted() == "python":
        return None, {"path": "python", "reason": f"{ENV}=python"}
    if _imported is None:
        _imported = _import()
    module, reason = _imported
    return (module, {"path": "compiled"}) if module is not None else (None, {"path": "python", "reason": reason})
