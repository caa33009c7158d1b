"""Two views of a run made from the Trace's one read of its parts (reports/sql/rowpass.py) instead of a DuckDB scan
of the files each: module_own (each module's own ops, FLOPs, bytes allocated, time and first seq) and peak (the row
after which live_bytes is highest, the first on a tie).

Each consumer sums exact integers per part, as DuckDB sums them, and gives `table(run)`: its rows as an Arrow Table,
from which reports/sql/engine.py makes the view (`SELECT`), with views.sql's columns and DuckDB types; None when a sum
passes int64 (the view is then scan.py's, over the files). tests/reports/sql/test_sql_scan.py compares them with their definitions.
"""

import numpy as np
import pyarrow as pa

from reports.arrays import array_of, arrow_of, numpy_of, strings
from reports.sql.rowpass import Codes

__all__ = ["ModuleOwn", "Peak", "kept_views"]

_INT64 = 2**63


def kept_views(db, kept, run):
    """{view: its body} of the views the consumers of run 0's rows in `kept` ({key: consumer}: those with `view`, taken
    out of it) made, each over a table of its rows on connection `db`; none for a trace of several runs (`run` None)."""
    made = {}
    for key, consumer in list(kept.items()):
        if getattr(consumer, "view", None) is None:
            continue
        del kept[key]
        rows = None if run is None else consumer.table(run)
        if rows is not None:  # else the view as scan.py makes it (a sum past int64)
            db.register("_kept_rows", rows)
            db.execute(f"CREATE TABLE _kept_{consumer.view} AS SELECT * FROM _kept_rows")
            db.unregister("_kept_rows")
            made[consumer.view] = consumer.SELECT.format(table=f"_kept_{consumer.view}")
    return made


class ModuleOwn:
    """views.sql's module_own of one run."""

    columns = ("seq", "module", "flops", "bytes_allocated", "duration_ns")
    view = "module_own"
    SELECT = (
        "SELECT run, run_index, module, ops, CAST(flops AS HUGEINT) AS flops, CAST(bytes_allocated AS HUGEINT) AS "
        "bytes_allocated, CAST(duration_ns AS DOUBLE) / 1000.0 AS duration_us, first_seq FROM {table}"
    )

    def __init__(self, rows=None):
        self.module = Codes()
        self.sums = {}  # {module code: [ops, flops, bytes_allocated, duration_ns, first seq]}

    def feed(self, table):
        code = self.module.of(table.column("module"))
        size = len(self.module.names)  # codes are dense: per code by bincount and ufunc.at, no sort of the rows
        counts = np.bincount(code, minlength=size)
        found = np.flatnonzero(counts)
        first = np.full(size, len(code), dtype=np.int64)
        np.minimum.at(first, code, np.arange(len(code), dtype=np.int64))
        seq = numpy_of(table.column("seq"))[first[found]]
        sums = [
            _exact(numpy_of(table.column(c)), code, size, found) for c in ("flops", "bytes_allocated", "duration_ns")
        ]
        for k, m in enumerate(found.tolist()):
            known = self.sums.get(m)
            if known is None:
                self.sums[m] = [int(counts[m]), sums[0][k], sums[1][k], sums[2][k], int(seq[k])]
            else:
                known[0] += int(counts[m])
                for j in range(3):
                    known[j + 1] += sums[j][k]

    def table(self, run):
        rows = sorted(self.sums.items(), key=lambda item: item[1][4])
        if any(v >= _INT64 for _, found in rows for v in found[1:4]):  # a total past int64: the scan's view
            return None
        return pa.table(
            {
                "run": strings([run] * len(rows)),
                "run_index": arrow_of(np.zeros(len(rows), np.int32)),
                "module": strings([self.module.names[m] for m, _ in rows]),
                **{
                    name: array_of([found[j] for _, found in rows], pa.int64())
                    for j, name in enumerate(("ops", "flops", "bytes_allocated", "duration_ns", "first_seq"))
                },
            }
        )


def _exact(values, code, size, found):
    """Per code `found` of `code` (dense codes below `size`): the sum of its `values` (int64 >= 0) as a Python int
    (summed in halves)."""
    high, low = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    np.add.at(high, code, values >> 32)
    np.add.at(low, code, values & 0xFFFFFFFF)
    return [(h << 32) + lo for h, lo in zip(high[found].tolist(), low[found].tolist())]


class Peak:
    """views.sql's peak of one run: the first row with its highest live_bytes."""

    columns = ("seq", "step", "phase", "module", "op", "live_bytes")
    view = "peak"
    SELECT = "SELECT run, run_index, peak_live_bytes, seq, step, phase, module, op FROM {table}"

    def __init__(self, rows=None):
        self.top = None  # (live bytes, seq, step, phase, module, op)

    def feed(self, table):
        live = numpy_of(table.column("live_bytes"))
        at = int(np.argmax(live))  # the first of this part's highest
        if self.top is None or live[at] > self.top[0]:
            self.top = (int(live[at]), *(table.column(c)[at].as_py() for c in ("seq", "step", "phase", "module", "op")))

    def table(self, run):
        found = [self.top] if self.top is not None else []
        names = ("peak_live_bytes", "seq", "step", "phase", "module", "op")
        kinds = (pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.string(), pa.string())
        return pa.table(
            {
                "run": strings([run] * len(found)),
                "run_index": arrow_of(np.zeros(len(found), np.int32)),
                **{n: array_of([t[j] for t in found], k) for j, (n, k) in enumerate(zip(names, kinds))},
            }
        )
