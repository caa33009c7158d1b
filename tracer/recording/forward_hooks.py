"""The module forward hooks of tracer.recording.attribution.Attribution: `ForwardHooks`, a part of it.

Global module forward hooks keep a stack of the modules running (`forward_stack`, outside the autograd engine); the
post hook is registered with `always_call`, so a forward that raises (and is caught) or a checkpoint recompute that
stops early still leaves the stack. A module outside the model is named below the module on top of it, its caller
(`tracer.recording.modules`); re-run by a checkpoint (its forward begins inside the engine: `recompute_stack`), below
the module re-run, else below the module of the node re-running it. Each boundary is marked (`Attribution._mark`)
with the autograd sequence number the next node will get, so the backward finds its module. The state is the
Attribution's own (its instance dict, which the compiled hook reads: tracer/native/_where.cpp).
"""

import threading

import torch

from tracer.recording.compiled import compiled_in_place

_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident
NO_GRAPH_TASK = -1  # _current_graph_task_id() outside the autograd engine


def _pop(stack, key):
    """Remove the innermost entry of `key` (and any entry above it); its name, or None when absent."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] == key:
            name = stack[i][1]
            del stack[i:]
            return name
    return None


class ForwardHooks:
    """The module forward pre and post hooks of an Attribution (see the module's docstring)."""

    def _forward_pre(self, module, args):
        if not self.traced():
            return
        names = self.names
        if _graph_task_id() != NO_GRAPH_TASK:  # activation checkpointing re-runs it in the backward
            if self.recompute_stack:
                caller = self.recompute_stack[-1][1]
            else:  # outside the re-run modules: the module of the node re-running them
                if _get_ident() == self._thread:
                    self._recompute_outer = outer = self._backward_module()
                else:  # an engine thread's own sequence numbers: the node it named last
                    outer = self._node_module
                caller = names.owner(self._recompute_region or outer)
                if self._recompute_region is None:  # a re-run begins: the modules it calls are counted afresh
                    names.entered(caller)
            name = names.name_of(module, caller)
            names.entered(name)
            if _get_ident() == self._thread:  # the nodes the re-run makes are named like the forward's
                if not self.recompute_stack:
                    if self._recompute_region is None:
                        self._recompute_region = self._enclosing(name)
                self._mark(name)
            self.recompute_stack.append((id(module), name))
        else:
            if compiled_in_place(module):  # model.compile(): it runs eagerly here too
                names.compiled_seen = True
            if self.in_optimizer and not self._closure and _get_ident() == self._thread:
                self._end_raised_steps()
            stack = self.forward_stack
            if not self.in_optimizer and self.steps.forward_work():
                self._step_began()
            elif not stack:
                self.backward.prune()  # a new outermost forward: bound the handles of graphs never backpropagated
            name = names.name_of(module, stack[-1][1] if stack else None)  # called inside a module: in its subtree
            names.entered(name)
            stack.append((id(module), name))
            self._called.add(name)
            self.trained = self.trained or _grad_enabled()
            self._mark(name)
            return
        if _grad_enabled():  # a re-run module's backward runs in a nested engine run: gradient hooks say when
            self.backward.watch_inputs(args, name)

    def _enclosing(self, name):
        """The module a checkpointed function ran in, from the first module its re-run calls (`name`): the innermost
        module enclosing it that a forward called (past containers never called, ModuleList), or None. A
        non-reentrant checkpoint of a block's forward method (transformers' GradientCheckpointingLayer) re-runs the
        block's own ops with no hook of the block's: they are the block's, not the module of the autograd node whose
        saved tensor started the re-run."""
        root = self.names.root_name
        while name and name != root:
            head, dot, _ = name.rpartition(".")
            name = head if dot else (root if "#" not in name else None)  # `Teacher#1` is no child of the root
            if name in self._called:
                return name
        return None

    def _forward_post(self, module, args, output):
        if not self.traced():
            return
        name = _pop(self.recompute_stack, id(module))
        if name is not None:
            if output is not None and _grad_enabled():
                self.backward.watch_outputs(output, name)
            if _get_ident() == self._thread:
                self._mark(
                    self.recompute_stack[-1][1]
                    if self.recompute_stack
                    else self._recompute_region or self._recompute_outer
                )
            return
        stack = self.forward_stack
        _pop(stack, id(module))
        self._mark(stack[-1][1] if stack else "")
