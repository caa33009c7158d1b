"""Where `optrace report` takes each table from: a reports.sql.engine.Trace of the run, over its files or over its
rows loaded into memory (Trace.over: `--engine pandas`, and the traces the Trace does not read from their files).
Each table is a pyarrow.Table (a one-row result a dict of Python values), made without pandas (reports.sql.tables'
*_arrow, reports.time.roofline.roofline_tables, reports.distributed.sql_ranks' *_table): the printed report and
--json never load it.
Breakdown, explain and MFU run on the small Arrow table reports.sql.flops cuts from the trace
(tests/reports/sql/test_sql_flops.py); the memory categories, the meter and the distributed sections come from their
SQL views (tests/reports/sql/test_sql_sections.py); the rank sections take a Source over every rank."""

from reports.errors import ReportError

__all__ = ["Source"]


class Source:
    """The report's tables of one run: `sql` a reports.sql.engine.Trace of that run."""

    def __init__(self, sql):
        self.sql = sql
        self._flop_rows = self._categories = None
        self._made = {}  # (method, arguments) -> its table: the headline, the text sections and --json read one each

    def _once(self, key, make):
        """make()'s result, made on the first call with `key` (a ReportError it raised raised again)."""
        if key not in self._made:
            try:
                self._made[key] = (make(), None)
            except ReportError as exc:
                self._made[key] = (None, exc)
        found, error = self._made[key]
        if error is not None:
            raise error
        return found

    # ------------------------------------------------------------ FLOP sections: breakdown, explain, MFU
    def flop_rows(self):
        """The rows breakdown, explain and MFU run on (a reports.flops.rows.Frame): reports.sql.flops's small
        table of the trace (made once)."""
        if self._flop_rows is None:
            from reports.flops.rows import Frame
            from reports.sql.flops import table

            self._flop_rows = Frame(table(self.sql), self.sql.runs, {})  # one split: accounts' and mfu's Rows
        return self._flop_rows

    def accounts(self):
        """reports.flops.accounting.analyse with the report's N and T, one analysis for breakdown and explain;
        raises ReportError for a trace without model= or tokens=."""
        from reports.flops.accounting import analyse

        return self._once("accounts", lambda: analyse(self.flop_rows(), "matmul", None, "breakdown"))

    def breakdown(self, accounts):
        """reports.breakdown's table (a pyarrow.Table: phase, flops, expected_flops, ...)."""
        from reports.flops.breakdown import breakdown_table

        # the accounts held beside the table: their id is not handed to another analysis while this Source lives
        made = self._once(
            ("breakdown", id(accounts)), lambda: (breakdown_table(self.flop_rows(), accounts=accounts), accounts)
        )
        return made[0]

    def explain(self, accounts):
        from reports.flops.explain import explain_lines

        return explain_lines(self.flop_rows(), accounts=accounts)

    def mfu(self, step_time_s=None, peak_flops=None):
        """reports.mfu's row of the run, as {column: value}."""
        from reports.flops.mfu import mfu_table
        from reports.flops.rows import first_row

        return self._once(
            ("mfu", step_time_s, peak_flops),
            lambda: first_row(mfu_table(self.flop_rows(), step_time_s=step_time_s, peak_flops=peak_flops)),
        )

    def count_steps(self):
        """Training steps of the run (reports.steps.count_steps)."""
        from reports.sql.tables import count_steps

        return count_steps(self.sql)

    def phase_flops(self):
        """{phase: FLOPs per step, "total": ...} (reports.steps.per_step), numbers as --json prints them."""
        from reports.output.text import json_number
        from reports.sql.tables import phase_flops

        return self._once("phase_flops", lambda: {k: json_number(v) for k, v in phase_flops(self.sql).items()})

    def bounds(self):
        from reports.sql.tables import bounds

        return self._once("bounds", lambda: bounds(self.sql))

    def uncounted(self):
        """reports.uncounted's rows of the run (op, ops, duration_us, time_pct)."""
        from reports.sql.tables import uncounted_arrow

        return self._once("uncounted", lambda: uncounted_arrow(self.sql))

    def top_ops(self, top):
        from reports.sql.tables import top_ops_arrow

        return self._once(("top_ops", top), lambda: top_ops_arrow(self.sql, top))

    def by_module(self):
        """reports.by_module's rows of the run (module, depth, parent, ops, subtree_ops, flops, ...)."""
        from reports.sql.tables import modules_arrow

        return self._once("by_module", lambda: modules_arrow(self.sql))

    def roofline_with_split(self):
        """(the roofline by op and dtype, the split by bound per step): reports.time.roofline's pyarrow Tables."""
        from reports.time.roofline import roofline_tables

        return roofline_tables(self.sql)

    def peak(self):
        """The run's peak row of reports.peak ({run, peak_live_bytes, seq, step, phase, module, op})."""
        from reports.sql.tables import peak_rows

        return self._once("peak", lambda: peak_rows(self.sql)[0])

    def views(self):
        """reports.views' rows (kind, op, ops, bytes_allocated, bytes_written, allocated_pct)."""
        from reports.sql.tables import views_arrow

        return views_arrow(self.sql)

    # ---- memory categories, meter, distributed (reports.memory.sql_categories, reports.distributed.sql_ranks):
    # the rank sections take a Source over every rank (one run per rank)
    @property
    def runs(self):
        """{run name: metadata} of the runs this Source holds."""
        return self.sql.runs

    def run(self):
        """(name, metadata) of the report's run: the first this Source holds."""
        return next(iter(self.runs.items()))

    def ops(self):
        """The rows of the report's run."""
        return int(self.sql.run_rows[0]["ops"]) if self.sql.run_rows else 0

    def steps_traced(self):
        """The distinct step numbers of the report's run."""
        return int(self.sql.run_rows[0]["steps_traced"]) if self.sql.run_rows else 0

    def categories(self):
        """reports.by_category at the run's peak (a pyarrow.Table: category, bytes, ...), made once (the headline
        and the memory section both read it)."""
        if self._categories is None:
            from reports.memory.sql_categories import by_category

            # the FLOP rows stay: report --json's sections read them after (made again, a query of every row)
            self._categories = by_category(self.sql)
        return self._categories

    def meter_summary(self):
        """The meter section (reports.flops.meter.meter_summary): it reads only the runs' metadata."""
        from reports.flops.meter import meter_summary

        return meter_summary(self.runs)

    def job(self, present):
        """reports.distributed.ranks job_summary of the first run; None outside a process group."""
        from reports.distributed.sql_ranks import job_summary

        return job_summary(self.sql, present)

    def multi_rank(self):
        from reports.distributed.sql_ranks import is_multi_rank

        return is_multi_rank(self.sql)

    def ranks(self):
        from reports.distributed.sql_ranks import ranks_table

        return ranks_table(self.sql)

    def imbalance(self):
        from reports.distributed.sql_ranks import imbalance_table

        return imbalance_table(self.sql)

    def lowest_rank_collectives(self):
        """reports.distributed.collectives collectives of the lowest rank's runs."""
        from reports.distributed.sql_ranks import lowest_rank_collectives

        return lowest_rank_collectives(self.sql)

    def rank_summary(self):
        """{"ranks": [...], "imbalance": [...]} of `report --json` on a trace of several ranks."""
        summary = {"ranks": self.ranks().to_pylist(), "imbalance": self.imbalance().to_pylist()}
        for record in summary["ranks"]:  # a rank cut short or that raised is named, as the first line names rank 0
            meta = self.runs.get(record["run"]) or {}
            record["complete"], record["error"] = bool(meta.get("complete")), meta.get("error")
            record["meter_errors"] = int(
                (meta.get("meter") or {}).get("errors") or 0
            )  # its Meter's bookkeeping failures
        return summary
