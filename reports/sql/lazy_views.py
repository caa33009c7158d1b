"""The views of the .sql files a reports.sql.engine.Trace makes when a statement first names them, and run_totals'
rows, which every Trace reads once (a part of Trace: `LazyViews`)."""

import re

from reports.sql.sql_text import VIEW_FILES, statements

__all__ = ["LazyViews"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class LazyViews:
    """The lazy views of reports.sql.engine.Trace (its `db`, `table`): `_make_views` lists them, `need` makes those a
    statement names (reports.sql.connection.Connection calls it before each statement)."""

    def _make_views(self, fast):
        """The views of the .sql files, each from `fast` ({view: body}, reports.sql.scan) where it holds one."""
        self._views = [(name, fast.get(name, body)) for path in VIEW_FILES for name, body, _ in statements(path)]
        self._lazy(self._views)
        self._read_totals()

    def _lazy(self, views):
        """Make `views` ([(name, body)], in the files' order) when a statement first names them (need)."""
        self._pending, self._order = dict(views), {name: i for i, (name, _) in enumerate(views)}

    def need(self, text):
        """Make the views of the .sql files that `text` (a statement) names and that are not made yet, each after
        those its body names: every identifier of the text is looked up, so one named in a string or an alias is
        made too, never one left out. run_totals, which most tables join, is a table: its distinct counts computed
        once (13 ms a read)."""
        pending = getattr(self, "_pending", None)
        if not pending:
            return
        made = []
        self._needed(text, pending, made)
        if made:  # one script: a statement's own cost in DuckDB's Python layer is about 0.2 ms
            self.db._db.execute(";\n".join(made))

    def _needed(self, text, pending, made):
        """need's statements, each after those its body names, appended to `made`."""
        for name in sorted({w for w in _WORD.findall(text) if w in pending}, key=self._order.__getitem__):
            body = pending.pop(name, None)
            if body is None:  # made meanwhile, as a view the others named read
                continue
            self._needed(body, pending, made)
            kind = "TABLE" if name == "run_totals" else "VIEW"
            made.append(f"CREATE OR REPLACE {kind} {name} AS {body}")

    def _read_totals(self):
        """`run_rows`: run_totals' rows as {column: Python value}, in the view's order (pandas is not imported)."""
        self._totals_frame = None
        self.run_rows = self.db.sql("SELECT * FROM run_totals").to_arrow_table().to_pylist()

    @property
    def totals(self):
        """run_totals as a DataFrame in DuckDB's dtypes (the library's tables): read on first use."""
        if self._totals_frame is None:
            self._totals_frame = self.table("run_totals")
        return self._totals_frame

    def run_row(self, run_index=0):
        """The run's row of run_totals ({column: value}), or None for a run without rows."""
        return next((r for r in self.run_rows if r["run_index"] == run_index), None)
