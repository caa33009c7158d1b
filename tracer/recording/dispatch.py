"""The dispatch mode behind `Tracer`: which ops are recorded, the facts kept per op, and the hook.

`_TraceMode.__torch_dispatch__` runs every aten op (and higher-order operator) exactly as
it would run untraced, times it with the tracer's timer and hands it to `Tracer._record`;
a bookkeeping error there becomes a count and a warning, never the program's exception.
In a forked child the mode becomes `_InertMode` (tracer.recording.mode `_after_fork_in_child`):
every op passes through, nothing is recorded.
"""

import functools
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracer.flops.formulas import _registry
from tracer.flops.op_kinds import METADATA_OPS, OUTPUT_ELEMENTS, ZERO, flop_rule, native_count
from tracer.recording import collectives, distributed
from tracer.recording.hops import HopInfo, hop_compile_running
from tracer.schema import FlopBasis

Tensor = torch.Tensor
_perf_ns = time.perf_counter_ns
_PLAIN = frozenset({Tensor, torch.nn.Parameter})  # `types` may name these (a Tensor method's detach): no subclass


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


# aten ops whose outputs never require grad, whatever their inputs (torchgen's DONT_REQUIRE_DERIVATIVE, the
# floating-point ones): `torch.zeros_like(loss)` after the optimizer opens no step (attribution.py `where`)
_GRAPHLESS = frozenset(
    """
    empty_like zeros_like ones_like full_like rand_like randn_like randint_like
    new_empty new_empty_strided new_zeros new_ones new_full
""".split()
)
_STORAGE_CHANGING = frozenset(
    {"aten::resize_", "aten::resize_as_", "aten::set_"}
)  # tagged inplace_view, yet they change the storage


class _OpInfo:
    """Facts about one op overload: those of the op alone, computed once per process while the FLOP
    registry is unchanged (`_op_info`), and its name and kind ids in one trace's string tables."""

    __slots__ = (
        "name",
        "name_id",
        "rule",
        "basis",
        "kind",
        "kind_id",
        "inplace",
        "written_positions",
        "written_names",
        "out_only",
        "collective",
        "graphless",
        "native",
    )

    def __init__(self, func):
        self.name = str(func)
        self.name_id = self.kind_id = None  # per trace: `named`
        self.rule = flop_rule(func)
        self.native = native_count(self.rule)  # the compiled hook's own count of it, or None (tracer.flops.op_kinds)
        self.kind = self.rule.kind
        self.graphless = func.namespace == "aten" and func._schema.name[6:] in _GRAPHLESS
        count = self.rule.count
        if count is ZERO:
            self.basis = int(FlopBasis.ZERO)
        elif count is OUTPUT_ELEMENTS:  # the writer counts the output elements
            self.basis = int(FlopBasis.PER_OUTPUT_ELEMENT)
        elif self.rule.detailed:  # count gives a FlopCount: FLOPs, bound, group sizes
            self.basis = int(FlopBasis.DETAILED)
        else:
            self.basis = int(FlopBasis.FORMULA)
        # Composite ops (linear, matmul, einsum) normally decompose before they reach
        # us; under inference_mode they arrive whole and run whole: tracer.flops.composite
        # has their formulas. The tracer never decomposes an op itself (that could change
        # what runs: a nested tensor's linear is not the composite's view + mm).
        # An in-place view op (t_, unsqueeze_, as_strided_: tagged inplace_view) changes only sizes
        # and strides: it writes no data, so it is a view, not an in-place write. resize_ and set_
        # carry the tag too but change the storage: they stay writes (the storage table follows them).
        metadata_only = (
            torch.Tag.inplace_view in getattr(func, "tags", ()) and func._schema.name not in _STORAGE_CHANGING
        )
        written = (
            []
            if metadata_only
            else [
                (i, a.name, a.kwarg_only)
                for i, a in enumerate(func._schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write
            ]
        )
        self.written_positions = tuple(i for i, _, _ in written)
        self.written_names = tuple(n for _, n, _ in written)
        self.out_only = tuple(kwarg_only for _, _, kwarg_only in written)  # out= arguments are keyword-only
        self.inplace = int(bool(written))
        self.collective = collectives.collective_op(func)  # c10d ops: their writes come from a table
        if self.collective is not None:
            self.kind, self.basis = self.collective.kind, int(FlopBasis.ZERO)
            self.inplace = self.collective.inplace  # in place, so never a view
            self.written_positions = (0,) if self.inplace else ()

    def named(self, names):
        """A copy of these facts with the name and kind ids of one trace's string tables (`names`)."""
        info = object.__new__(_OpInfo)
        for slot in _OpInfo.__slots__:
            setattr(info, slot, getattr(self, slot))
        info.name_id = names["op"].id(self.name)
        info.kind_id = names["kind"].id(self.kind)
        return info

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
_described = {}  # id(OpOverload) -> (the op, its _OpInfo without ids, its registry entry), shared by the traces of a process
_described_with = []  # the FLOP registry's (packet, entry) pairs those were made with


def _op_info(func, names):
    """The _OpInfo of `func` for a trace with string tables `names`. What it derives from the op alone
    (str(func), its FLOP rule, written arguments: about 40 us an op) is kept for the next traces, and
    made again once a FLOP formula was registered or replaced, also during a trace before the op's first
    call in it (tests/tracer/native/test_hot_path.py, tests/tracer/native/test_hot_path_vs_plain.py)."""
    entry = _registry.get(func.overloadpacket)  # its formula now: one registered in this trace counts too
    kept = _described.get(id(func))  # keyed by id: an OpOverload hashes in Python; the op kept keeps its id unique
    if kept is None or kept[2] is not entry:
        kept = _described[id(func)] = (func, _OpInfo(func), entry)
    return kept[1].named(names)


def _check_registry():
    """Forget the kept facts when the FLOP registry changed since they were made (once per trace)."""
    now = list(_registry.items())
    if len(now) != len(_described_with) or any(
        a is not c or b is not d for (a, b), (c, d) in zip(now, _described_with)
    ):
        _described.clear()
        _described_with[:] = now


class _TraceMode(TorchDispatchMode):
    """Runs every aten op and hands it to the tracer's `_record`."""

    supports_higher_order_operators = True  # HOPs run untraced, one row each (tracer.recording.hops)

    @classmethod
    def ignore_compile_internals(cls):
        return hop_compile_running()

    def __init__(self, tracer):
        super().__init__()
        self._tracer = tracer
        self._ops = {}  # id(OpOverload) -> _OpInfo, or None for ops passed through unrecorded
        self._seen = []  # the ops of those ids, kept so that an id is never reused (an OpOverload hashes in Python)
        _check_registry()

    def _describe(self, func):
        try:
            if not isinstance(func, torch._ops.OpOverload):  # a higher-order operator
                return HopInfo(func, self._tracer._writer.names)
            if _passthrough(func):
                return None
            return _op_info(func, self._tracer._writer.names)
        except Exception as exc:  # an op we cannot describe still runs, unrecorded
            self._tracer._record_failed(str(func), exc)
            return None

    def _info(self, func):
        """The op's facts (`_OpInfo`, a higher-order operator's `HopInfo`), or None for an op passed through
        unrecorded: described once per trace (the compiled hook asks here too)."""
        info = self._ops.get(id(func), _UNSEEN)
        if info is _UNSEEN:
            info = self._ops[id(func)] = self._describe(func)
            self._seen.append(func)
        return info

    def use_compiled(self, hot, hook):
        """Let the compiled hook (tracer/native/_dispatch.cpp) run every op: `hook` is `__torch_dispatch__` bound to this
        mode, `hot` its state. It hands back to the method below every op it does not record itself."""
        self._hot = hot
        self.__torch_dispatch__ = hook

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        info = self._info(func)
        if info is None:
            return func(*args, **kwargs)
        tracer = self._tracer
        timer = tracer._timer
        if timer.inline:  # a plain wall clock (tracer.recording.timing WallTimer): no timer call around the op
            start = _perf_ns()
            out = func(*args, **kwargs)
            duration = _perf_ns() - start
        else:
            start = timer.start()
            out = func(*args, **kwargs)
            duration = timer.stop(start)
        try:
            if tracer._storages._dead:  # frees noted since the last op (tracer.recording.storage)
                tracer._storages.collect()
            if types and not _PLAIN.issuperset(types):  # subclasses: DTensors at their local shapes (`out` as is)
                seen = distributed.unwrap(types, args, kwargs, out, start + duration, tracer._completions)
                tracer._record(info, *seen, start, duration, distributed.requires_grad(args, kwargs))
            else:
                tracer._record(info, args, kwargs, out, start, duration)
        except Exception as exc:  # never break the traced program over a bookkeeping error
            tracer._record_failed(info.name, exc)
        return out


class _InertMode(_TraceMode):
    """A forked child's tracer mode: every op runs as untraced and nothing is recorded, so
    the child never adds rows to, or writes parts of, its parent's trace."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def make_inert(mode):
    """Turn a live `_TraceMode` into an `_InertMode` in place (it may be on the mode stack)."""
    mode.__dict__.pop("__torch_dispatch__", None)  # the compiled hook, bound to this mode: the class's from now on
    mode.__class__ = _InertMode


@functools.cache
def compiled_spec():
    """What the compiled hook (tracer/native/_dispatch.cpp) takes from Python rather than restating: the row's fields,
    which it checks against its own, and the schema's and attribution's values it writes. Constants: made once per
    process (the hook only reads them)."""
    from tracer.recording.attribution import NO_SEQUENCE_NR, NOT_RECOMPUTE, RECOMPUTE
    from tracer.schema import CAUSAL_NONE, INT64_MAX, NO_VALUE, GradMode, Phase
    from tracer.store.writer import PER_OUTPUT_ELEMENT, ROW_FIELDS

    return {
        "row_fields": ROW_FIELDS,
        "forward": int(Phase.FORWARD),
        "backward": int(Phase.BACKWARD),
        "optimizer": int(Phase.OPTIMIZER),
        "causal_none": CAUSAL_NONE,
        "no_value": NO_VALUE,
        "per_output_element": PER_OUTPUT_ELEMENT,
        "int64_max": INT64_MAX,
        "basis_zero": int(FlopBasis.ZERO),
        "basis_per_element": int(FlopBasis.PER_OUTPUT_ELEMENT),
        "basis_formula": int(FlopBasis.FORMULA),
        "basis_detailed": int(FlopBasis.DETAILED),
        "not_recompute": NOT_RECOMPUTE,
        "recompute": RECOMPUTE,
        "grad": int(GradMode.GRAD),
        "no_grad": int(GradMode.NO_GRAD),
        "inference_mode": int(GradMode.INFERENCE_MODE),
        "no_sequence_nr": NO_SEQUENCE_NR,
        "op_info_type": _OpInfo,
        "plain_types": (Tensor, torch.nn.Parameter),
        "op_call": torch._ops.OpOverload.__call__,
    }
