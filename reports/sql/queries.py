"""What a Trace answers from its views: any query's rows (`sql`, `arrow`, `table`), per-step figures from a view of
totals per phase (`per_step`, `per_step_arrow`: each phase's total over the steps it ran in, reports.steps' order) and
which int64 sums could wrap (`wide`, `sums`: pandas sums those as float64). A part of reports.sql.engine.Trace."""

import numpy as np

from reports.arrays import values_of
from reports.sql.per_step import floats, per_step_arrays
from reports.steps import INT64_MAX

__all__ = ["Queries"]


class Queries:
    """The query methods of reports.sql.engine.Trace (its `db`, `runs`, `run_rows`, `_totals` and `_phase_steps`)."""

    def sql(self, query):
        """The result of any query over `rows` and the views, as a DataFrame (DuckDB's dtypes)."""
        return self.db.execute(query).fetchdf()

    def arrow(self, query):
        """The result of any query over `rows` and the views, as a pyarrow Table (DuckDB's Arrow types)."""
        return self.db.sql(query).to_arrow_table()

    def table(self, view, order=None, where=None):
        """A view's rows, ordered by `order` (SQL), in DuckDB's dtypes (reports.sql.tables casts the sums)."""
        query = f"SELECT * FROM {view}" + (f" WHERE {where}" if where else "") + (f" ORDER BY {order}" if order else "")
        return self.db.execute(query).fetchdf()

    def wide(self, column, run_index=0):
        """Whether an int64 sum of `column` over the run's rows could wrap (so pandas sums it as float64)."""
        if self._totals is None:  # {run_index: its row of run_totals}, once (asked per column and run of each table)
            self._totals = {int(r["run_index"]): r for r in self.run_rows}
        t = self._totals.get(run_index)
        if t is None or f"{column}_max" not in t:
            return False
        return int(t[f"{column}_max"]) * int(t["ops"]) > INT64_MAX  # values are >= 0 (checked)

    def sums(self, frame, columns, run_index=0):
        """`frame` with each summed column int64, or float64 where pandas would have summed it as float64."""
        for c in columns:
            if c in frame.columns:
                frame[c] = frame[c].astype("float64" if self.wide(c, run_index) else "int64")
        return frame

    def phase_steps(self):
        """{run_index: {phase: steps}} (reports.steps.phase_steps); read once (a trace's rows do not change)."""
        if self._phase_steps is None:
            self._phase_steps = {i: {} for i in range(len(self.runs))}
            for run_index, phase, steps in self.db.execute(
                "SELECT run_index, phase, steps FROM phase_steps"
            ).fetchall():
                self._phase_steps[int(run_index)][phase] = int(steps)
            for row in self.run_rows:
                run_index, fb, traced = row["run_index"], row["fb_steps"], row["steps_traced"]
                found = self._phase_steps[int(run_index)]
                if "other" in found:  # over at least the run's training steps (reports.steps._steps_per_phase)
                    found["other"] = max(found["other"], int(fb or traced))
        return {i: dict(steps) for i, steps in self._phase_steps.items()}

    def per_step(self, totals, columns, keys=()):
        """Per-step figures from a view of totals per (keys..., phase): each phase's total over the steps
        it ran in, summed over the phases in reports.steps's order (float64, as per_step gives them).
        Returns {run_index: DataFrame of keys and columns}, keys in order of first appearance."""
        import pandas as pd

        arrays = {
            c: totals[c].to_numpy(dtype=np.float64, na_value=np.nan) if c in columns else totals[c].to_numpy()
            for c in ("run_index", "phase", *keys, *columns, "first_seq")
            if c in totals
        }
        out = {}
        for i, (found, figures) in per_step_arrays(self.phase_steps(), len(self.runs), arrays, columns, keys).items():
            frame = pd.DataFrame(figures)
            if keys:
                frame = pd.concat([pd.DataFrame(found, columns=list(keys)).astype(object), frame], axis=1)
            out[i] = frame
        return out

    def per_step_arrow(self, totals, columns, keys=()):
        """per_step of `totals` a pyarrow Table: {run_index: ([key tuple], {column: float64 array})}."""
        names = ("run_index", "phase", *keys, *columns, "first_seq")
        arrays = {
            c: values_of(totals.column(c)) if c not in columns else floats(totals.column(c))
            for c in names
            if c in totals.column_names
        }
        return per_step_arrays(self.phase_steps(), len(self.runs), arrays, columns, keys)
