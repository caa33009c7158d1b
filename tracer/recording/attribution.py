"""Which phase (forward, backward, optimizer, other) and which module an op belongs to,
and whether it re-runs forward work for activation checkpointing.

Forward: global module forward hooks keep a stack of the modules running
(tracer.recording.forward_hooks).
Backward: an op belongs to the module whose forward made the autograd node the
engine is running. The forward hooks note the autograd sequence number at each
module boundary (the number the next node will get); in backward the running
node's sequence number finds its module by bisection. An AccumulateGrad node
(no sequence number) belongs to the node run before it; an engine callback
(no node) to no module.
Modules that activation checkpointing re-runs in the backward note their
boundaries too (a reentrant checkpoint backpropagates through the re-run graph
in a nested engine run), and also get gradient hooks on their inputs and
outputs (`tracer.recording.backward`), which name their backward first: on a CUDA
device the re-run happens on the device's engine thread, whose sequence numbers
are its own, so there a nested engine run outside the re-run modules belongs to
the module of the node that started it.
Optimizer: the global optimizer step hooks (tracer.recording.optimizer_hooks). Steps:
`tracer.recording.steps`; names: `tracer.recording.modules`.

Phase rules, checked in this order:
  backward   the autograd engine is running (`_current_graph_task_id() != -1`),
             including forward work that activation checkpointing re-runs there
  forward    inside a module's forward (also in a closure `Optimizer.step` calls)
  optimizer  inside `Optimizer.step`, but for the next rule in a closure, and
             `other` for the closure's ops that build no graph (Lightning's copy of
             the loss and its gradient clipping run in the closure it passes)
  forward    outside any module, an op that builds the autograd graph (grad mode
             on, an input requires grad, a floating output, not `detach`): the loss
             of every micro-batch
  optimizer  outside any module, after this step's backward, an op that writes a
             parameter in place (a hand-written update, a Lookahead wrapper's slow
             weights after its inner step): it also ends the iteration when no
             optimizer step did (`Steps.iteration_end`)
  other      the rest: data preparation, gradient clipping and unscaling,
             zero_grad(set_to_none=False), `.item()`, logging. A GradScaler's
             `_amp_update_scale_` in a step no optimizer ended (it skipped the
             step) ends the iteration.
A parameter is a model= parameter, one an optimizer holds, or a leaf tensor that
requires grad; it is known by its storage, so `p.data.add_(...)` is one too.

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
  * Module boundaries are remembered for the last 262,144 of them (hundreds of
    steps of a large model): the nodes of a graph kept longer (retain_graph), or
    of one forward with more module calls than that, that were made before the
    oldest boundary kept are named '' (outside every module).
  * Past NAMED_PER_ENGINE_RUN (20,000) autograd nodes in one engine run, backward
    ops are left unnamed ('', counted in the metadata as `backward_unnamed_rows`,
    with a warning and a line in the report): naming more could make PyTorch
    overflow the stack when it frees a deep graph.
  * Sequence numbers count per thread: the backward of a forward run on another
    thread (whose module hooks are not traced) is named by unrelated boundaries.
  * Under `backward(create_graph=True)` the nodes of the new graph are made in
    the backward; a second backward through them outside any re-run module is
    named by those nodes' sequence numbers, which mean nothing there.
  * Under `backward(create_graph=True)` only the recompute of modules is
    flagged (grad mode is on for every op of that engine run), and so is the
    recompute of an engine run whose very first op is a recompute.
  * A custom autograd Function whose backward enables grad mode, or calls a
    module, is flagged as a recompute.
  * A module outside the model that a checkpointed function calls outside every
    module it re-runs is named, when re-run on an engine thread of its own (a
    CUDA device's), below the module of the node that thread named last.
  * Optimizer steps run inside others, closures and wrappers: tracer.recording.optimizer_hooks.
"""

import bisect
from array import array

import torch
import torch.optim.optimizer as optim_hooks
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from tracer.recording.backward import BackwardStack
from tracer.recording.forward_hooks import (  # the engine's and the thread's, read by both
    NO_GRAPH_TASK,
    ForwardHooks,
    _get_ident,
    _grad_enabled,
    _graph_task_id,
)
from tracer.recording.modules import ModuleNames
from tracer.recording.optimizer_hooks import OptimizerHooks
from tracer.recording.steps import Parameters, RunningSteps, Steps, UnhookedWrapper
from tracer.safety import GlobalModuleHook
from tracer.schema import Phase

_next_sequence_nr = torch.autograd._get_sequence_nr  # the sequence number the next autograd node will get
_current_node = torch._C._current_autograd_node  # the autograd node the engine is running, or None
NO_SEQUENCE_NR = 2**64 - 1  # an AccumulateGrad node's: it belongs to no forward op
_EVENTS_KEPT = 1 << 18  # module boundaries remembered for backward attribution (16 bytes each: 4 MiB at most)
# Autograd nodes whose ops are named per engine run. Reading a node from Python gives it a Python object,
# and PyTorch frees a chain of such nodes recursively: about 40,000 of them in a chain overflow an 8 MB
# stack when the graph is freed (without the tracer, too; 60,000 measured to crash). Half of that bounds the
# chain this tracer makes. A node runs one to a few ops, so this names 20,000 nodes' ops, not 20,000 ops.
NAMED_PER_ENGINE_RUN = 20_000
_TASKS_KEPT = 64  # engine runs remembered (their grad mode); nested runs are few, finished ones irrelevant
FORWARD, BACKWARD, OPTIMIZER, OTHER = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER
NOT_RECOMPUTE, RECOMPUTE = 0, 1
_SCALE_UPDATE = "aten._amp_update_scale_"  # GradScaler.update(): it runs whether or not the step was skipped
# its input may require grad, its output never does: `loss.detach()` logged after the optimizer is no forward work
_DETACH = "aten.detach.default"


def _builds_graph(ins, outs, info=None, wrapped_grad=False):
    """Whether an op's output joins the autograd graph: grad mode on, an input requires
    grad, the first output is floating point (its requires_grad is set only after
    the dispatch hook returns) and the op is not `detach`. `wrapped_grad`: a tensor
    subclass the op received (a DTensor, an AsyncCollectiveTensor) requires grad; `ins`
    are its inner tensors, which do not."""
    if not outs or not _grad_enabled() or (info is not None and info.name == _DETACH):
        return False
    out = outs[0]
    if not (out.is_floating_point() or out.is_complex()):
        return False
    if wrapped_grad:
        return True
    for t in ins:
        if t.requires_grad:
            return True
    return False


def _on_leaf(ins):
    """Whether an input is a leaf that requires grad (a parameter): `torch.zeros_like(w)` may begin a functional
    forward, where `zeros_like(loss)` after the optimizer reads only the graph of the step that ended."""
    for t in ins:
        if t.requires_grad and t.is_leaf:
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


class Attribution(ForwardHooks, OptimizerHooks):
    """Tracks the current module path, phase, recompute flag and training step.

    `traced()` tells whether the calling thread runs traced work (the Tracer's
    dispatch mode is active in it); `rows_so_far` and `relabel` go to `Steps`."""

    def __init__(
        self,
        root=None,
        *,
        params=None,
        traced,
        rows_so_far,
        relabel,
        on_step_end=None,
        on_optimizer_start=None,
        on_external_module=None,
        on_error=None,
    ):
        self.names = ModuleNames(root, on_external=on_external_module)
        self.steps = Steps(rows_so_far, relabel)
        self.forward_stack = []  # (id(module), name), outside the autograd engine
        self.recompute_stack = []  # (id(module), name), modules whose forward began inside the engine
        # when an engine run ends, so does any recompute in it (one that stopped early never pops)
        self.backward = BackwardStack(self.names, on_engine_done=self.recompute_stack.clear)
        self.backward_stack = self.backward.stack  # (name, graph task id); the same list, for where()
        self.in_optimizer = False
        self._closure = False  # the running optimizer step was given a closure (forward and backward)
        self._in_closure = 0  # calls of that closure running (LBFGS calls it again and again)
        self.trained = False  # this step ran a backward, or a module's forward under grad mode
        self._traced_elsewhere = traced
        self._thread = None
        self._task = NO_GRAPH_TASK  # the engine run seen last, and its grad mode (create_graph)
        self._task_grad = False
        self._task_grads = {}  # graph task -> grad mode at its first op
        self._on_step_end = on_step_end
        self._on_optimizer_start = on_optimizer_start
        self._handles = []
        self._on_error = on_error or (lambda exc: None)
        # module boundaries of the forward, by autograd sequence number: the autograd node with sequence
        # number s was made inside module _event_names[i], i the last event with _event_seqs[i] <= s. The numbers
        # in an array (8 bytes each, not an int object each: a forward-only loop under grad mode, which nothing
        # clears, fills _EVENTS_KEPT of them); tracer/native/_where.cpp reads it in place
        self._event_seqs, self._event_names = array("Q"), []
        # one str per module name for _event_names: a module named per call (a helper in its caller's subtree, an
        # external root made anew each step) gets an equal but new str each time, about 60 bytes per boundary kept
        self._name_objects = {}
        self._node_module = ""  # the module of the last node attributed (an AccumulateGrad node runs right after it)
        self._named_left = NAMED_PER_ENGINE_RUN  # autograd nodes this engine run may still name its ops from
        self._node_key = None  # (id, sequence number) of the node the last backward op ran in
        self._last_module = ""  # that op's module
        self.unnamed_backward = 0  # backward ops left unnamed past NAMED_PER_ENGINE_RUN
        self._nested = {}  # graph task of a backward run inside another, on an engine thread -> the outer node's module
        self._recompute_outer = ""  # the module of the node that began re-running modules (checkpointing)
        self._recompute_region = None  # the module enclosing the first module a checkpoint's re-run called (_enclosing)
        self._called = set()  # names of the modules called in a forward (outside the engine)
        self._running = RunningSteps()  # optimizer steps running, one inside another
        self._wrapper = UnhookedWrapper()  # an Optimizer subclass with no step hooks whose step() runs the outermost
        self._updating = []  # per optimizer step running: [id(optimizer), {id(param): numel}, another step ran in it]
        self.updated = {}  # id(param) -> local numel, of every parameter an innermost optimizer step updated
        self._optimizer_ops = 0  # ops recorded in the optimizer phase of the running outermost step
        self._expect_ops = False  # the running outermost step has parameters with gradients: it must run ops
        self.untraced_optimizer_steps = 0  # optimizer steps whose hooks fired around no recorded op
        self._backward_seen = False  # this step ran a backward on the traced thread (a manual update may follow)
        self._params = Parameters()  # the parameters known: model=, the optimizers'
        if root is not None:  # `params`: root.parameters() as a list, when the caller walked them already
            self._params.note(root.parameters() if params is None else params)

    # state the dispatch hook reads ---------------------------------------
    def where(self, ins, outs, info=None, args=(), kwargs=None, wrapped_grad=False):
        """(schema.Phase, innermost module name, recompute flag) for the op that just ran
        (`info`, `args`, `kwargs`: the op's dispatch._OpInfo and arguments; `wrapped_grad`:
        a tensor subclass among the arguments requires grad, see _builds_graph)."""
        task = _graph_task_id()
        if task != NO_GRAPH_TASK:
            self.trained = True
            if self.recompute_stack:
                return BACKWARD, self.recompute_stack[-1][1], RECOMPUTE
            if task != self._task:
                if self.backward.running(self._task) and task not in self._task_grads and _get_ident() != self._thread:
                    self._nested[task] = self._node_module  # a backward inside a backward on an engine thread
                if task not in self._task_grads:  # a new engine run (not the outer one a nested run returns to)
                    self._named_left = NAMED_PER_ENGINE_RUN
                    self._backward_seen = True
                    self.steps.backward_began()
                self._task = task  # the grad mode at an engine run's first op is its create_graph
                self._node_module = ""
                self._node_key = None
                self.backward.queue_engine_callback(task)  # its end clears what a checkpoint's re-run left
                if task not in self._task_grads and len(self._task_grads) >= _TASKS_KEPT:
                    self._task_grads.clear()  # ended engine runs (a loop with no step boundary): keep it bounded
                    self._nested.clear()
                self._task_grad = self._task_grads.setdefault(task, _grad_enabled())
            recompute = RECOMPUTE if _grad_enabled() and not self._task_grad else NOT_RECOMPUTE
            stack = self.backward_stack  # modules a checkpoint re-ran inside the engine (gradient hooks)
            if stack:
                return BACKWARD, stack[-1][0], recompute
            region = self._recompute_region
            if region is not None:  # a checkpointed function re-run, outside the modules it calls: its module
                if recompute:
                    return BACKWARD, region, recompute
                self._recompute_region = None  # the re-run is over: the backward goes on
            if task in self._nested:  # its nodes may come from this engine thread's sequence numbers (a checkpoint
                return BACKWARD, self._nested[task], recompute  # re-run on a CUDA device): the outer node's module
            return BACKWARD, self._backward_module(), recompute
        stack = self.forward_stack
        if stack:
            return FORWARD, stack[-1][1], NOT_RECOMPUTE
        if self.in_optimizer:
            if self._closure and _builds_graph(
                ins, outs, info, wrapped_grad
            ):  # the loss, in a closure the optimizer calls
                return FORWARD, "", NOT_RECOMPUTE
            if self._in_closure:  # the closure's own work: the loss copied for logging, gradient clipping
                return OTHER, "", NOT_RECOMPUTE
            self._optimizer_ops += 1
            return OPTIMIZER, "", NOT_RECOMPUTE
        if self._wrapper.frame is not None and self._wrapper.running():  # its own update after the inner step
            return OPTIMIZER, "", NOT_RECOMPUTE
        if _builds_graph(ins, outs, info, wrapped_grad):
            if self.steps.armed and info is not None and info.graphless and not _on_leaf(ins):  # `zeros_like(loss)`
                return OTHER, "", NOT_RECOMPUTE  # after the optimizer: no graph, so no step (dispatch._GRAPHLESS)
            if self.steps.forward_work():
                self._step_began()
            return FORWARD, "", NOT_RECOMPUTE
        if info is not None and info.inplace:
            if self._backward_seen and self._params.written_by(info, args, kwargs):  # a hand-written update
                self.steps.iteration_end()
                return OPTIMIZER, "", NOT_RECOMPUTE
            if info.name.startswith(_SCALE_UPDATE):  # a skipped GradScaler step still ends the iteration
                self.steps.iteration_end()
        return OTHER, "", NOT_RECOMPUTE

    def _backward_module(self):
        """The module whose forward made the autograd node the engine is running ('' outside every module).

        A node runs several ops (an mm's backward: two matmuls and their transposes): its module is found
        once, when the node changes, and each distinct node counts against NAMED_PER_ENGINE_RUN."""
        if self._named_left <= 0:  # a very long backward: the rest is left unnamed (NAMED_PER_ENGINE_RUN)
            self.unnamed_backward += 1
            return ""
        node = _current_node()
        if node is None:  # an engine callback (DDP's and FSDP2's final copies and reductions): no node made it
            return ""
        seq = node._sequence_nr()
        key = (id(node), seq)  # the node's Python object lives as long as the node: its id is the node's
        if key == self._node_key:
            return self._last_module
        self._node_key = key
        self._named_left -= 1
        if seq != NO_SEQUENCE_NR:  # AccumulateGrad runs as soon as the node before made its gradient: that one's module
            at = bisect.bisect_right(self._event_seqs, seq) - 1
            self._node_module = self._event_names[at] if at >= 0 else ""
        self._last_module = self._node_module
        return self._node_module

    def _mark(self, name):
        """From here on, autograd nodes are made inside module `name` ('' outside every module)."""
        seqs, names = self._event_seqs, self._event_names
        name = self._name_objects.setdefault(name, name)
        seq = _next_sequence_nr()
        if seqs and seqs[-1] == seq:  # no node made since the last boundary
            names[-1] = name
            return
        if len(seqs) >= _EVENTS_KEPT:  # bounded: the oldest graphs lose their module names first
            del seqs[: _EVENTS_KEPT // 2], names[: _EVENTS_KEPT // 2]
        seqs.append(seq)
        names.append(name)

    @property
    def step(self):
        return self.steps.step

    def _step_began(self):
        self.names.new_step()
        self._wrapper.clear()
        self.trained = False
        self._backward_seen = False
        self.forward_stack.clear()  # nothing can still be running when a step begins
        self.backward.reset()
        self._task_grads.clear()
        self._nested.clear()
        self._task = NO_GRAPH_TASK

    def traced(self):
        return _get_ident() == self._thread or self._traced_elsewhere()

    # hooks -----------------------------------------------------------------
    def install(self):
        self._thread = _get_ident()
        err = self._on_error
        handles = self._handles  # each kept as it goes on: a failed install (Ctrl-C) leaves `remove()` all of them
        handles.clear()  # global module hooks no torch.compile'd module warns about (tracer.safety)
        handles.append(GlobalModuleHook(register_module_forward_pre_hook, _guarded(self._forward_pre, err)))
        handles.append(
            GlobalModuleHook(register_module_forward_hook, _guarded(self._forward_post, err), always_call=True)
        )
        handles.append(optim_hooks.register_optimizer_step_pre_hook(_guarded(self._optimizer_pre, err)))
        handles.append(optim_hooks.register_optimizer_step_post_hook(_guarded(self._optimizer_post, err)))

    def live_hooks(self):
        return self.backward.live_hooks()

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.backward.remove()
