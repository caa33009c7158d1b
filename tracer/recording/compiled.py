"""torch.compile under the tracer: compiled code runs eagerly, is counted, and modules are named as the original.

While a trace is on, `EagerCompiled` sets torch.compile's stance to "force_eager": every compiled region (a
module, a function, a method, `fullgraph=True` or not) calls its original Python code with Dynamo off, so the trace
records the eager program's ops, not the compiled kernels, and counts the regions that ran so
(`compiled_regions_eager` in the metadata; `compiled_ran_eagerly` says that any did). FLOPs are the eager
program's; what a compiler's fusion changes is bytes and time. The graphs compiled before the trace are left in
Dynamo's caches, and none is compiled during it: after the trace each region runs, or compiles at its first call,
as untraced. Modules are named by their path in the original model: the wrapper's `_orig_mod` level is dropped
(`blocks.0._orig_mod.attn` is `blocks.0.attn`). A module compiled in place (`model.compile()`: the module keeps its
class and sets `_compiled_call_impl`) runs eagerly too, under its own name; `compiled_in_place` finds it.
Where torch has no stance (before 2.6), Dynamo itself skips every frame while a dispatch mode that is not one
of PyTorch's own is active (compiled code then runs eagerly uncounted, `fullgraph=True` may refuse to run), and
`DynamoSkips` gives those frames back to Dynamo after the trace. An optimizer step compiled there and run
before the trace (`opt.step = torch.compile(opt.step)`) runs its compiled kernels, which bypass the dispatcher
(measured with inductor on torch 2.13 before the tracer set the stance): tracer.recording.optimizer_hooks counts such steps
(`untraced_optimizer_steps`).
"""

import sys
import types

_WRAPPER = "OptimizedModule"
_LEVEL = "_orig_mod"
NAMES_KEPT = 32  # compiled regions named in `compiled_regions_eager`; the calls of any more are counted together
_CALLER = "compile_wrapper"  # the function of torch._dynamo.eval_frame that enters a compiled region
# torch's warnings "called without torch.compile()", given once per process unless Dynamo is tracing: (module, function)
_WARN_ONCE = (("torch.nn.attention.flex_attention", "_warn_once"),)


def compiled_original(module):
    """The module a torch.compile wrapper wraps, or None when `module` is not one."""
    if type(module).__name__ != _WRAPPER:
        return None
    return getattr(module, _LEVEL, None)


def unwrap(module):
    """The original module behind any number of torch.compile wrappers."""
    while compiled_original(module) is not None:
        module = compiled_original(module)
    return module


def strip_compiled(name):
    """A dotted module path without the wrappers' `_orig_mod` levels."""
    if _LEVEL not in name:  # the common name, returned as it is (no split and join per parameter at entry)
        return name
    return ".".join(part for part in name.split(".") if part != _LEVEL)


def compiled_in_place(module):
    """Whether `module.compile()` was called: its calls go through a compiled `_call_impl`."""
    return getattr(module, "_compiled_call_impl", None) is not None


class DynamoSkips:
    """Gives compiled code back to torch.compile after a trace.

    Dynamo, called on a compiled frame while a dispatch mode is active, skips it and marks its code to be
    skipped for good (torch/_dynamo/types.py `ConvertFrameReturn`, `apply_to_code`). Without this a module
    compiled before or during the trace ran eagerly for the rest of the program. While installed, a
    stand-in for Dynamo's `CatchErrorsWrapper._handle_skip` notes the codes skipped for a dispatch mode;
    `remove()` takes it off and sets those codes back to Dynamo's default strategy: the graphs compiled
    for them are kept, nothing is compiled again (tests/tracer/recording/test_compiled_warning.py). Only intercepted
    codes are noted, and Dynamo intercepts only codes whose strategy was its default. Where a torch lacks
    these hooks, nothing is patched, and the module stays eager after the trace as before."""

    def __init__(self):
        self._codes = {}  # id(code) -> code, skipped for the dispatch mode while installed
        self._patched = None  # (class, Dynamo's method, the stand-in)

    def install(self):
        if self._patched is not None:
            return
        try:
            from torch._dynamo.convert_frame import CatchErrorsWrapper
        except Exception:  # a torch without Dynamo, or with another layout
            return
        original = getattr(CatchErrorsWrapper, "_handle_skip", None)
        if original is None:
            return
        codes = self._codes

        def _handle_skip(wrapper, result, frame):
            try:
                if "dispatch mode" in (getattr(result, "skip_reason", None) or ""):
                    codes[id(frame.f_code)] = frame.f_code
            except Exception:  # never in Dynamo's way
                pass
            return original(wrapper, result, frame)

        CatchErrorsWrapper._handle_skip = _handle_skip
        self._patched = (CatchErrorsWrapper, original, _handle_skip)

    def remove(self):
        """Take the stand-in off (unless something replaced it since) and give the noted codes back to
        Dynamo's default strategy. Returns how many codes were given back."""
        if self._patched is not None:
            cls, original, ours = self._patched
            if cls.__dict__.get("_handle_skip") is ours:
                cls._handle_skip = original
            self._patched = None
        codes, self._codes = list(self._codes.values()), {}
        if not codes:
            return 0
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        for code in codes:
            set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.DEFAULT, _FrameAction.DEFAULT))
        return len(codes)


def _innermost(fn):
    """What a compiled callable wraps: through functools.wraps chains (torch._dynamo's wrap_inline, the optimizer's
    profiling wrapper)."""
    for _ in range(8):
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    return fn


def region_name(fn):
    """What a compiled region is called in the metadata: a module's class name, else the function's qualified
    name (`loss_fn`, `SGD.step`, `flex_attention`)."""
    import torch

    fn = _innermost(fn)
    owner = getattr(fn, "__self__", None)
    for candidate in (fn, owner):
        if isinstance(candidate, torch.nn.Module):
            return type(unwrap(candidate)).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class EagerCompiled:
    """Runs every torch.compile'd region eagerly while installed, and counts the regions entered.

    Under a dispatch mode, Dynamo skips each frame a compiled region calls, which `fullgraph=True` turns into an
    error ("found no compiled frames"); and a Python frame the tracer runs inside an op (the compiled hook calls
    back into Python) is compiled by Dynamo, which fails on the tracer's own code ("Unsupported"). Installed, it
    sets `torch.compiler.set_stance("force_eager")` (torch >= 2.6): a compiled region then calls its original
    code with Dynamo off, nothing is compiled, skipped or marked, and Dynamo's caches stay as they were. A
    stand-in for `torch._dynamo.eval_frame._callback_from_stance`, which each compiled region calls on entry,
    counts the entries by `region_name` (`calls`, `names`: at most NAMES_KEPT, `other_calls`), but for torch's
    own helpers (`_torch_internal`: flex_attention called eagerly compiles one with backend "eager"). Inside a compiled
    region torch's own "called without torch.compile()" warning (flex_attention's `_warn_once`) is noted as
    shown and not given, as Dynamo's tracing of it does untraced: under `python -W error` it raised into the
    program. `remove()` puts back the stance found at `install()` and the functions replaced (unless something
    replaced them since).
    The stance is the process's: while installed, compiled code on every thread runs eagerly. Where torch
    lacks the stance nothing is installed (`active` stays False) and nothing is counted."""

    def __init__(self):
        self.calls = 0  # compiled regions entered while installed, all names
        self.names = {}  # region name -> calls, NAMES_KEPT names at most
        self.other_calls = 0  # calls of the regions past NAMES_KEPT names
        self.active = False
        self._stance = None  # torch.compiler.set_stance's object: it holds the stance to put back
        self._patched = []  # (module, name, torch's function, the stand-in)

    def install(self):
        if self.active:
            return
        try:
            import torch
            from torch._dynamo import eval_frame
        except Exception:  # a torch without Dynamo, or with another layout
            return
        set_stance = getattr(torch.compiler, "set_stance", None)
        original = getattr(eval_frame, "_callback_from_stance", None)
        if set_stance is None or original is None:
            return
        self._stance = set_stance("force_eager")  # set at once; raises inside a compiled region
        self.active = True

        def _callback_from_stance(callback):
            chosen = original(callback)
            if chosen is None and callback not in (None, False):  # a region Dynamo would have run, run eagerly
                try:
                    caller = sys._getframe(1)
                    fn = caller.f_locals.get("fn") if caller.f_code.co_name == _CALLER else None
                    if fn is not None and not _torch_internal(fn):
                        self._count(region_name(fn))
                except Exception:  # never in Dynamo's way
                    pass
            return chosen

        self._patch(eval_frame, "_callback_from_stance", _callback_from_stance)
        for module_name, name in _WARN_ONCE:
            module = sys.modules.get(module_name)  # imported already wherever a compiled region calls it
            warn_once = getattr(module, name, None)
            if warn_once is not None:
                self._patch(module, name, _quiet_in_regions(warn_once, getattr(module, "_WARNINGS_SHOWN", None)))

    def _patch(self, module, name, ours):
        self._patched.append((module, name, getattr(module, name), ours))
        setattr(module, name, ours)

    def _count(self, name):
        self.calls += 1
        if name in self.names or len(self.names) < NAMES_KEPT:
            self.names[name] = self.names.get(name, 0) + 1
        else:
            self.other_calls += 1

    def remove(self):
        patched, self._patched = self._patched, []
        for module, name, original, ours in reversed(patched):
            if module.__dict__.get(name) is ours:
                setattr(module, name, original)
        stance, self._stance, self.active = self._stance, None, False
        if stance is not None:
            from torch._dynamo import eval_frame

            current, ours = getattr(eval_frame, "_stance", None), getattr(stance, "stance", None)
            if current is None or ours is None or current is ours:  # still ours: the stance before it comes back
                stance.__exit__(None, None, None)

    def facts(self):
        """`compiled_regions_eager` of the metadata, or None when no compiled region ran."""
        if not self.calls:
            return None
        return {"calls": self.calls, "names": dict(self.names), "other_calls": self.other_calls}


def _torch_internal(fn):
    """Whether `fn` is a function torch defines inside one of its own and compiles as its way of running an eager
    call (flex_attention's `_flex_attention_hop_wrapper`), not a region the program compiled."""
    fn = _innermost(fn)
    if not isinstance(fn, types.FunctionType):  # a module, a bound method: the program's
        return False
    module = getattr(fn, "__module__", None) or ""
    return module.startswith("torch.") and "<locals>" in (getattr(fn, "__qualname__", None) or "")


def _in_region():
    """Whether a compiled region (torch._dynamo.eval_frame's `compile_wrapper`) is on this thread's stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == _CALLER and frame.f_code.co_filename.endswith("eval_frame.py"):
            return True
        frame = frame.f_back
    return False


def _quiet_in_regions(warn_once, shown):
    """torch's `_warn_once(warning_id, message, ...)`, which inside a compiled region notes the warning as shown
    (in `shown`, its set) and gives none, as it does while Dynamo traces the region untraced."""

    def quiet(warning_id, *args, **kwargs):
        if _in_region():
            if shown is not None:
                shown.add(warning_id)
            return None
        return warn_once(warning_id, *args, **kwargs)

    return quiet
