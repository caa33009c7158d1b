"""Distributed runs: which rank a trace is, its process groups, DTensors and FSDP2's parameters.

* `rank_info()` finds the rank from an initialised process group, or from the
  `RANK` / `WORLD_SIZE` / `LOCAL_RANK` variables torchrun sets; `rank_directory`
  gives each rank its own `path/rank=R` directory (hive layout: pandas, pyarrow,
  DuckDB and polars read `rank` as a column).
* `unwrap` gives the tensors an op on tensor subclasses is recorded with.
* `local_tensors` swaps DTensors for their local shards, so an op on a DTensor is
  recorded at the shapes that run on this rank (its local ops never reach the
  dispatch mode: DTensor runs them below it).
* `UnshardedParameters` finds the full parameters FSDP2 builds for the forward.

The collective ops themselves (what they write, move and cost) are in `tracer.recording.collectives`.
"""

import functools
import os

import torch
import torch.optim.optimizer as optimizer_hooks

from tracer.errors import TraceError
from tracer.safety import GlobalModuleHook
from tracer.store.directory import foreign_entry, make_parents

Tensor = torch.Tensor

RANK_DIR = "rank={}"


# --- rank and process groups -----------------------------------------------------------
def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() else None


def _env_int(name):
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise TraceError(f"environment variable {name}={value!r}: expected an integer rank or size") from None


def rank_info():
    """{rank, world_size, local_rank, backend} of this process, or None when it is not distributed."""
    dist = _dist()
    if dist is not None and dist.is_initialized():
        rank, world, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    else:
        rank, world, backend = _env_int("RANK"), _env_int("WORLD_SIZE"), None
        if rank is None or world is None:
            return None
    local = _env_int("LOCAL_RANK")
    return {"rank": rank, "world_size": world, "local_rank": rank if local is None else local, "backend": backend}


def process_groups():
    """[{name, size, ranks}] for every process group this process knows (global ranks, in group order)."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return []
    from torch.distributed import distributed_c10d as c10d

    found = []
    for group, name in list(c10d._world.pg_names.items()):
        ranks = c10d._world.pg_group_ranks.get(group, {})
        ordered = [g for g, _ in sorted(ranks.items(), key=lambda item: item[1])]
        found.append({"name": name, "size": group.size(), "ranks": ordered})
    return found


def rank_directory(path, rank, world_size):
    """Create `path` (shared by all ranks) and return `path/rank=R` for this rank.

    Rank 0 removes what an earlier trace left at `path` that would mix with this one:
    top-level parts of a single-process trace, and `rank=R` directories for R at or
    beyond the world size (only when they hold nothing but parts)."""
    make_parents(path)  # every rank: whichever comes first makes them
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"cannot write trace {path!r}: {exc.strerror or exc}") from None
    if rank == 0:
        _remove_stale(path, world_size)
    return os.path.join(path, RANK_DIR.format(rank))


def _refuse_foreign(path):
    """TraceError when `path` holds a file optrace did not write (tracer.store.directory.foreign_entry): a user's
    `part-00000-x.parquet` (Spark's) or `.part-mine.tmp` is never removed as stale. An entry the other ranks remove
    or write meanwhile (an earlier trace of their rank cleared) is looked at again."""
    for _ in range(3):
        foreign = foreign_entry(path)
        if foreign is None or os.path.lexists(os.path.join(path, foreign)):
            break
    if foreign is not None:
        raise TraceError(
            f"cannot write trace {path!r}: it is a directory holding {foreign!r}, which optrace did not "
            "write; choose a new path"
        )


def _is_part(name):
    return name.startswith(("part-", ".part-")) and name.endswith((".parquet", ".tmp"))


def _remove_stale(path, world_size):
    _refuse_foreign(path)
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full) and _is_part(name):
            os.remove(full)
        elif name.startswith("rank=") and name[5:].isdigit() and int(name[5:]) >= world_size and os.path.isdir(full):
            inside = os.listdir(full)
            if all(_is_part(n) for n in inside):
                for n in inside:
                    os.remove(os.path.join(full, n))
                os.rmdir(full)


# --- DTensor ---------------------------------------------------------------------------
@functools.cache
def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # a torch built without distributed
        return None
    return DTensor


def local_tensors(types, args, kwargs, out):
    """(args, kwargs, out) with every DTensor replaced by its local shard; unchanged when `types` has no DTensor."""
    dtensor = _dtensor_type()
    if dtensor is None or not any(issubclass(t, dtensor) for t in types):
        return args, kwargs, out
    from torch.utils._pytree import tree_map_only

    def local(t):
        return t._local_tensor

    return tree_map_only(dtensor, local, (args, kwargs, out))


@functools.cache
def _async_collective_type():
    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except Exception:
        return None
    return AsyncCollectiveTensor


def unwrap(types, args, kwargs, out, end, completions):
    """(args, kwargs, out) as recorded: DTensors as their local shards, AsyncCollectiveTensors
    as the tensors they wrap. An op on an AsyncCollectiveTensor waited for its collective
    first, so the collective completed by `end`."""
    args, kwargs, out = local_tensors(types, args, kwargs, out)
    act = _async_collective_type()
    if act is None or not any(issubclass(t, act) for t in types):
        return args, kwargs, out
    from torch.utils._pytree import tree_leaves, tree_map_only

    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, act):
            completions.waited(leaf.elem, end)
    return tree_map_only(act, lambda t: t.elem, (args, kwargs, out))


def requires_grad(args, kwargs):
    """Whether a tensor among an op's arguments requires grad, seen before `unwrap`: a DTensor or
    an AsyncCollectiveTensor of the autograd graph wraps a tensor that does not."""
    from torch.utils._pytree import tree_leaves

    return any(isinstance(t, Tensor) and t.requires_grad for t in tree_leaves((args, kwargs)))


def local_tensor(t):
    """The tensor itself, or a DTensor's local shard."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, Tensor) else t


class UnshardedParameters:
    """Storage ids of the unsharded parameters FSDP2 builds for the forward, by parameter name.

    FSDP2 swaps a module's sharded DTensor parameters for full plain ones while it runs
    (and back after; under tensor parallelism, DTensors on the tensor-parallel mesh, whose
    local tensors are the storages: any parameter object but the sharded one is the
    unsharded one); a global forward hook sees the full ones at each module's end,
    before FSDP2 reshards; those made before the trace are read from FSDP2's state at
    entry (`at_entry`). Their storage survives resharding (it is resized, not
    replaced), so one id per parameter holds for the whole trace.

    FSDP2 resizes those storages to 0 bytes and back outside the dispatcher; `sync`
    brings the storage table's sizes (and so `live_bytes`) up to date. It runs at every
    collective (where FSDP2 unshards and reshards), after each module's forward and
    before each optimizer step."""

    def __init__(self, model, storages, parameters, found, params=None):
        self._table = storages  # the tracer's StorageTable
        self._parameters = parameters or {}  # the sharded parameters' metadata: embedding, trainable
        self._found = found  # name -> {storage_id, numel, shape, dtype, ...}, written into the metadata
        self._handles = []
        dtensor = _dtensor_type()
        self._watch = {}  # id(module) -> [(attribute, parameter name)]
        self._storages = []  # the unsharded parameters' storages
        self._sharded = set()  # ids of the sharded parameters
        self._model = model
        if dtensor is None or model is None:
            return
        sharded = {id(p) for p in (model.parameters() if params is None else params) if isinstance(p, dtensor)}
        if not sharded:  # nothing to watch: no walk over the modules
            return
        self._sharded = sharded  # FSDP2 swaps each back in when it reshards: the same objects
        for prefix, module in model.named_modules():
            for attr, p in module.named_parameters(recurse=False):
                if id(p) in sharded:
                    self._watch.setdefault(id(module), []).append((attr, f"{prefix}.{attr}" if prefix else attr))

    def install(self):
        if self._watch:
            self._handles = handles = []  # each kept as it goes on: a failed install leaves `remove()` all of them
            handles.append(GlobalModuleHook(torch.nn.modules.module.register_module_forward_hook, self._after_forward))
            handles.append(optimizer_hooks.register_optimizer_step_pre_hook(lambda *_: self.sync()))

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def sync(self):
        """Bring the sizes of the unsharded parameters' storages up to date in the storage table."""
        try:
            for storage in self._storages:
                self._table.regrow(storage)
        except Exception:  # bookkeeping only
            pass

    def at_entry(self):
        """Register the unsharded parameters FSDP2 made before the trace (after an earlier step):
        each at its size now, 0 when resharded. FSDP2 keeps them in its `FSDPParam`s."""
        if not self._watch:
            return
        prefixes = {id(m): prefix for prefix, m in self._model.named_modules()}
        for module in self._model.modules():
            get_state = getattr(module, "_get_fsdp_state", None)
            if get_state is None:
                continue
            state = get_state()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:  # older torch: one group per state
                groups = [g for g in (getattr(state, "_fsdp_param_group", None),) if g is not None]
            for group in groups:
                for fsdp_param in group.fsdp_params:
                    p = fsdp_param.__dict__.get("_unsharded_param")  # made at the first all-gather
                    info = fsdp_param._module_info
                    prefix = prefixes.get(id(info.module))
                    if p is None or prefix is None:
                        continue
                    self._add(f"{prefix}.{info.param_name}" if prefix else info.param_name, local_tensor(p))

    def _add(self, name, p):
        storage = p.untyped_storage()
        self._storages.append(storage)
        self._found[name] = {
            "storage_id": self._table.id_of(storage),
            "numel": p.numel(),
            "shape": list(p.shape),
            "dtype": str(p.dtype).removeprefix("torch."),
            "embedding": bool(self._parameters.get(name, {}).get("embedding")),
            "trainable": bool(self._parameters.get(name, {}).get("trainable", True)),
        }

    def _after_forward(self, module, args, output):
        watched = self._watch.get(id(module))
        if not watched:
            return None
        self.sync()
        try:
            for attr, name in watched:
                p = module._parameters.get(attr)
                if p is None or name in self._found or id(p) in self._sharded:
                    continue  # still sharded, or already known
                self._add(name, local_tensor(p))  # under tensor parallelism a DTensor on the TP mesh
        except Exception:  # bookkeeping only: the forward goes on
            pass
        return None
