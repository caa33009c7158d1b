"""optrace's reports: traces in, pandas DataFrames out (units in the column names).

The names are imported on first use (PEP 562 `__getattr__`): `optrace report` imports only the modules its
sections run, and none of them pandas."""

import importlib
import sys
import types

# {public name: (module, its name there)}
_WHERE = {
    "ReportError": ("reports.errors", "ReportError"),
    "load": ("reports.loading.load", "load"),
    "by_op": ("reports.tables", "by_op"),
    "by_module": ("reports.tables", "by_module"),
    "by_phase": ("reports.tables", "by_phase"),
    "by_step": ("reports.tables", "by_step"),
    "by_dtype": ("reports.tables", "by_dtype"),
    "breakdown": ("reports.flops.breakdown", "breakdown"),
    "explain": ("reports.flops.breakdown", "explain"),
    "mfu": ("reports.flops.mfu", "mfu"),
    "per_step": ("reports.steps", "per_step"),
    "meter": ("reports.flops.meter", "meter"),
    "peak": ("reports.memory.memory", "peak"),
    "timeline": ("reports.memory.memory", "timeline"),
    "by_category": ("reports.memory.memory", "by_category"),
    "storages": ("reports.memory.memory", "storages"),
    "memory_by_dtype": ("reports.memory.memory", "by_dtype"),
    "views": ("reports.memory.views", "views"),
    "copies": ("reports.memory.views", "copies"),
    "compare": ("reports.compare", "compare"),
    "check": ("reports.gate", "check"),
    "gate": ("reports.gate", "gate"),
    "save_baseline": ("reports.compare", "save_baseline"),
    "uncounted": ("reports.flops.coverage", "uncounted"),
    "roofline": ("reports.time.roofline", "roofline"),
    "roofline_split": ("reports.time.roofline", "roofline_split"),
    "collectives": ("reports.distributed.sql_ranks", "collectives"),
    "comm_split": ("reports.distributed.collectives", "comm_split"),
    "ranks": ("reports.distributed.sql_ranks", "ranks"),
    "imbalance": ("reports.distributed.sql_ranks", "imbalance"),
    "plan": ("reports.plan.plan", "plan"),
}

__all__ = list(_WHERE)


def __getattr__(name):
    """A public name, imported from its module on first use and kept here (a second use reads the module's dict)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'reports' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package, whose public names `compare`, `gate` and `plan` are also its submodules' names: the import system
    binds a submodule to its name here when it is first imported (`import reports.compare`), which would hide the
    function of that name from __getattr__; the function stays the name's value, as when the package imported it."""

    def __setattr__(self, name, value):
        if name in _WHERE and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
