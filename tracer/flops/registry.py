"""The FLOP formula registry: `register_flop_formula` files a formula under the op packets it counts, which
tracer.flops.op_kinds.flop_rule looks up first; `FlopCount`, what a detailed rule counts. The conventions the
formulas follow are in tracer.flops.formulas."""

from collections.abc import Callable
from typing import NamedTuple

import torch

from tracer.errors import TraceError
from tracer.schema import FLOP_KINDS


class FlopCount(NamedTuple):
    """What a detailed rule counts (tracer.flops.grouped, nested tensors): FLOPs, whether they
    are an upper bound rather than a count (schema column flops_bound), and the group sizes
    (column group_sizes: rows per group of a grouped matmul, lengths per sequence), or None."""

    flops: int
    bound: bool = False
    group_sizes: tuple | None = None


aten = torch.ops.aten
_registry: dict[torch._ops.OpOverloadPacket, tuple[Callable[..., int], str]] = {}


def register_flop_formula(targets, kind: str = "matmul"):
    """Decorator: register fn as the FLOP formula of one op packet or a list of them.

    fn(*args, out_shape=None, **kwargs) -> int gets every tensor replaced by its shape (a
    tuple of ints; lists of tensors become lists of shapes) and out_shape, the output's
    shape (a tuple of shapes for multi-output ops), as in torch.utils.flop_counter.
    Targets are OpOverloadPackets (`torch.ops.aten.mm`, `torch.ops.mylib.foo`) and the
    formula covers every overload; an OpOverload (`aten.mm.default`) is refused, not
    widened silently. Register before tracing: the tracer caches rules per overload.
    """
    if kind not in FLOP_KINDS:
        raise TraceError(f"register_flop_formula: kind {kind!r} is not one of {', '.join(FLOP_KINDS)}")
    packets = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    for target in packets:
        if isinstance(target, torch._ops.OpOverload):
            raise TraceError(
                f"register_flop_formula: got the OpOverload {target}; pass its packet "
                f"{target.overloadpacket}, whose formula covers every overload"
            )
        if not isinstance(target, torch._ops.OpOverloadPacket):
            raise TraceError(
                "register_flop_formula: expected an OpOverloadPacket such as "
                f"torch.ops.aten.mm, got {target!r} of type {type(target).__name__}"
            )

    def decorator(fn):
        for target in packets:
            if target in _registry:
                raise TraceError(
                    f"register_flop_formula: {target._qualified_op_name} already has "
                    f"a FLOP formula ({getattr(_registry[target][0], '__name__', '?')})"
                )
        _registry.update((target, (fn, kind)) for target in packets)
        return fn

    return decorator


def _packets(*names) -> list:
    """The aten packets of these names that this torch has (older versions lack a few)."""
    return [getattr(aten, name) for name in names if hasattr(aten, name)]


def has_formula(func) -> bool:
    """Whether the op (an OpOverload) has a registered formula."""
    return func.overloadpacket in _registry
