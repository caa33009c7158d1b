"""The public `Tracer` context manager and the dispatch mode behind it."""

import os
import time
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracer import collectives, distributed
from tracer.attribution import Attribution
from tracer.device import cuda_memory, cuda_sync_for, device_info
from tracer.errors import TraceError
from tracer.flops import has_formula
from tracer.metadata import Roles, dtype_name, now, run_metadata
from tracer.op_kinds import METADATA_OPS, OUTPUT_ELEMENTS, ZERO, flop_rule
from tracer.schema import CAUSAL_NONE, NO_VALUE
from tracer.storage import StorageTable
from tracer.writer import (
    FIELD,
    PER_OUTPUT_ELEMENT,
    ROW_WIDTH,
    PartWriter,
    RowBuffer,
    prepare_directory,
)

Tensor = torch.Tensor
_perf_ns = time.perf_counter_ns


def _tensors(args, kwargs):
    """Tensor arguments in order, looking one level into lists (cat, _foreach_*)."""
    found = []
    for a in args:
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    found.append(b)
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, Tensor):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, Tensor):
                        found.append(b)
    return found


def _passthrough(func):
    """Ops that are not computation: tensor metadata queries and profiler markers."""
    return func in METADATA_OPS or func.namespace == "profiler"


class _OpInfo:
    """Facts about one op overload, computed once per trace."""

    __slots__ = (
        "name", "name_id", "rule", "basis", "kind_id", "decompose", "inplace",
        "written_positions", "written_names", "out_only", "collective",
    )  # fmt: skip

    def __init__(self, func, names):
        self.name = str(func)
        self.name_id = names["op"].id(self.name)
        self.rule = flop_rule(func)
        self.kind_id = names["kind"].id(self.rule.kind)
        # 0: no FLOPs; 1: one per output element (the hook has that count already); 2: ask the rule
        self.basis = 0 if self.rule.count is ZERO else 1 if self.rule.count is OUTPUT_ELEMENTS else 2
        # Composite ops (linear, matmul, einsum) normally decompose before they reach
        # us; under inference_mode they arrive whole. Decompose them here, as training
        # would, so their FLOPs are counted once, through mm/bmm/addmm.
        self.decompose = func._can_decompose() and not has_formula(func)
        written = [
            (i, a.name, a.kwarg_only)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ]
        self.written_positions = tuple(i for i, _, _ in written)
        self.written_names = tuple(n for _, n, _ in written)
        self.out_only = tuple(kwarg_only for _, _, kwarg_only in written)  # out= arguments are keyword-only
        self.inplace = int(bool(written))
        self.collective = collectives.collective_op(func)  # c10d ops: their writes come from a table
        if self.collective is not None:
            self.kind_id, self.basis, self.decompose = names["kind"].id(self.collective.kind), 0, False
            self.inplace = self.collective.inplace  # in place, so never a view
            self.written_positions = (0,) if self.inplace else ()

    def written(self, args, kwargs):
        """(tensor, is an out= argument) for each tensor the op writes into (in-place self, out=)."""
        if self.collective is not None:
            return self.collective.written(args, kwargs)
        found = []
        for pos, name, is_out in zip(self.written_positions, self.written_names, self.out_only):
            value = args[pos] if pos < len(args) else kwargs.get(name)
            if isinstance(value, Tensor):
                found.append((value, is_out))
            elif isinstance(value, (list, tuple)):
                found.extend((v, is_out) for v in value if isinstance(v, Tensor))
        return found


_UNSEEN = object()


class _TraceMode(TorchDispatchMode):
    """Runs every aten op and hands it to the tracer's `_record`."""

    def __init__(self, tracer):
        super().__init__()
        self._tracer = tracer
        self._ops = {}  # OpOverload -> _OpInfo, or None for ops passed through unrecorded

    def _describe(self, func):
        if _passthrough(func):
            return None
        try:
            return _OpInfo(func, self._tracer._writer.names)
        except Exception as exc:  # an op we cannot describe still runs, unrecorded
            self._tracer._record_failed(str(func), exc)
            return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        info = self._ops.get(func, _UNSEEN)
        if info is _UNSEEN:
            info = self._ops[func] = self._describe(func)
        if info is None:
            return func(*args, **kwargs)
        if info.decompose:
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        tracer = self._tracer
        sync = tracer._sync
        if sync is not None:
            sync()
        start = _perf_ns()
        out = func(*args, **kwargs)
        if sync is not None:
            sync()
        duration = _perf_ns() - start
        try:
            if types:  # tensor subclasses: record DTensors at their local shapes (the program gets `out` as is)
                seen = distributed.unwrap(types, args, kwargs, out, start + duration, tracer._completions)
                tracer._record(info, *seen, start, duration)
            else:
                tracer._record(info, args, kwargs, out, start, duration)
        except Exception as exc:  # never break the traced program over a bookkeeping error
            tracer._record_failed(info.name, exc)
        return out


class Tracer:
    """Trace every aten op run inside `with Tracer(path): ...` to a Parquet trace at `path`.

    path       where the trace goes: a directory of Parquet parts, which
               `pandas.read_parquet(path)` reads as one table. Its parent
               directory must exist. An earlier trace at `path` is replaced.
               Under a process group or torchrun, each rank writes `path/rank=R`.
    model      optional nn.Module: names modules (the root by its class name,
               children by their dotted path) and records parameter counts and
               the storage ids of parameters.
    tokens     optional tokens per training step (for the 6·N·T accounting).
    run_name   optional label for reports; default: the trace's file name.
    flush_rows rows per Parquet part; memory held by the tracer stays bounded
               by this many rows.

    The step counter advances when an optimizer step ends or on `step()`.
    The tracer keeps no tensor alive: it holds storages through weak references.
    """

    _active = None

    def __init__(self, path, *, model=None, tokens=None, run_name=None, flush_rows=16384):
        if not isinstance(path, (str, os.PathLike)):
            raise TraceError(f"Tracer: path must be a str or os.PathLike, got {type(path).__name__}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TraceError(f"Tracer: model must be a torch.nn.Module or None, got {type(model).__name__}")
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0):
            raise TraceError(f"Tracer: tokens must be a positive int (tokens per step) or None, got {tokens!r}")
        if run_name is not None and not isinstance(run_name, str):
            raise TraceError(f"Tracer: run_name must be a str or None, got {type(run_name).__name__}")
        if not isinstance(flush_rows, int) or isinstance(flush_rows, bool) or flush_rows <= 0:
            raise TraceError(f"Tracer: flush_rows must be a positive int, got {flush_rows!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.model = model
        self.tokens = tokens
        self.run_name = run_name or os.path.splitext(os.path.basename(self.path))[0]
        self.flush_rows = flush_rows
        self._writer = None
        self._closed = False

    # context manager ---------------------------------------------------------
    def __enter__(self):
        if Tracer._active is not None:
            raise TraceError(
                f"another Tracer is already active (writing {Tracer._active.path!r}); "
                f"close it before starting one for {self.path!r}"
            )
        if self._writer is not None:
            raise TraceError(f"this Tracer (writing {self.path!r}) was already used; create a new one")
        self._rank = distributed.rank_info()
        directory = self.path
        if self._rank is not None:  # one directory per rank: path/rank=R
            directory = distributed.rank_directory(self.path, self._rank["rank"], self._rank["world_size"])
        self._writer = PartWriter(prepare_directory(directory))
        self._completions = collectives.Completions(FIELD["duration_ns"], FIELD["busy_ns"], ROW_WIDTH)
        self._storages = StorageTable()
        self._rows = RowBuffer()
        self._dtype_ids = {}  # torch.dtype -> dtype name id
        self._device_ids = {}  # torch.device -> device name id
        self._module_ids = {}  # module name -> module name id
        self._writer.clock_offset_ns = time.time_ns() - _perf_ns()
        self._flush_at = self.flush_rows * ROW_WIDTH
        self._errors = 0
        self._lost_rows = 0  # rows whose part could not be written
        self._device = None
        self._sync = None
        self._roles = Roles(self._storages.known)
        self._meta = run_metadata(self.run_name, self.tokens, self.model, self._storages.id_of)
        if self._rank is not None:
            self._meta.update(self._rank, process_groups=distributed.process_groups())
        self._unsharded = distributed.UnshardedParameters(
            self.model, self._storages, self._meta.get("parameters"), self._meta.setdefault("unsharded_parameters", {})
        )
        first = next(self.model.parameters(), None) if self.model is not None else None
        if first is not None:
            self._first_device(first.device)
        self._attr = Attribution(
            self.model,
            on_optimizer_start=lambda opt: self._roles.gradients(p for g in opt.param_groups for p in g["params"]),
            on_step_end=self._roles.optimizer_state,
        )
        self._attr.install()
        self._unsharded.install()
        self._mode = _TraceMode(self)
        Tracer._active = self
        self._mode.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._mode.__exit__(None, None, None)
        finally:
            self._attr.remove()
            self._unsharded.remove()
            Tracer._active = None
        if exc is not None:
            self._meta["error"] = f"{exc_type.__name__}: {exc}"
        try:
            self._close(complete=exc is None)
        except Exception as write_error:
            if exc is None:
                raise TraceError(f"could not finish trace {self.path!r}: {write_error}") from write_error
            warnings.warn(f"optrace: could not finish trace {self.path!r}: {write_error}")
        return False

    def step(self):
        """Mark the end of a training step (the optimizer hooks do this on their own)."""
        self._roles.gradients(self.model.parameters() if self.model is not None else ())
        self._attr.next_step()

    @property
    def current_step(self):
        return self._attr.step if self._writer is not None else 0

    def set_step_time(self, timing):
        """Record the untraced step time used for MFU: seconds, or the dict `time_step` returns.

        Works inside the `with` block or after it (it then adds one empty part
        carrying the updated metadata)."""
        if isinstance(timing, (int, float)) and not isinstance(timing, bool) and timing > 0:
            timing = {"median_s": float(timing)}
        if not isinstance(timing, dict) or not (isinstance(timing.get("median_s"), float) and timing["median_s"] > 0):
            raise TraceError(f"set_step_time: expected seconds > 0 or the dict time_step returns, got {timing!r}")
        if self._writer is None:
            raise TraceError("set_step_time: the Tracer has not been entered yet")
        self._meta["step_time"] = timing
        if self._closed:
            self._writer.write(RowBuffer(), self._metadata())

    def set_ceiling(self, ceiling):
        """Record the achievable matmul FLOP/s (the dict `matmul_ceiling` returns) for "of achievable" MFU."""
        if not isinstance(ceiling, dict) or not isinstance(ceiling.get("flops_per_s"), float):
            raise TraceError(f"set_ceiling: expected the dict matmul_ceiling returns, got {ceiling!r}")
        if self._writer is None:
            raise TraceError("set_ceiling: the Tracer has not been entered yet")
        self._meta["ceiling"] = ceiling
        if self._closed:
            self._writer.write(RowBuffer(), self._metadata())

    # the hot path ------------------------------------------------------------------
    def _record(self, info, args, kwargs, out, start, duration):
        rows = self._rows
        tensors = rows.tensors
        dims = rows.dims
        storages = self._storages
        known = storages._by_cdata.get
        size_of = storages.size.__getitem__
        dtype_of = self._dtype_ids.get
        try:
            collective = info.collective
            if collective is not None:
                ins, outs = collective.tensors(args, kwargs, out)
            else:
                ins = _tensors(args, kwargs)
                if isinstance(out, Tensor):
                    outs = (out,)
                elif isinstance(out, (list, tuple)):
                    outs = [o for o in out if isinstance(o, Tensor)]
                elif out is None and info.written_positions:  # returns nothing: its outputs are what it wrote
                    outs = [t for t, _ in info.written(args, kwargs)]
                else:
                    outs = ()
            registered = storages.registered_bytes
            for side, group in enumerate((ins, outs)):
                if side:  # storages first seen as outputs were made by this op; inputs existed before
                    registered = storages.registered_bytes
                for t in group:
                    shape = t.shape
                    st = t.untyped_storage()
                    sid = known(st._cdata)
                    if sid is None:
                        sid = storages.register(st)
                    dtype = dtype_of(t.dtype)
                    if dtype is None:
                        dtype = self._new_dtype(t.dtype)
                    tensors.extend((len(shape), dtype, sid, size_of(sid)))
                    dims.extend(shape)
                    dims.extend(t.stride())
            inplace_bytes = out_bytes = 0
            if info.written_positions:
                for t, is_out in info.written(args, kwargs):
                    n = t.numel() * t.element_size()
                    inplace_bytes += n
                    if is_out:  # out= tensors are written, not read
                        out_bytes += n
                    storages.regrow(t.untyped_storage())
            allocated = storages.registered_bytes - registered
            basis = info.basis
            flops = 0 if basis == 0 else PER_OUTPUT_ELEMENT if basis == 1 else info.rule.count(args, kwargs, out)
            causal = CAUSAL_NONE if info.rule.causal is None else int(bool(info.rule.causal(args, kwargs)))
            phase, module = self._attr.where()
            module_id = self._module_ids.get(module)
            if module_id is None:
                module_id = self._new_module(module)
            device = ins[0].device if ins else outs[0].device if outs else None
            device_id = self._device_ids.get(device)
            if device_id is None:
                device_id = self._new_device(device)
            comm_bytes = group_size = NO_VALUE
            group_id = 0
            if collective is not None:
                comm_bytes, group_size, group_id = self._collective(collective, args, kwargs, out, outs, start, duration, device)
        except BaseException:
            rows.rollback()
            raise

        # from here on nothing can fail: the row's integers, in writer.ROW_FIELDS order
        freed = storages.freed
        n_freed = len(freed)
        if n_freed:
            rows.freed.extend(freed)
            freed.clear()
        rows.ints.extend((
            self._attr.step, info.name_id, phase, module_id, device_id, info.kind_id,
            info.inplace, causal, flops, allocated, storages.live_bytes, inplace_bytes, out_bytes, duration,
            len(ins), len(outs), n_freed,
            0, start, duration, 0, comm_bytes, group_size, group_id,
        ))  # fmt: skip
        if len(rows.ints) >= self._flush_at:
            self._flush()

    def _collective(self, op, args, kwargs, out, outs, start, duration, device):
        """(comm_bytes, group_size, process-group name id) of a collective row; tracks its completion."""
        comm_bytes, group_size, group = op.describe(args, kwargs)
        self._unsharded.sync()  # FSDP2 resharded or unsharded since the last one
        seq = self._rows.first_seq + len(self._rows)
        self._completions.launched(seq, start, start + duration, op, out, outs, device)
        return comm_bytes, group_size, self._writer.names["process_group"].id(group)

    def _new_dtype(self, dtype):
        dtype_id = self._dtype_ids[dtype] = self._writer.names["dtype"].id(dtype_name(dtype))
        self._writer.itemsize[dtype_id] = dtype.itemsize
        return dtype_id

    def _new_module(self, name):
        module_id = self._module_ids[name] = self._writer.names["module"].id(name)
        return module_id

    def _new_device(self, device):
        if device is None:
            name = ""
        else:
            name = str(device)
            if self._device is None:
                self._first_device(device)
        device_id = self._device_ids[device] = self._writer.names["device"].id(name)
        return device_id

    def _record_failed(self, op, exc):
        self._errors += 1
        if self._errors == 1:
            warnings.warn(f"optrace: could not record {op} ({type(exc).__name__}: {exc}); the op ran normally")

    # the rest ----------------------------------------------------------------------
    def _first_device(self, device):
        self._device = device
        self._sync = cuda_sync_for(device.type)
        self._meta["device"] = device_info(device)
        memory = cuda_memory(device)
        if memory is not None:
            self._meta["cuda_memory"] = {"start": memory}

    def _flush(self):
        meta = self._metadata()
        rows, self._rows = self._rows, RowBuffer(self._rows.first_seq + len(self._rows))
        self._completions.apply(rows)  # collectives end when their work completed, not at launch
        meta["collectives_untimed"] = self._completions.untimed
        try:
            self._writer.write(rows, meta)
        except BaseException:  # the rows are lost (seq keeps counting); their storage roles are not
            self._lost_rows += len(rows)
            self._roles.put_back(meta["storage_roles"])
            raise

    def _close(self, complete):
        if self.model is not None:
            self._roles.gradients(self.model.parameters())
        memory = cuda_memory(self._device)
        if memory is not None:
            self._meta.setdefault("cuda_memory", {})["end"] = memory
        self._meta["complete"] = complete
        self._meta["end_time"] = now()
        groups = distributed.process_groups() if self._rank is not None else None
        if groups:  # groups made while tracing (FSDP2's, DeviceMesh's); none if destroyed inside the block
            self._meta["process_groups"] = groups
        self._closed = True
        try:
            self._flush()
        finally:
            self._storages.clear()

    def _metadata(self):
        meta = dict(self._meta)
        meta["rows"] = self._writer.rows + len(self._rows)
        meta["record_errors"] = self._errors
        meta["lost_rows"] = self._lost_rows
        meta["storage_roles"] = self._roles.take()
        return meta
