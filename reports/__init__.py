"""optrace's reports: traces in, pandas DataFrames out (units in the column names)."""

from reports.compare import compare, save_baseline
from reports.distributed.collectives import comm_split
from reports.distributed.sql_ranks import collectives, imbalance, ranks
from reports.errors import ReportError
from reports.flops.breakdown import breakdown, explain
from reports.flops.coverage import uncounted
from reports.flops.meter import meter
from reports.flops.mfu import mfu
from reports.gate import check, gate
from reports.loading.load import load
from reports.memory.memory import by_category, peak, storages, timeline
from reports.memory.memory import by_dtype as memory_by_dtype
from reports.memory.views import copies, views
from reports.plan.plan import plan
from reports.steps import per_step
from reports.tables import by_dtype, by_module, by_op, by_phase, by_step
from reports.time.roofline import roofline, roofline_split

__all__ = [
    "ReportError", "load",
    "by_op", "by_module", "by_phase", "by_step", "by_dtype",
    "breakdown", "explain", "mfu", "per_step", "meter",
    "peak", "timeline", "by_category", "storages", "memory_by_dtype",
    "views", "copies", "compare", "check", "gate", "save_baseline", "uncounted",
    "roofline", "roofline_split",
    "collectives", "comm_split", "ranks", "imbalance", "plan",
]  # fmt: skip
