"""Two views of a run made from the Trace's one read of its parts (reports.sql.rowpass) instead of a DuckDB scan
of the files each: module_own (each module's own ops, FLOPs, bytes allocated, time and first seq) and peak (the row
after which live_bytes is highest, the first on a tie); and the _steps grain (`Steps`: each run's groups per step and
phase, which reports.sql.scan otherwise makes by a scan of their own: kept_grains).

Each consumer sums exact integers per part, as DuckDB sums them, and gives `table(run)`: its rows as an Arrow Table,
from which reports.sql.engine makes the view (`SELECT`), with views.sql's columns and DuckDB types; None when a sum
passes int64 (the view is then scan.py's, over the files). tests/reports/sql/test_sql_scan.py compares them with their definitions.
"""

import numpy as np
import pyarrow as pa

from reports.arrays import array_of, arrow_of, numpy_of, strings
from reports.sql.kept_ops import sums
from reports.sql.rowpass import CodeBook

__all__ = ["ModuleOwn", "Peak", "Steps", "kept_grains", "kept_views"]

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


def kept_grains(db, kept, runs, scanned=()):
    """{grain: its body} of the grains (reports.sql.scan.GRAINS) that consumers in `kept` ({(type, run index):
    consumer}: those with `grain`, taken out of it) made of every run's rows, each run's over a table of its rows on
    connection `db`; `runs`: the runs' names as SQL literals, in order. A grain some run has no consumer of (the
    report of several ranks keeps run 0's), or whose sums pass int64, is left to scan.py's scan, as are those named
    in `scanned` (a grain whose keys the consumer does not make: the _ops grain with flop_rest's)."""
    fed = {}
    for key, consumer in list(kept.items()):
        if getattr(consumer, "grain", None) is not None:
            del kept[key]
            if consumer.grain not in scanned:
                fed.setdefault(consumer.grain, {})[key[1]] = consumer
    made = {}
    for grain, consumers in fed.items():
        tables = [consumers[i].table() if i in consumers else None for i in range(len(runs))]
        if any(rows is None for rows in tables):
            continue
        selects = []
        for i, (run, rows) in enumerate(zip(runs, tables)):
            db.register("_kept_rows", rows)
            db.execute(f"CREATE TABLE _kept{grain}_{i} AS SELECT * FROM _kept_rows")
            db.unregister("_kept_rows")
            selects.append(consumers[i].select(f"_kept{grain}_{i}", run, i, len(runs) > 1))
        made[grain] = " UNION ALL ".join(selects)
    return made


class ModuleOwn:
    """views.sql's module_own of one run."""

    columns = ("seq", "module", "flops", "bytes_allocated", "duration_ns")
    view = "module_own"
    SELECT = (
        "SELECT run, run_index, module, ops, CAST(flops AS HUGEINT) AS flops, CAST(bytes_allocated AS HUGEINT) AS "
        "bytes_allocated, CAST(duration_ns AS DOUBLE) / 1000.0 AS duration_us, first_seq FROM {table}"
    )

    def __init__(self, rows=None, codes=None):
        self.module = (codes if codes is not None else CodeBook())["module"]
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
    """Per code `found` of `code` (dense codes below `size`): the sum of its `values` (int64) as a Python int (summed
    by reports.sql.kept_ops.sums: in float64 where that is exact, else in 32-bit halves)."""
    high, low = sums(values, code, size)
    return [(h << 32) + lo for h, lo in zip(high[found].tolist(), low[found].tolist())]


class Peak:
    """views.sql's peak of one run: the first row with its highest live_bytes."""

    columns = ("seq", "step", "phase", "module", "op", "live_bytes")
    view = "peak"
    SELECT = "SELECT run, run_index, peak_live_bytes, seq, step, phase, module, op FROM {table}"

    def __init__(self, rows=None, codes=None):
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


class Steps:
    """reports.sql.scan's _steps grain of one run (with flop_steps' last seq and recompute flag): per step
    and phase, the ops, the sums of FLOPs, bytes allocated and time (exact, in 32-bit halves), the highest live bytes,
    the first seq, the recomputed rows' FLOPs and count, the last seq and whether a row was recomputed. The columns are
    never null (the statistics' checks), recompute aside (null: not recomputed, as the grain reads it)."""

    columns = ("seq", "step", "phase", "flops", "bytes_allocated", "duration_ns", "live_bytes", "recompute")
    grain = "_steps"
    _SUMMED = ("flops", "bytes_allocated", "duration_ns", "recompute_flops")

    @staticmethod
    def select(table, run, run_index, several):
        """The grain's rows of run `run_index` (named `run`, a SQL literal) from `table` (of `table()`), in the grain's
        columns and DuckDB types; of a trace of `several` runs, without flop_steps' columns (reports.sql.scan.grains)."""
        flop = "" if several else ", last_seq, recompute"
        return (
            f"SELECT {run} AS run, {int(run_index)} AS run_index, step, CAST(phase AS VARCHAR) AS phase, ops, "
            "CAST(flops AS HUGEINT) AS flops, CAST(bytes_allocated AS HUGEINT) AS bytes_allocated, "
            "CAST(duration_ns AS HUGEINT) AS duration_ns, live_bytes_peak, first_seq, "
            "CAST(recompute_flops AS HUGEINT) AS recompute_flops, CAST(recompute_ops AS HUGEINT) AS recompute_ops"
            f"{flop} FROM {table}"
        )

    def __init__(self, rows=None, codes=None):
        self.phase = (codes if codes is not None else CodeBook())["phase"]
        self.parts = []  # per part: its runs of rows of one step and phase, as arrays (see feed)

    def feed(self, table):
        """The part's runs of consecutive rows of one step and phase (rows come in seq order: a few runs a part)."""
        step, phase = numpy_of(table.column("step")), self.phase.of(table.column("phase"))
        if not len(step):
            return
        starts = np.flatnonzero(np.concatenate(([True], (step[1:] != step[:-1]) | (phase[1:] != phase[:-1]))))
        ends = np.append(starts[1:], len(step))
        recompute = (
            numpy_of(table.column("recompute"), null=False)
            if "recompute" in table.column_names
            else np.zeros(len(step), dtype=bool)
        )
        flops = numpy_of(table.column("flops"))
        summed = {"recompute_flops": np.where(recompute, flops, 0), "flops": flops}
        found = {"step": step[starts], "phase": phase[starts], "ops": ends - starts}
        for c in self._SUMMED:
            values = summed[c] if c in summed else numpy_of(table.column(c))
            found[c + "_high"] = np.add.reduceat(values >> 32, starts)
            found[c + "_low"] = np.add.reduceat(values & 0xFFFFFFFF, starts)
        found["live_bytes_peak"] = np.maximum.reduceat(numpy_of(table.column("live_bytes")), starts)
        seq = numpy_of(table.column("seq"))
        found["first_seq"], found["last_seq"] = seq[starts], seq[ends - 1]  # seq increases (the Trace's checks)
        found["recompute_ops"] = np.add.reduceat(recompute.astype(np.int64), starts)
        found["recompute"] = np.logical_or.reduceat(recompute, starts)
        self.parts.append(found)

    def table(self):
        """The groups as a Table for SELECT (sums as int64), in step and phase order; None when a sum passes int64."""
        runs = {c: np.concatenate([p[c] for p in self.parts]) for c in self.parts[0]} if self.parts else None
        if runs is None:
            return pa.table(
                {
                    "step": arrow_of(np.zeros(0, np.int64)),
                    "phase": strings([]),
                    **{
                        c: arrow_of(np.zeros(0, np.int64))
                        for c in ("ops", *self._SUMMED[:3], "live_bytes_peak", "first_seq", *self._SUMMED[3:])
                    },
                    "recompute_ops": arrow_of(np.zeros(0, np.int64)),
                    "last_seq": arrow_of(np.zeros(0, np.int64)),
                    "recompute": arrow_of(np.zeros(0, bool)),
                }
            )
        order = np.lexsort((runs["phase"], runs["step"]))
        step, phase = runs["step"][order], runs["phase"][order]
        starts = np.flatnonzero(np.concatenate(([True], (step[1:] != step[:-1]) | (phase[1:] != phase[:-1]))))
        out = {
            "step": step[starts],
            "phase": strings([self.phase.names[k] for k in phase[starts].tolist()]),
            "ops": np.add.reduceat(runs["ops"][order], starts),
        }
        for c in self._SUMMED:  # halves summed per group (each under 2**31 times the rows), then joined exactly
            high = np.add.reduceat(runs[c + "_high"][order], starts)
            low = np.add.reduceat(runs[c + "_low"][order], starts)
            high, low = high + (low >> 32), low & 0xFFFFFFFF
            if len(high) and (high.max() >= 2**31 or high.min() < -(2**31)):  # a total past int64: the scan's grain
                return None
            out[c] = high * (1 << 32) + low
        out["live_bytes_peak"] = np.maximum.reduceat(runs["live_bytes_peak"][order], starts)
        out["first_seq"] = np.minimum.reduceat(runs["first_seq"][order], starts)
        out["recompute_ops"] = np.add.reduceat(runs["recompute_ops"][order], starts)
        out["last_seq"] = np.maximum.reduceat(runs["last_seq"][order], starts)
        out["recompute"] = np.logical_or.reduceat(runs["recompute"][order], starts)
        self.parts = None
        return pa.table({c: v if c == "phase" else arrow_of(v) for c, v in out.items()})
