"""torch.compile under the tracer: compiled modules run eagerly, named as the original.

While a dispatch mode that is not one of PyTorch's own infrastructure modes is active,
Dynamo skips every frame, so a `torch.compile`d module or function runs its eager
Python code and the trace records the eager program's ops, not the compiled kernels.
The tracer says so in the metadata (`compiled_ran_eagerly`) when it sees a compiled
module, and names modules by their path in the original model: the wrapper's
`_orig_mod` level is dropped (`blocks.0._orig_mod.attn` is `blocks.0.attn`).
A module compiled in place (`model.compile()`: the module keeps its class and sets
`_compiled_call_impl`) runs eagerly too, under its own name; `compiled_in_place`
finds it and the tracer says so in the same fact.
A compiled module runs eagerly even when it was compiled and run before the trace.
A `torch.compile`d plain function is not detected as such. An optimizer step
compiled and run before the trace (`opt.step = torch.compile(opt.step)`) is
different: under the tracer its step hooks fire but its update runs compiled
kernels that bypass the dispatcher (measured with inductor, torch 2.13 on CPU):
tracer/attribution.py counts such steps (`untraced_optimizer_steps`).
"""

_WRAPPER = "OptimizedModule"
_LEVEL = "_orig_mod"


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
    for them are kept, nothing is compiled again (tests/test_compiled_warning.py). Only intercepted
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
