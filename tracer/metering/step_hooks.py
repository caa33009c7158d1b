"""What a metered step ran, noted by hooks: `StepHooks`, a part of tracer.metering.meter.Meter.

The root module's pre-hook and forward hook note the shapes and dtypes of every tensor in its inputs and whether grad
mode was on at each root call (tracer.metering.flops.signature); a root call without grad makes no graph nodes, so a
global hook counts the modules it calls, for that call alone; a global optimizer step post-hook counts the optimizer
steps. Without model=, the first module called on the meter's thread becomes the root. A module compiled in place
(`model.compile()`) gets its hooks around its compiled call (`_CompiledCall`). The hooks act on the Meter's thread
only and do nothing while Dynamo traces them; they come off and go on again (`_remove_hooks`, `_install_hooks`:
benchmarks/meter.py times steps without them in the same run).
"""

import threading

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from tracer.metering.flops import signature
from tracer.recording.compiled import compiled_in_place
from tracer.safety import GlobalModuleHook

# True while Dynamo traces the hooks with a compiled root: they then do nothing (the thread check in them is a builtin
# Dynamo cannot trace, which broke the user's graph with a warning that `python -W error` raised)
_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


class StepHooks:
    """A Meter's hooks and what they note of a step (see the module's docstring)."""

    def _find_root(self, module, args):
        """Without model=, the first module called on the meter's thread is the root: its hook goes on (and runs
        for this call too), this global one comes off, so that no later module call takes the hook path."""
        if not _compiling() and threading.get_ident() == self._thread and self._root is None:
            self._root = module
            self._remove_hooks()
            self._hook_root()

    def _root_called(self, module, args):
        """The root's pre-hook: a root call without grad makes no graph nodes, so a global hook counts the modules
        it calls (a branch taken in an evaluation step), for that call alone."""
        if _compiling() or threading.get_ident() != self._thread:
            return
        if not torch.is_grad_enabled() and self._counting is None:
            self._counting = GlobalModuleHook(register_module_forward_pre_hook, self._count)

    def _count(self, module, args):
        if not _compiling() and threading.get_ident() == self._thread:
            self._calls[type(module)] = self._calls.get(type(module), 0) + 1

    def _stop_counting(self):
        if self._counting is not None:
            self._counting.remove()
            self._counting = None

    def _root_inputs(self, module, args, kwargs, output):
        """The root's forward hook (after its forward: one registered in a pre-hook runs for the same call)."""
        if not _compiling() and threading.get_ident() == self._thread:
            if module is not None:
                self._stop_counting()
            try:
                self._inputs.append(signature(args, kwargs))
                self._grads.append(torch.is_grad_enabled())
            except Exception as exc:  # an input pytree cannot walk: the step keeps the signature it has
                self._failed(exc)

    def _optimizer_stepped(self, optimizer, args, kwargs):
        """A global optimizer step post-hook: the signature counts the step's optimizer steps, so that a step whose
        update a GradScaler skipped (fp16's first steps often overflow) does not serve the steps that update."""
        if not _compiling() and threading.get_ident() == self._thread:
            self._optimizer_steps += 1

    def _note_inputs(self, *args, **kwargs):
        """Add these inputs to the step's signature as the root's are (tracer.metering.callbacks: the batch Lightning
        hands to training_step, which need not call the root's forward)."""
        if not self._closed:
            self._root_inputs(None, args, kwargs, None)

    def _install_hooks(self):
        if self._root is None:
            self._handles.append(GlobalModuleHook(register_module_forward_pre_hook, self._find_root))
        else:
            self._hook_root()

    def _hook_root(self):
        root = self._root
        if compiled_in_place(root):  # model.compile(): its hooks run inside the compiled code, which skips them
            self._handles.append(_CompiledCall(root, self._root_called, self._root_inputs))
            return
        self._handles.append(root.register_forward_pre_hook(self._root_called))
        self._handles.append(root.register_forward_hook(self._root_inputs, with_kwargs=True))

    def _remove_hooks(self):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stop_counting()


class _CompiledCall:
    """The root's hooks around a module compiled in place (`model.compile()` calls `_compiled_call_impl`, which runs
    the module's hooks inside the compiled code, where they do nothing): its compiled call, wrapped while metered.
    `remove()` puts the compiled call back (unless something else replaced it since)."""

    def __init__(self, module, before, after):
        compiled = module._compiled_call_impl

        def call(*args, **kwargs):
            before(module, args)
            out = compiled(*args, **kwargs)
            after(module, args, kwargs, out)
            return out

        self._module, self._compiled, self._call = module, compiled, call
        module._compiled_call_impl = call

    def remove(self):
        if self._module.__dict__.get("_compiled_call_impl") is self._call:
            self._module._compiled_call_impl = self._compiled
