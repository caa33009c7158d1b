"""Higher-order operators (flex_attention, cond, while_loop, ...): run untraced, one row each.

A HigherOrderOperator reaches a dispatch mode only when the mode declares
`supports_higher_order_operators`; otherwise PyTorch raises. The tracer declares it and
runs each HOP exactly as it would run untraced (the mode is off while it runs, so the
ops inside it are not rows of their own), then records one row for the whole call,
named `higher_order.<name>`, with FLOPs where a formula exists:

  flex_attention            attention forward on [b, h, s, d] query, key and value
                            NB: the score_mod / mask_mod are not counted, and a block
                            mask's skipped blocks still count (the full score matrix).
  flex_attention_backward   attention backward, 2.5x the forward (scores recomputed)
  anything else (cond, while_loop, map, tag_activation_checkpoint, ...): 0, "unknown".

Eager `flex_attention` and `torch.cond` compile their HOP call with Dynamo's eager
backend inside `setup_compilation_env`; `hop_compile_running` lets that compile
through the tracer's mode (PyTorch then runs the mode around the compiled call only).
"""

from tracer.flops.formulas import attention_backward_flop_count, attention_flop_count
from tracer.flops.op_kinds import FlopRule
from tracer.schema import FlopBasis


def _shape(t):
    return tuple(t.shape)


def _flex_forward(args, kwargs, out):
    q, k, v = (_shape(t) for t in args[:3])
    # [b, h, s_q, d] x [b, h_kv, s_k, d] x [b, h_kv, s_k, d_v] -> [b, h, s_q, d_v]
    return attention_flop_count(q[0], q[1], q[2], k[2], q[3], v[3])


def _flex_backward(args, kwargs, out):
    q, k, v = (_shape(t) for t in args[:3])
    return attention_backward_flop_count(q[0], q[1], q[2], k[2], q[3], v[3])


def _zero(args, kwargs, out):
    return 0


_RULES = {
    "flex_attention": FlopRule("attention", _flex_forward),
    "flex_attention_backward": FlopRule("attention", _flex_backward),
}


class HopInfo:
    """The facts `Tracer._record` reads about an op, for one higher-order operator."""

    __slots__ = (
        "name",
        "name_id",
        "rule",
        "basis",
        "kind_id",
        "inplace",
        "written_positions",
        "collective",
        "graphless",
    )

    def __init__(self, hop, names):
        self.name = f"higher_order.{hop.name()}"
        self.name_id = names["op"].id(self.name)
        self.rule = _RULES.get(hop.name(), FlopRule("unknown", _zero))
        self.kind_id = names["kind"].id(self.rule.kind)
        self.basis = int(FlopBasis.FORMULA)  # ask the rule
        self.inplace = 0
        self.written_positions = ()
        self.collective = None
        self.graphless = False


def hop_compile_running():
    """True while PyTorch compiles a HOP call for eager use (flex_attention, cond)."""
    try:
        from torch._higher_order_ops.utils import _hop_compile_tls
    except ImportError:  # older torch: no such compile
        return False
    return bool(getattr(_hop_compile_tls, "in_hop_compile", False))
