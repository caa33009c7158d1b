"""A gate on compare: limits on how much a run may change against a baseline, for CI.

    check("runs/model", "base.json", ["flops>+1%", "peak_live_bytes>+5%"])   # -> [Breach, ...]
    gate("runs/model", "base.json", ["flops>+1%"])                           # raises Breached

An expression names a change that is a breach:

    EXPR    = [SCOPE ":" NAME ":"] METRIC CMP LIMIT
    SCOPE   = phase | op | module      (none: the whole run's total)
    METRIC  = ops | flops | bytes_allocated | peak_live_bytes | traced_us
    CMP     = > | >= | < | <=
    LIMIT   = [+|-]NUMBER%   the change in percent of the baseline's value
            | [+|-]NUMBER    the change in the metric's unit (ops, FLOPs, bytes per step; bytes; us per step)

`flops>+1%` breaches when a run's FLOPs per step exceed the baseline's by more than 1%;
`op:aten.mm.default:flops>+0%` when that op's FLOPs rose at all; `peak_live_bytes<-20%` when the peak fell by more
than a fifth (a gate against a stale baseline). A module NAME is the module and its submodules (compare by
module at the depth of NAME). Every run but the baseline (the first) is checked against it; when the baseline is a
rank of a distributed trace, each run against that trace's run of its rank (reports.compare.baselines_of), that
trace's ranks unchecked. A key in no run is an error
(a typo would pass for ever); a peak that cannot be compared (the key has no op in one run) is a breach.
"""

import math
import operator
import re
from dataclasses import dataclass

from reports.errors import ReportError

__all__ = ["METRICS", "Breach", "Breached", "Rule", "check", "gate", "parse", "FORM"]

METRICS = {
    "ops": "ops_per_step",
    "flops": "flops_per_step",
    "bytes_allocated": "bytes_allocated_per_step",
    "peak_live_bytes": "peak_live_bytes",
    "traced_us": "traced_us_per_step",
}
_UNITS = {
    "ops": "ops/step",
    "flops": "FLOPs/step",
    "bytes_allocated": "B/step",
    "peak_live_bytes": "B",
    "traced_us": "us/step",
}
_CMP = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
FORM = "[phase|op|module:NAME:]METRIC(>|>=|<|<=)[+|-]NUMBER[%], e.g. 'flops>+1%' or 'op:aten.mm.default:flops>+0%'"
_EXPR = re.compile(
    r"^(?:(?P<scope>phase|op|module):(?P<name>.+):)?(?P<metric>[A-Za-z_]+)\s*(?P<cmp>>=|<=|>|<)\s*"
    r"(?P<limit>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<pct>%?)$"
)


@dataclass(frozen=True)
class Rule:
    """One parsed --fail-if expression."""

    text: str
    scope: str  # "total", "phase", "op" or "module"
    name: str  # the key ("total" for the whole run)
    metric: str
    cmp: str
    limit: float
    percent: bool


@dataclass(frozen=True)
class Breach:
    """A run whose change broke a rule: its value, the baseline's and the change (percent or in the metric's unit)."""

    rule: str
    run: str
    baseline: str
    key: str
    metric: str
    value: float
    base: float
    change: float
    percent: bool

    def __str__(self):
        unit = _UNITS[self.metric]
        where = "total" if self.key == "total" else self.key
        if math.isnan(self.change):
            return f"{self.rule}: {self.run} {where} {self.metric} cannot be compared (no op of the key in one run)"
        moved = "new" if math.isinf(self.change) else f"{self.change:+.2f}{'%' if self.percent else ' ' + unit}"
        return (
            f"{self.rule}: {self.run} {where} {self.metric} {_number(self.value)} {unit} against "
            f"{_number(self.base)} in {self.baseline} ({moved})"
        )


class Breached(AssertionError):
    """gate's failure: one line per breach."""


def _number(v):
    return "N/A" if v != v else (f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}")


def _float(v):
    return math.nan if v is None else float(v)


def parse(expr):
    """The Rule of a --fail-if expression; ReportError naming it and the expected form."""
    found = _EXPR.match(str(expr).strip()) if isinstance(expr, str) else None
    if not found:
        raise ReportError(f"compare: --fail-if {expr!r}: expected {FORM}")
    metric = found["metric"]
    if metric not in METRICS:
        raise ReportError(f"compare: --fail-if {expr!r}: metric {metric!r} is not one of {', '.join(METRICS)}")
    scope = found["scope"] or "total"
    name = found["name"] or "total"
    return Rule(expr.strip(), scope, name, metric, found["cmp"], float(found["limit"]), bool(found["pct"]))


def check(trace, baseline, exprs):
    """The breaches ([Breach], empty when every rule holds) of the --fail-if expressions `exprs` by `trace` against
    `baseline`: each a trace path or a baseline file (reports.baseline); `trace` may also be a list of them (each
    checked)."""
    from reports.compare import runs_of_sources

    rules = [parse(e) for e in ([exprs] if isinstance(exprs, str) else exprs)]  # every error before any work
    traces = list(trace) if isinstance(trace, (list, tuple)) else [trace]
    return breaches(runs_of_sources([baseline, *traces]), rules)


def breaches(runs, rules, baseline=None):
    """[Breach] of parsed `rules` over [reports.compare.Figures]."""
    from reports.compare import TOTAL, baselines_of, rows_of, side_by_side_runs, signed_change

    names = [r.name for r in runs]
    pairs = baselines_of(runs, baseline)
    tables, out = {}, []
    for rule in rules:
        by = "phase" if rule.scope == "total" else rule.scope
        depth = rule.name.count(".") + 1 if by == "module" else None
        if (by, depth) not in tables:
            tables[by, depth] = side_by_side_runs(runs, by, baseline, depth)
        table = tables[by, depth]
        key = TOTAL if rule.scope == "total" else (f"{TOTAL} ({by})" if rule.name == TOTAL else rule.name)
        rows = {row["run"]: row for row in rows_of({c: a[table[by] == key] for c, a in table.items()})}
        if not rows:
            raise ReportError(
                f"compare: --fail-if {rule.text!r}: no {rule.scope} {rule.name!r} in any run ({', '.join(names)})"
            )
        column = METRICS[rule.metric]
        for run in names:
            if pairs[run] == run:  # a baseline
                continue
            value, base = _float(rows[run][column]), _float(rows[pairs[run]][column])
            if rule.percent:
                change = float(signed_change([value], [base])[0])
            else:
                change = value - base
            if change != change or _CMP[rule.cmp](change, rule.limit):
                out.append(Breach(rule.text, run, pairs[run], key, rule.metric, value, base, change, rule.percent))
    return out


def gate(trace, baseline, exprs):
    """check, raising Breached (an AssertionError, one line per breach) when a run breaks a rule: for a test."""
    found = check(trace, baseline, exprs)
    if found:
        raise Breached("\n".join(map(str, found)))
