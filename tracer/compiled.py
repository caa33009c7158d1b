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
