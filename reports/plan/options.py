"""What a plan is asked beside its runs and its GPU: reports.plan.plan.plan's keywords and `optrace plan`'s options,
each with its default, written once (Options), and their check before any work (Options.checked)."""

import dataclasses
import functools
import inspect

from reports.errors import ReportError
from reports.plan import assumptions as assumed
from reports.plan import parallel
from reports.plan.comm import OVERLAPS
from reports.plan.devices import resolve_gpu
from reports.plan.target import generation


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """The arguments of a plan (their meanings: reports.plan.plan.plan's docstring)."""

    gpus_per_node: int = 8
    micro_batch: int | None = None
    batch: int | None = None
    overlap: str = "prefetch"
    assumptions: dict | None = None
    pp: int = 1
    micro_batches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    cp: int = 1
    calibrated: dict | None = None

    @property
    def shape(self):
        """(pp, micro_batches, schedule, virtual_stages, cp): the pipeline's and the ring's (reports.plan.parallel)."""
        return (self.pp, self.micro_batches, self.schedule, self.virtual_stages, self.cp)

    def checked(self, gpu):
        """The assumptions table of a plan on `gpu` ({name: (value, source)}), the arguments checked first."""
        parallel.check(*self.shape)
        gpus_per_node = self.gpus_per_node
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ReportError(f"plan: gpus_per_node must be an int >= 1, got {gpus_per_node!r}")
        for name, value in (("micro_batch", self.micro_batch), ("batch", self.batch)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ReportError(f"plan: {name} must be an int >= 1, got {value!r}")
        if self.overlap not in OVERLAPS:
            raise ReportError(f"plan: overlap must be one of {', '.join(OVERLAPS)}, got {self.overlap!r}")
        table = assumed.resolve(self.assumptions, generation(resolve_gpu(gpu)))  # a bad gpu name fails before any work
        table.update({n: v for n, v in (self.calibrated or {}).items() if table[n][1] != "given"})
        return table


def takes_options(function):
    """`function(head..., **options)` called as it was before Options: its options (Options' fields, in their order, each
    with its default) given by keyword or by position after `head`, shown in its signature (help, inspect.signature); a
    keyword it does not take, or one given twice, is `function`'s TypeError."""
    *head, _ = inspect.signature(function).parameters.values()
    keywords = [
        inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default)
        for f in dataclasses.fields(Options)
    ]
    signature = inspect.Signature([*head, *keywords])

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError as exc:
            raise TypeError(f"{function.__name__}() {exc}") from None
        first = [given.pop(p.name) for p in head]
        return function(*first, **given)

    call.__signature__ = signature
    return call
