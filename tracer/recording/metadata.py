"""The run metadata a trace carries, and the storage roles (gradient, optimizer state).

Roles are learned while the run goes on (a gradient is a storage that autograd made
and `.grad` now holds); each part records the roles learned since the part before it,
and `schema.read_metadata` merges them.

Two size facts travel with the roles (as deltas per part, merged the same way), so that
the memory reports can follow every byte `live_bytes` counts:
  at_entry  [[id, bytes], ...]: every storage registered when the Tracer was entered
            (`register_at_entry`: parameters, buffers, gradients, the optimizer state of
            any optimizer holding the model's parameters, FSDP2's unsharded parameters),
            at its size then; all of them count in `live_bytes` from the first row
  resized   [[seq, id, bytes], ...]: a known storage changed size in place (FSDP2 resizes
            its unsharded parameters to 0 after use and back before the next); from the
            row with that seq on (its `live_bytes` is the first to count it), the storage
            holds that many bytes
"""

import datetime
import gc
import itertools
import platform
import sys
import weakref

import torch

from tracer.recording.compiled import strip_compiled
from tracer.recording.distributed import local_tensor
from tracer.schema import ROLE_KEYS, SCHEMA_VERSION


def dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


_DTYPE_NAMES = {}  # torch.dtype -> its name: str(dtype) costs about 1 us, asked per parameter at entry


def now():
    return datetime.datetime.now().isoformat(timespec="seconds")


def run_metadata(run_name, tokens, model, storage_id, named=None, buffers=None):
    """The metadata known when tracing starts; `storage_id(storage)` registers parameter storages. `named` and
    `buffers`: the model's `named_parameters()` and `buffers()` as lists, when the caller walked them already."""
    meta = {
        "schema_version": SCHEMA_VERSION,
        "complete": False,
        "run_name": run_name,
        "start_time": now(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": sys.platform,
        "tokens": tokens,
        "root_module": type(model).__name__ if model is not None else None,
        "device": None,
    }
    if model is not None:
        meta.update(_parameters(model, storage_id, named, buffers))
    return meta


def _parameters(model, storage_id, named=None, buffers=None):
    embedding = {
        id(p)
        for m in model.modules()
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
        for p in m.parameters(recurse=False)
    }
    params, dtype_bytes = {}, {}
    counts = {"total": 0, "trainable": 0, "embedding": 0}
    for name, p in model.named_parameters() if named is None else named:  # tied parameters once
        local = local_tensor(p)  # a DTensor (FSDP2) by the shard this rank holds
        params[strip_compiled(name)] = {
            "storage_id": storage_id(local.untyped_storage()),
            "numel": local.numel(),
            "shape": list(local.shape),
            "dtype": dtype_name(p.dtype),
            "trainable": p.requires_grad,
            "embedding": id(p) in embedding,
        }
        dtype_bytes[dtype_name(p.dtype)] = p.dtype.itemsize
        if local is not p:
            params[strip_compiled(name)]["global_shape"] = list(p.shape)
        counts["total"] += p.numel()  # whole parameters, also when sharded: N of 6·N·T
        counts["trainable"] += p.numel() if p.requires_grad else 0
        counts["embedding"] += p.numel() if id(p) in embedding else 0
    for b in model.buffers() if buffers is None else buffers:
        storage_id(b.untyped_storage())
    return {"params": counts, "parameters": params, "dtype_bytes": dtype_bytes}


AT_ENTRY, RESIZED = "at_entry", "resized"  # size facts kept beside the roles (see the module docstring)
_KEYS = (*ROLE_KEYS, AT_ENTRY, RESIZED)


class Roles:
    """Storage ids known to hold gradients or optimizer state, and the size facts, as deltas per part."""

    def __init__(self, known_id, live=()):
        self._known_id = known_id  # storage -> id, or None when the tracer never saw it
        self._live = live  # ids of the storages alive now (a container), to forget freed ones
        self._seen = set()  # ids given a role, while their storage lives (ids are never reused)
        self.new = {key: [] for key in _KEYS}

    def take(self):
        """The roles learned since the last call; ids of freed storages are forgotten here,
        so a long run keeps only its live gradients and optimizer state (set_to_none makes
        new gradient storages every step)."""
        new, self.new = self.new, {key: [] for key in _KEYS}
        self._seen = {sid for sid in self._seen if sid in self._live}
        return new

    def put_back(self, taken):
        """Undo a `take` whose part could not be written."""
        for key, ids in taken.items():
            self.new[key][:0] = ids

    def add(self, role, tensor):
        try:
            sid = self._known_id(local_tensor(tensor).untyped_storage())
        except Exception:  # tensors without storage (sparse, nested)
            return
        self.add_id(role, sid)

    def add_id(self, role, sid):
        """Give the storage id `sid` (None: a storage the tracer never saw) the role `role`, unless it has one."""
        if sid is not None and sid not in self._seen:
            self._seen.add(sid)
            self.new[role].append(sid)

    def gradients(self, params):
        for p in params:
            if p.grad is not None:
                self.add("gradient", p.grad)

    def optimizer_state(self, optimizer):
        for value in state_tensors(optimizer):
            self.add("optimizer_state", value)

    def resized(self, seq, sid, nbytes):
        self.new[RESIZED].append([seq, sid, nbytes])


def register_at_entry(model, table, roles, unsharded, next_seq, on_error, params=None):
    """Register every storage alive at entry that the trace can reach, with its role, and
    start following in-place resizes.

    From the model: the `.grad` of each parameter (the local shard's under FSDP2), the state
    of every optimizer holding one of its parameters (found among the live objects: an
    optimizer's own hooks fire only at its next step, after the forward and backward have
    run), and FSDP2's unsharded parameters (`UnshardedParameters.at_entry`). Parameters and
    buffers were registered by `run_metadata`. `next_seq()` is the seq of the next row; `params`: the model's
    parameters as a list, when the caller walked them already.
    Returns (the optimizers found, the ids of the model's parameters, the model's parameters as a list); (None, None,
    None) without a model, and where the walk failed."""
    found = param_ids = None
    if model is not None:
        try:
            params = list(model.parameters()) if params is None else params
            for p in params:  # registered and given its role at once: what Roles.gradients would look up again
                if p.grad is not None:
                    roles.add_id("gradient", _register(table, p.grad))
            param_ids, found = {id(p) for p in params}, []
            for optimizer in _optimizers(param_ids):
                found.append(optimizer)
                for value in state_tensors(optimizer):  # as Roles.optimizer_state, with no second look-up
                    roles.add_id("optimizer_state", _register(table, value))
            unsharded.at_entry()
        except Exception as exc:  # bookkeeping only: counted, the program goes on
            on_error(exc)
    roles.new[AT_ENTRY] = [[sid, size] for sid, size in table.size.items()]
    table.on_resize = lambda sid, nbytes: roles.resized(next_seq(), sid, nbytes)
    return found, param_ids, params if param_ids is not None else None


def _register(table, tensor):
    """The id of `tensor`'s storage (the local shard's under FSDP2), registered when new; None: it has none."""
    try:
        return table.id_of(local_tensor(tensor).untyped_storage())
    except Exception:  # tensors without storage (sparse, nested)
        return None


def state_tensors(optimizer):
    """The tensors of `optimizer`'s state (exp_avg, exp_avg_sq, step, ...)."""
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def _optimizers(ids):
    """The live optimizers holding a parameter whose id is in `ids`, among every live optimizer (`LIVE_OPTIMIZERS`)."""
    for obj in LIVE_OPTIMIZERS.live():
        if any(id(p) in ids for g in obj.param_groups for p in g["params"]):
            yield obj


def _optimizer_classes():
    """Optimizer's subclass tree: a class with a live instance is in it."""
    kinds, todo = {torch.optim.Optimizer}, [torch.optim.Optimizer]
    while todo:
        for kind in todo.pop().__subclasses__():
            if kind not in kinds:
                kinds.add(kind)
                todo.append(kind)
    return kinds


class _Probe:
    pass


def _counts_instances():
    """Whether making and freeing an instance of a class defined in Python moves the class's reference count by
    one each way here (it does on CPython with the GIL; a build without it may count them per thread)."""
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return False
    before = sys.getrefcount(_Probe)
    probe = _Probe()
    made = sys.getrefcount(_Probe)
    del probe
    return made == before + 1 and sys.getrefcount(_Probe) == before


class LiveOptimizers:
    """Every live optimizer of the process, for `register_at_entry` (one per process: LIVE_OPTIMIZERS).

    Found in one pass over the objects the garbage collector tracks, in C: type() reads no attribute of an
    object (some warn when one is read), and only the classes of Optimizer's subclass tree are kept. The pass
    costs about 0.1 us a tracked object, 35 ms in a process that imported torch and built the example GPT
    (benchmarks/per_trace.py), and every Tracer given model= ran it at entry. Later traces reuse the instances
    the last pass found (held by weak reference) while none can have been made or freed since: every instance of
    a class defined in Python holds a reference to its class, so with the same classes, each class's reference
    count what it was after the pass, and every instance found still alive, they are all there are. An optimizer
    made or freed, a new subclass, or a reference to an optimizer class taken or dropped runs the pass again.
    Not caught: an optimizer made while another reference to its class is dropped, with no instance found freed
    (`tracer.recording.optimizer_state.OptimizerState.started` names the state it finds at that optimizer's step). Where making an
    instance does not move its class's count (`_counts_instances`), every trace runs the pass."""

    def __init__(self):
        self._refs = None  # weak references to the instances the last pass found
        self._counts = None  # (weak reference to each class, its reference count after that pass)
        self.passes = 0
        self._reuse = None  # _counts_instances(), asked once

    def live(self):
        kinds = _optimizer_classes()
        if self._reuse is None:
            self._reuse = _counts_instances()
        if self._reuse and self._refs is not None:
            # counted with the references to the classes held as at the pass below (kinds alone: no dict of them
            # survives this line); a class freed since is a None key, so not equal
            if _class_counts(kinds) == {ref(): n for ref, n in self._counts}:
                found = [ref() for ref in self._refs]
                if all(obj is not None for obj in found):
                    return found
        self.passes += 1
        objects = gc.get_objects()
        found = list(itertools.compress(objects, map(kinds.__contains__, map(type, objects))))
        del objects  # it holds the classes too
        self._refs = [weakref.ref(obj) for obj in found]
        self._counts = [(weakref.ref(k), n) for k, n in _class_counts(kinds).items()]  # weak: no class kept alive
        return found


def _class_counts(kinds):
    return {k: sys.getrefcount(k) for k in kinds}


LIVE_OPTIMIZERS = LiveOptimizers()
