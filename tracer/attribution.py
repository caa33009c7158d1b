"""Which module and which phase (forward, backward, optimizer, other) an op belongs to.

Forward: global module forward hooks keep a stack of the modules running.
Backward: when a module's forward ends, a gradient hook on its outputs marks
the start of its backward (all output gradients are ready) and a gradient hook
on its inputs marks the end (all input gradients are computed); the innermost
module is the last one entered. The stack is cleared when the autograd engine
finishes. Optimizer: the global optimizer step hooks.

Phase rules, checked in this order:
  backward   the autograd engine is running (`_current_graph_task_id() != -1`)
  optimizer  inside `Optimizer.step`
  forward    inside a module's forward, or before the step's first backward
  other      after the step's backward, outside any module (gradient clipping,
             manual updates, zero_grad with set_to_none=False)

Known limitations:
  * A module whose inputs need no gradient (the root, an embedding) never sees
    its input hook fire; it stays on the backward stack until the engine
    finishes, so ops after its backward but outside any module are still
    attributed to it.
  * Modules called inside `torch.utils.checkpoint` re-run their forward in the
    backward; those ops are attributed to the module and the backward phase.
  * Backward through several engines at once (reentrant autograd) shares one
    stack.
"""

import weakref

import torch
import torch.optim.optimizer as optim_hooks
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from tracer.compiled import compiled_original, strip_compiled
from tracer.schema import Phase

_graph_task_id = torch._C._current_graph_task_id
FORWARD, BACKWARD, OPTIMIZER, OTHER = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER


def _on_grads_ready(tensors, fn):
    """Call fn once all of `tensors`' gradients are computed; a handle to remove the hook.

    One tensor takes a plain tensor hook: unlike a multi-grad hook it also fires
    on the tensor backward() starts from (a module that returns the loss)."""
    if len(tensors) == 1:
        return tensors[0].register_hook(lambda grad: fn(None))
    return register_multi_grad_hook(tensors, fn)


def _grad_tensors(obj):
    """Tensors that require grad in a module's inputs or outputs (one level of nesting)."""
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad else []
    if isinstance(obj, dict):
        obj = obj.values()
    elif not isinstance(obj, (list, tuple)):
        return []
    found = []
    for item in obj:
        found.extend(_grad_tensors(item))
    return found


class Attribution:
    """Tracks the current module path, phase and training step."""

    def __init__(self, root=None, on_step_end=None, on_optimizer_start=None):
        self._names = weakref.WeakKeyDictionary()
        self.root_name = None
        self.compiled_seen = False  # a torch.compile'd module ran (eagerly, under the tracer)
        if root is not None:
            self._name_tree(root)
        self.forward_stack = []
        self.backward_stack = []
        self.in_optimizer = False
        self.backward_seen = False
        self.step = 0
        self._on_step_end = on_step_end
        self._on_optimizer_start = on_optimizer_start
        self._grad_handles = []
        self._engine_callback_queued = False
        self._handles = []

    # names -------------------------------------------------------------
    def _name_tree(self, module, prefix=None):
        """Name a module and its children: the root by its class, children by relative path.

        A torch.compile wrapper (OptimizedModule) takes the names of the module it wraps."""
        original = compiled_original(module)
        if original is not None:
            self.compiled_seen = True
            self._names[module] = self.name_of(original)
            return
        if prefix is None:
            self.root_name = self.root_name or type(module).__name__
            top = type(module).__name__
            self._names[module] = top
            base = "" if top == self.root_name else top + "."
        else:
            base = prefix
        for name, child in module.named_modules(remove_duplicate=False):
            if name and child not in self._names:
                self._names[child] = base + strip_compiled(name)
                self.compiled_seen |= compiled_original(child) is not None

    def name_of(self, module):
        name = self._names.get(module)
        if name is None:
            self._name_tree(module)
            name = self._names[module]
        return name

    # state the dispatch hook reads ---------------------------------------
    def where(self):
        """(schema.Phase, innermost module name) for the op running now."""
        if _graph_task_id() != -1:
            self.backward_seen = True
            stack = self.backward_stack
            return BACKWARD, stack[-1] if stack else ""
        stack = self.forward_stack
        if self.in_optimizer:
            return OPTIMIZER, stack[-1] if stack else ""
        if stack:
            return FORWARD, stack[-1]
        return (OTHER if self.backward_seen else FORWARD), ""

    def next_step(self):
        self.step += 1
        self.backward_seen = False
        self.backward_stack.clear()
        self._engine_callback_queued = False  # a backward that raised never ran its callback
        for handle in self._grad_handles:
            handle.remove()
        self._grad_handles.clear()

    # hooks -----------------------------------------------------------------
    def install(self):
        self._handles = [
            register_module_forward_pre_hook(self._forward_pre),
            register_module_forward_hook(self._forward_post),
            optim_hooks.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_hooks.register_optimizer_step_post_hook(self._optimizer_post),
        ]

    def remove(self):
        self._engine_callback_queued = False
        for handle in self._handles + self._grad_handles:
            handle.remove()
        self._handles.clear()
        self._grad_handles.clear()

    def _forward_pre(self, module, args):
        name = self.name_of(module)
        self.forward_stack.append(name)
        if torch.is_grad_enabled():
            tensors = _grad_tensors(args)
            if tensors:
                self._grad_handles.append(_on_grads_ready(tensors, self._backward_exit(name)))

    def _forward_post(self, module, args, output):
        name = self.name_of(module)
        if self.forward_stack and self.forward_stack[-1] == name:
            self.forward_stack.pop()
        elif name in self.forward_stack:  # a hook raised in between: drop what is above it too
            del self.forward_stack[len(self.forward_stack) - 1 - self.forward_stack[::-1].index(name) :]
        if torch.is_grad_enabled():
            tensors = _grad_tensors(output)
            if tensors:
                self._grad_handles.append(_on_grads_ready(tensors, self._backward_enter(name)))

    def _is_ancestor(self, outer, inner):
        return inner.startswith(outer + ".") or (outer == self.root_name and inner != outer)

    def _backward_enter(self, name):
        def hook(_grads):
            self._queue_engine_callback()
            # A module and its last child can share an output tensor; their hooks
            # then fire child first. Keep ancestors below descendants regardless.
            stack = self.backward_stack
            at = len(stack)
            while at > 0 and self._is_ancestor(name, stack[at - 1]):
                at -= 1
            stack.insert(at, name)

        return hook

    def _backward_exit(self, name):
        def hook(_grads):
            stack = self.backward_stack
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] == name:
                    del stack[i]
                    break

        return hook

    def _queue_engine_callback(self):
        if self._engine_callback_queued:
            return

        def done():
            self.backward_stack.clear()
            self._engine_callback_queued = False

        torch.autograd.Variable._execution_engine.queue_callback(done)
        self._engine_callback_queued = True

    def _optimizer_pre(self, optimizer, args, kwargs):
        self.in_optimizer = True
        if self._on_optimizer_start is not None:
            self._on_optimizer_start(optimizer)

    def _optimizer_post(self, optimizer, args, kwargs):
        self.in_optimizer = False
        if self._on_step_end is not None:
            self._on_step_end(optimizer)
        self.next_step()
