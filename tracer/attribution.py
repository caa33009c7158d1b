"""Which phase (forward, backward, optimizer, other) and which module an op belongs to,
and whether it re-runs forward work for activation checkpointing.

Forward: global module forward hooks keep a stack of the modules running; the
post hook is registered with `always_call`, so a forward that raises (and is
caught) or a checkpoint recompute that stops early still leaves the stack.
Backward: when a module's forward ends, a gradient hook on its outputs marks the
start of its backward (all output gradients are ready) and a gradient hook on its
inputs marks the end (all input gradients are computed); the innermost module is
the last one entered. Each autograd engine run clears its own entries when it
finishes. Optimizer: the global optimizer step hooks. Steps: `tracer/steps.py`;
names: `tracer/modules.py`.

Phase rules, checked in this order:
  backward   the autograd engine is running (`_current_graph_task_id() != -1`),
             including forward work that activation checkpointing re-runs there
  optimizer  inside `Optimizer.step`
  forward    inside a module's forward; or, outside any module, an op that builds
             the autograd graph (grad mode on, an input requires grad, a floating
             output): the loss of every micro-batch
  other      the rest: data preparation, gradient clipping and unscaling, a manual
             update, zero_grad(set_to_none=False), `.item()`, logging

Recompute: an op run by the autograd engine is a recompute when a module's
forward began inside the engine (both `torch.utils.checkpoint` variants re-run
the checkpointed modules there), or when grad mode is on although the engine
run was started without `create_graph` (both variants re-run under
`enable_grad`). Its phase stays `backward`; its module is the module re-run.

Only the thread that entered the Tracer is traced: module and optimizer hooks
fired by other threads are ignored (an autograd engine thread running the
traced thread's backward counts as traced: it carries the tracer's dispatch
mode). The dispatch mode itself is thread-local, so ops of other threads are
never recorded.

Known limitations:
  * A module whose inputs need no gradient (the root, an embedding) never sees
    its input hook fire; it stays on the backward stack until the engine
    finishes, so ops after its backward but outside any module are still
    attributed to it.
  * Under `backward(create_graph=True)` only the recompute of modules is
    flagged (grad mode is on for every op of that engine run), and so is the
    recompute of an engine run whose very first op is a recompute.
  * A custom autograd Function whose backward enables grad mode, or calls a
    module, is flagged as a recompute.
  * Forward work inside `Optimizer.step` (an LBFGS closure) has phase optimizer.
"""

import threading
import weakref

import torch
import torch.optim.optimizer as optim_hooks
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from tracer.modules import ModuleNames
from tracer.schema import Phase
from tracer.steps import Steps

_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident
NO_GRAPH_TASK = -1  # _current_graph_task_id() outside the autograd engine
FORWARD, BACKWARD, OPTIMIZER, OTHER = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER
NOT_RECOMPUTE, RECOMPUTE = 0, 1


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


def _builds_graph(ins, outs):
    """Whether an op's output joins the autograd graph: grad mode on, an input requires
    grad and the first output is floating point (its requires_grad is set only after
    the dispatch hook returns)."""
    if not outs or not _grad_enabled():
        return False
    out = outs[0]
    if not (out.is_floating_point() or out.is_complex()):
        return False
    for t in ins:
        if t.requires_grad:
            return True
    return False


def _guarded(hook, on_error):
    """`hook`, made unable to raise into the traced program: a failure goes to `on_error`."""

    def guarded(*args):
        try:
            return hook(*args)
        except Exception as exc:
            on_error(exc)

    return guarded


def _pop(stack, key):
    """Remove the innermost entry of `key` (and any entry above it); False when absent."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] == key:
            del stack[i:]
            return True
    return False


class Attribution:
    """Tracks the current module path, phase, recompute flag and training step.

    `traced()` tells whether the calling thread runs traced work (the Tracer's
    dispatch mode is active in it); `rows_so_far` and `relabel` go to `Steps`."""

    def __init__(self, root=None, *, traced, rows_so_far, relabel, on_step_end=None,
                 on_optimizer_start=None, on_external_module=None, on_error=None):  # fmt: skip
        self.names = ModuleNames(root, on_external=on_external_module)
        self.steps = Steps(rows_so_far, relabel)
        self.forward_stack = []  # (id(module), name), outside the autograd engine
        self.recompute_stack = []  # (id(module), name), modules whose forward began inside the engine
        self.backward_stack = []  # (name, graph task id)
        self.in_optimizer = False
        self.backward_seen = False  # in this step
        self.trained = False  # this step ran a backward, or a module's forward under grad mode
        self._traced_elsewhere = traced
        self._thread = None
        self._task = NO_GRAPH_TASK  # the engine run seen last, and its grad mode (create_graph)
        self._task_grad = False
        self._task_grads = {}  # graph task -> grad mode at its first op
        self._on_step_end = on_step_end
        self._on_optimizer_start = on_optimizer_start
        self._grad_handles = []  # hooks on tensors of a graph: dropped once the graph is gone
        self._leaf_hooks = {}  # (hook maker, module name, tensor ids) -> (weak refs, handle): one per leaf set
        self._callbacks_queued = set()  # graph tasks whose end will clear their backward entries
        self._handles = []
        self._on_error = on_error or (lambda exc: None)

    # state the dispatch hook reads ---------------------------------------
    def where(self, ins, outs):
        """(schema.Phase, innermost module name, recompute flag) for the op that just ran."""
        task = _graph_task_id()
        if task != NO_GRAPH_TASK:
            self.backward_seen = self.trained = True
            if self.recompute_stack:
                return BACKWARD, self.recompute_stack[-1][1], RECOMPUTE
            if task != self._task:
                self._task = task  # the grad mode at an engine run's first op is its create_graph
                self._task_grad = self._task_grads.setdefault(task, _grad_enabled())
            recompute = RECOMPUTE if _grad_enabled() and not self._task_grad else NOT_RECOMPUTE
            stack = self.backward_stack
            return BACKWARD, stack[-1][0] if stack else "", recompute
        stack = self.forward_stack
        if self.in_optimizer:
            return OPTIMIZER, stack[-1][1] if stack else "", NOT_RECOMPUTE
        if stack:
            return FORWARD, stack[-1][1], NOT_RECOMPUTE
        if _builds_graph(ins, outs):
            if self.steps.forward_work():
                self._step_began()
            return FORWARD, "", NOT_RECOMPUTE
        return OTHER, "", NOT_RECOMPUTE

    @property
    def step(self):
        return self.steps.step

    def _step_began(self):
        self.backward_seen = self.trained = False
        self.forward_stack.clear()  # nothing can still be running when a step begins
        self.backward_stack.clear()
        self._callbacks_queued.clear()  # a backward that raised never ran its callback
        self._task_grads.clear()
        self._task = NO_GRAPH_TASK
        self._prune()

    def _prune(self):
        """Drop the handles of hooks whose tensors and graph are gone (a forward never backpropagated)."""
        self._grad_handles = [h for h in self._grad_handles if _handle_alive(h)]
        dead = [key for key, (refs, _) in self._leaf_hooks.items() if any(r() is None for r in refs)]
        for key in dead:
            del self._leaf_hooks[key]

    def live_hooks(self):
        """Gradient hooks the tracer holds now (bounded: see tests/test_loops.py)."""
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

    def traced(self):
        return _get_ident() == self._thread or self._traced_elsewhere()

    # hooks -----------------------------------------------------------------
    def install(self):
        self._thread = _get_ident()
        err = self._on_error
        self._handles = [
            register_module_forward_pre_hook(_guarded(self._forward_pre, err)),
            register_module_forward_hook(_guarded(self._forward_post, err), always_call=True),
            optim_hooks.register_optimizer_step_pre_hook(_guarded(self._optimizer_pre, err)),
            optim_hooks.register_optimizer_step_post_hook(_guarded(self._optimizer_post, err)),
        ]

    def remove(self):
        for handle in self._handles + self._grad_handles + [h for _, h in self._leaf_hooks.values()]:
            handle.remove()
        self._handles.clear()
        self._grad_handles.clear()
        self._leaf_hooks.clear()
        self._callbacks_queued.clear()

    def _forward_pre(self, module, args):
        if not self.traced():
            return
        name = self.names.name_of(module)
        if _graph_task_id() != NO_GRAPH_TASK:  # activation checkpointing re-runs it in the backward
            self.recompute_stack.append((id(module), name))
        else:
            if not self.in_optimizer and self.steps.forward_work():
                self._step_began()
            elif not self.forward_stack:
                self._prune()  # a new outermost forward: bound the handles of graphs never backpropagated
            self.forward_stack.append((id(module), name))
            self.trained = self.trained or _grad_enabled()
        if _grad_enabled():
            tensors = _grad_tensors(args)
            if tensors:
                self._watch(tensors, self._backward_exit, name)

    def _forward_post(self, module, args, output):
        if not self.traced():
            return
        if not _pop(self.recompute_stack, id(module)):
            _pop(self.forward_stack, id(module))
        if output is not None and _grad_enabled():
            tensors = _grad_tensors(output)
            if tensors:
                self._watch(tensors, self._backward_enter, self.names.name_of(module))

    def _backward_enter(self, name):
        def hook(_grads):
            task = _graph_task_id()
            self._queue_engine_callback(task)
            # A module and its last child can share an output tensor; their hooks
            # then fire child first. Keep ancestors below descendants regardless.
            stack = self.backward_stack
            at = len(stack)
            while at > 0 and self.names.is_ancestor(name, stack[at - 1][0]):
                at -= 1
            stack.insert(at, (name, task))

        return hook

    def _backward_exit(self, name):
        def hook(_grads):
            stack = self.backward_stack
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == name:
                    del stack[i]
                    break

        return hook

    def _queue_engine_callback(self, task):
        if task in self._callbacks_queued:
            return

        def done():
            self.backward_stack[:] = [entry for entry in self.backward_stack if entry[1] != task]
            self.recompute_stack.clear()  # a recompute that stopped early
            self._callbacks_queued.discard(task)
            self._prune()

        torch.autograd.Variable._execution_engine.queue_callback(done)
        self._callbacks_queued.add(task)

    def _optimizer_pre(self, optimizer, args, kwargs):
        if not self.traced():
            return
        self.in_optimizer = True
        self.steps.optimizer_start(optimizer)
        if self._on_optimizer_start is not None:
            self._on_optimizer_start(optimizer)

    def _optimizer_post(self, optimizer, args, kwargs):
        if not self.traced():
            return
        self.in_optimizer = False
        self.steps.optimizer_end()
        if self._on_step_end is not None:
            self._on_step_end(optimizer)
