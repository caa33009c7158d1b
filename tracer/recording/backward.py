"""The re-run module whose backward is running: gradient hooks on the inputs and outputs of each
module that activation checkpointing re-runs inside the backward (every other module's backward is
named from autograd sequence numbers: tracer.recording.attribution).

When a module's forward ends, a gradient hook on its outputs marks the start of
its backward (all output gradients are ready) and a gradient hook on its inputs
marks the end (all input gradients are computed); the innermost module is the
last one entered. Each autograd engine run clears its own entries when it
finishes.

The hooks must not pile up in a loop that runs forwards and never backpropagates
(an evaluation loop with grad mode on): a hook on a graph's tensors is dropped
once the graph is gone (its handle's weak reference dies), and hooks on leaves
(an input that requires grad), which outlive every forward, are kept once per
set of leaves and module. (So when one backward runs through two forwards of a
module over the same leaf input, one of its two entries stays on the stack
until the engine finishes.)
"""

import weakref

import torch
from torch.autograd.graph import register_multi_grad_hook

_graph_task_id = torch._C._current_graph_task_id


def _on_grads_ready(tensors, fn):
    """Call fn once all of `tensors`' gradients are computed; a handle to remove the hook.

    One tensor takes a plain tensor hook: unlike a multi-grad hook it also fires
    on the tensor backward() starts from (a module that returns the loss)."""
    if len(tensors) == 1:
        return tensors[0].register_hook(lambda grad: fn(None))
    return register_multi_grad_hook(tensors, fn)


def _handle_alive(handle):
    """Whether a hook handle's tensors (or their graph) still exist: a dead one can be dropped."""
    inner = getattr(handle, "handles", None)  # a multi-grad hook's handle holds one per tensor
    if inner is not None:
        return any(_handle_alive(h) for h in inner)
    return handle.hooks_dict_ref() is not None


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


class BackwardStack:
    """`stack`: (module name, graph task) of the modules whose backward is running, innermost last.

    `names` is the ModuleNames (for ancestry); `on_engine_done()` runs when an engine run ends."""

    def __init__(self, names, on_engine_done):
        self.stack = []
        self._names = names
        self._on_engine_done = on_engine_done
        self._grad_handles = []  # hooks on tensors of a graph: dropped once the graph is gone
        self._leaf_hooks = {}  # (hook maker, module name, tensor ids) -> (weak refs, handle): one per leaf set
        self._callbacks_queued = set()  # graph tasks whose end will clear their entries

    def watch_inputs(self, args, name):
        tensors = _grad_tensors(args)
        if tensors:
            self._watch(tensors, self._backward_exit, name)

    def watch_outputs(self, output, name):
        tensors = _grad_tensors(output)
        if tensors:
            self._watch(tensors, self._backward_enter, name)

    def reset(self):
        """A step begins: nothing can be running backward."""
        self.stack.clear()
        self._callbacks_queued.clear()  # a backward that raised never ran its callback
        self.prune()

    def remove(self):
        for handle in self._grad_handles + [h for _, h in self._leaf_hooks.values()]:
            handle.remove()
        self._grad_handles.clear()
        self._leaf_hooks.clear()
        self._callbacks_queued.clear()

    def prune(self):
        """Drop the handles of hooks whose tensors and graph are gone (a forward never backpropagated)."""
        self._grad_handles = [h for h in self._grad_handles if _handle_alive(h)]
        dead = [key for key, (refs, _) in self._leaf_hooks.items() if any(r() is None for r in refs)]
        for key in dead:
            del self._leaf_hooks[key]

    def live_hooks(self):
        """Gradient hooks the tracer holds now (bounded: see tests/tracer/recording/test_loops.py)."""
        return len(self._grad_handles) + len(self._leaf_hooks)

    def _watch(self, tensors, make_hook, name):
        """Hook `make_hook(name)` on the moment all of `tensors`' gradients are computed.

        Leaves (an input that requires grad, a module returning its input) outlive
        any one forward, and their hooks with them: one hook per set of leaves and
        module serves every forward, so a forward-only loop does not pile them up."""
        if not all(t.is_leaf for t in tensors):
            self._grad_handles.append(_on_grads_ready(tensors, make_hook(name)))
            return
        key = (make_hook, name, tuple(id(t) for t in tensors))
        entry = self._leaf_hooks.get(key)
        if entry is not None and all(r() is t for r, t in zip(entry[0], tensors)):
            return
        refs = tuple(weakref.ref(t) for t in tensors)
        self._leaf_hooks[key] = (refs, _on_grads_ready(tensors, make_hook(name)))

    def _backward_enter(self, name):
        def hook(_grads):
            task = _graph_task_id()
            self.queue_engine_callback(task)
            # A module and its last child can share an output tensor; their hooks
            # then fire child first. Keep ancestors below descendants regardless.
            stack = self.stack
            at = len(stack)
            while at > 0 and self._names.is_ancestor(name, stack[at - 1][0]):
                at -= 1
            stack.insert(at, (name, task))

        return hook

    def _backward_exit(self, name):
        def hook(_grads):
            stack = self.stack
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == name:
                    del stack[i]
                    break

        return hook

    def running(self, task):
        """Whether engine run `task` has begun and not yet finished."""
        return task in self._callbacks_queued

    def queue_engine_callback(self, task):
        """Engine run `task` is going on: have its end run `on_engine_done` (once per run)."""
        if task in self._callbacks_queued:
            return

        def done():
            self.stack[:] = [entry for entry in self.stack if entry[1] != task]
            self._on_engine_done()
            self._callbacks_queued.discard(task)
            self.prune()

        torch.autograd.Variable._execution_engine.queue_callback(done)
        self._callbacks_queued.add(task)
