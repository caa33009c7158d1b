"""Fused optimizer steps: counted as the same optimizer's foreach path counts the same step.

`torch.optim.Adam`, `AdamW`, `SGD` and `Adagrad` with `fused=True` run one op per device and dtype
(`aten._fused_adam_`, `_fused_adamw_`, `_fused_sgd_`, `_fused_adagrad_`; their functional twins without
the trailing underscore count the same). With `foreach=True` the same update runs as `_foreach_*` ops
(torch.optim.adam._multi_tensor_adam, sgd._multi_tensor_sgd, adagrad._multi_tensor_adagrad), each
counted 1 FLOP per element of its first list (tracer.flops.formulas). A fused op counts, per element of
its `self` list (the parameters), the number of parameter-sized `_foreach_*` ops that path runs for the
flags the op is given, so a fused and a foreach run of the same model and flags count the same FLOPs.
The step counter's `_foreach_add_` runs outside the fused op on both paths and is counted there.

Passes per parameter element, by the op's arguments (`passes`):

- Adam, AdamW: 7 (lerp_ of exp_avg, mul_ and addcmul_ of exp_avg_sq, sqrt, div_ by the bias
  correction, add_ of eps, addcdiv_ into the parameter), +1 with weight_decay != 0 (AdamW's mul_ of
  the parameter, Adam's add of it to the gradient), +1 amsgrad (maximum_), +1 maximize (neg).
- SGD: 1 (add_ into the parameter), +1 maximize, +1 weight_decay != 0, +2 with momentum != 0 after the
  first step (mul_ and add_ of the buffer; the first step copies the gradient), +1 nesterov.
- Adagrad: 5 (addcmul_ into the sum, sqrt, add_ of eps, mul_ by the step size, addcdiv_ into the
  parameter), +1 maximize, +1 weight_decay != 0.
- Each: +1 with a grad_scale (GradScaler passes it to a fused step, which unscales the gradients
  itself; a foreach step's gradients are unscaled before it by `_amp_foreach_non_finite_check_and_unscale_`,
  1 per gradient element). Around a fused step GradScaler also runs ops of its own, counted as they
  run: that check once more with a scale of 1 (1 per gradient element) and a `_foreach_sub_` of
  found_inf from the step counters, so a fused run under a GradScaler counts more than a foreach one.

Where the foreach path's count differs for the same update, the fused count is the default path's:
`capturable=True` (CUDA only; _multi_tensor_adam then runs one more div_ over the parameters and 8 ops over
the step counters; a tensor `lr` requires it there), a step whose `found_inf` is set (the fused op runs and counts, a
GradScaler skips the foreach step), and an SGD whose momentum buffers exist for some parameters only
(foreach updates those one by one: 2 per element of those).
"""

from collections.abc import Callable

__all__ = ["FUSED_OPTIMIZERS", "passes"]


def _adam(get) -> int:
    return 7 + (get("weight_decay") != 0) + bool(get("amsgrad")) + bool(get("maximize")) + _scaled(get)


def _sgd(get) -> int:
    momentum = get("momentum") != 0
    return (
        1
        + bool(get("maximize"))
        + (get("weight_decay") != 0)
        + 2 * (momentum and not get("is_first_step"))
        + (momentum and bool(get("nesterov")))
        + _scaled(get)
    )


def _adagrad(get) -> int:
    return 5 + bool(get("maximize")) + (get("weight_decay") != 0) + _scaled(get)


def _scaled(get) -> int:
    return get("grad_scale") is not None


# aten packet name: passes(get), get(name) giving the op's argument `name`
FUSED_OPTIMIZERS: dict[str, Callable] = {
    "_fused_adam_": _adam,
    "_fused_adamw_": _adam,
    "_fused_sgd_": _sgd,
    "_fused_adagrad_": _adagrad,
    "_fused_adam": _adam,
    "_fused_adamw": _adam,
    "_fused_sgd": _sgd,
    "_fused_adagrad": _adagrad,
}


def passes(name, get) -> int:
    """FLOPs per parameter element of the fused optimizer op `name` (a key of FUSED_OPTIMIZERS)."""
    return int(FUSED_OPTIMIZERS[name](get))
