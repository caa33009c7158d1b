"""Run the report views of views.sql with DuckDB, embedded, over a trace's validated part files.

    trace = Trace("runs/gpt.parquet")     # checks the trace as reports.load does, reads no row into Python
    trace.table("by_op")                  # a view's rows as a DataFrame (the library's tables)
    trace.arrow("SELECT * FROM by_op")    # any query's rows as a pyarrow Table (the printed report's: no pandas)
    trace.close()

`Trace(paths)` takes what `reports.load` takes (one trace or several, a distributed trace's
`rank=R` directories one run each) and names the runs as it does. Before any view runs:

  - each run passes reports.loading.load.read_run: the part files listed (never globbed),
    their footers, schema, metadata, trace ids and repeated parts checked, the damage counted;
  - the values are checked from the parts' statistics as read_run reads each footer (nulls,
    ranges; storage ids once the run's id limit is known, from the extremes kept per part); seq
    increasing row by row, null list cells and null id items (which the statistics cannot tell
    from empty lists) and the phase and FLOP kind values are checked by one read of each run's
    parts (reports.sql.rowpass), before any view runs, which also keeps what the report's
    FLOP and memory sections read of run 0's rows (`keep`; compare's of every run: `every_run`);
    a trace read once into memory (many small parts, or a live one) has them checked by scans of
    that copy; when a check fails, the
    reference loader reads that run and raises its one-line ReportError, so a damaged or hostile
    trace gets the same message on both paths;
  - an incomplete or damaged trace warns, in the words reports.load uses.

`rows` is defined over the literal list of the part files the checks accepted, each path made
absolute and its glob characters escaped (DuckDB globs every file name it is given), with
hive partitioning off (a `key=value` directory in a user's path adds no column). The views that
group and sum are read from two groupings of the rows made once per trace (reports.sql.scan),
each equal to its definition in views.sql; a trace of many small parts has the columns they read
copied into memory once (SMALL_PARTS) instead of every part opened for every scan. `first_run()`
gives run 0 alone over the same tables (the report of a trace of several ranks is rank 0's).

The views of the .sql files are made when a statement first names them (reports.sql.lazy_views.LazyViews).

A trace of up to reports.sql.database.SHARED_ROWS rows is opened in a catalogue of its own of one DuckDB database
the process shares (reports.sql.database: making a database costs more than the rest of opening a small trace).

The tables (reports.sql.tables, reports.time.roofline, reports.distributed.collectives) are built from
the views here; this module only runs SQL, divides totals per phase into per-step figures and says which int64 sums
could wrap (reports.steps.summable: pandas sums those as float64).
"""

import contextlib
import os
import warnings

import pyarrow as pa

from reports.errors import ReportError
from reports.loading.integrity import (
    REREADS,
    describe_damage,
    footer,
    list_parts,
    merged_away,
    one_line,
    reread,
    stopped_by,
)
from reports.loading.load import check_rank, read_run, run_name, runs_with_ranks
from reports.loading.validate import ITEMS_NOT_NULL, LIST_NOT_NULL
from reports.sql.checks import BAD_ROW_VALUES, Checks, IdFooters
from reports.sql.connection import Connection
from reports.sql.database import connect
from reports.sql.kept_views import kept_grains, kept_views
from reports.sql.lazy_views import LazyViews
from reports.sql.queries import Queries
from reports.sql.scan import GRAINS, grains, source, source_views, views
from reports.sql.scan import grains as _grains
from reports.sql.sql_text import (
    GLOB,
    VIEW_FILES,
    VIEWS_SQL,
    file_literal,
    literal,
    named_columns,
    statements,
    typed_column,
)
from tracer.schema import ARROW_SCHEMA, COLUMN_NAMES, missing_columns

# The oldest schema version the engine reads. A trace of it lacks the columns added since, all of them null when
# reports.load reads one (tracer.schema.missing_columns: grad_mode, unknown before v4): they are read as NULL here.
OLDEST_VERSION = 3

__all__ = ["VIEWS_SQL", "VIEW_FILES", "Trace", "Unsupported", "literal", "statements"]

# Read the rows the views need once into memory (reports.sql.scan source) from this many part files on, when
# the parts hold fewer rows than this on average and the trace no more rows than this.
SMALL_PARTS = (256, 64, 1 << 20)
BATCH = 256  # part files per statement when reading them once (DuckDB keeps each open part until the statement ends)


class Unsupported(ReportError):
    """A trace the SQL engine does not read (a v1 or v2 trace, or any trace lacking a column its views read that its
    version has: the pandas engine reads only its sections' columns; a part's path with a backslash and [, * or ?)."""


class Trace(Checks, LazyViews, Queries):
    """One trace or several, checked, with a DuckDB connection holding `rows` and the views of views.sql.

    `runs`: {run name: metadata} as reports.load gives it in `df.attrs["runs"]`; `ranks`: the rank
    of each run (None outside a distributed trace). `columns`: the columns the reference reader of the same
    command reads (all by default): a run the checks here refuse is read with them, for its words.
    `first_run()`: run 0 alone, as a Trace over the same connection (the report of a trace of several ranks).
    `keep`: makers of consumers of run 0's rows, fed by the read that checks them (reports.sql.rowpass), taken
    once each by take_kept (the report's FLOP and memory sections: reports.sql.flop_rows, reports.memory.row_scan);
    `every_run`: consumers of every run's rows, each run's read feeding its own (compare's memory categories, which
    read every run: no run scanned again)."""

    def __init__(self, paths, threads=None, columns=None, keep=(), every_run=False):
        self.every_run = every_run
        self.db = self._database = None

        def attempt():  # a live trace's parts merged away while read (tracer.store.writer SmallParts): read again
            if self.db is not None:
                self.close()
            self._open(paths, threads, columns, keep)

        try:
            reread(attempt)
        except Exception as exc:
            if self.db is not None:  # its database given back now, not when the Trace is collected
                self.close()
            if isinstance(exc, ReportError) or not merged_away(exc):
                raise
            raise ReportError(
                f"{one_line(exc)} (parts merged away while read, {REREADS} times: read the trace again)"
            ) from None
        except BaseException:  # a Ctrl-C while it opens: the database given back, the interrupt raised on (a
            if self.db is not None:  # failure to close leaves it to the Trace's collection: the interrupt is the news)
                with contextlib.suppress(Exception):
                    self.close()
            raise

    def _open(self, paths, threads, columns, keep):
        try:
            import duckdb
        except ImportError:
            raise ReportError(
                "the SQL engine needs duckdb (an optrace dependency), which is not installed: pip install "
                "duckdb, or run with --engine pandas"
            ) from None

        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        if not paths:
            raise ReportError("load: expected at least one trace path, got none")
        self.runs, self.ranks, self.paths, self.files, self._phase_steps, self._totals = {}, [], [], [], None, None
        self.lacking = []  # per run: the columns its version lacks, read as NULL
        self.kept, self._fed_rows = {}, 0  # _fed_rows: of the runs whose read fed consumers (Checks._rows_pass)
        self._reference_columns = columns
        footers, refused, seen = IdFooters(), set(), {}
        try:
            for path, rank in runs_with_ranks(paths):
                try:  # the values from the parts' statistics too (all but storage ids), each footer read once
                    meta = read_run(path, footers, unread=COLUMN_NAMES)
                except ReportError:
                    meta = read_run(path, IdFooters())  # a damaged trace raises here, in reports.load's words
                    refused.add(path)  # else a value the statistics refuse: the reference loader says which
                check_rank(path, rank, meta, seen)
                name = run_name(path, rank, meta, self.runs)
                if meta["schema_version"] < OLDEST_VERSION:
                    raise Unsupported(
                        f"{path}: a v{meta['schema_version']} trace; the SQL engine reads v{OLDEST_VERSION} and later"
                    )
                self.runs[name] = meta
                self.ranks.append(rank if rank is not None else meta.get("rank"))
                self.paths.append(path)
                self.files.append(list_parts(path))
                if any("\\" in f and GLOB.search(f) for f in map(os.path.abspath, self.files[-1])):
                    raise Unsupported(
                        f"{path}: a backslash and a glob character in a part's path, which DuckDB's glob "
                        "cannot be told to read literally"
                    )  # the pandas engine reads it
                present = footer(self.files[-1][0], footers).schema.to_arrow_schema().names
                lacks = missing_columns(meta["schema_version"])  # null in every row: read as NULL
                missing = [c for c in COLUMN_NAMES if c not in present and c not in lacks]
                if missing:  # the pandas engine reads it: refused in reports.load's words, or read when it reads none
                    raise Unsupported(f"{path}: trace lacks column(s) {missing}")
                self.lacking.append({c for c in lacks if c not in present})
        except Unsupported:
            raise
        except ReportError:  # a run that cannot be read: reports.load checks the rows of the runs before it first
            for earlier in self.paths:
                self._reference_check(earlier)
            raise
        files = sum(len(f) for f in self.files)
        rows = sum(footers.rows.get(f, 0) for fs in self.files for f in fs)
        # DuckDB spills a query larger than its memory limit to temp_directory, by default `.tmp` in the working
        # directory: a report must not write where the user runs it, so the spill goes to a directory of its own
        # under the system's temporary directory (reports.sql.database: a small trace's database is one the process
        # shares)
        self._open_database(duckdb, rows, threads)
        self._reads = [
            f"read_parquet([{', '.join(file_literal(f) for f in files)}], hive_partitioning = false"
            for files in self.files
        ]  # (closed by the caller: options may follow)
        # the trace's columns by name: UNION ALL and INSERT match columns by position, and a run's parts may hold
        # them in another order (or hold others), which reports.load, reading them by name, accepts
        named = [named_columns(lacking) for lacking in self.lacking]
        selects = [
            f"SELECT {literal(name)} AS run, {i} AS run_index, {named[i]} FROM {read})"
            for i, (name, read) in enumerate(zip(self.runs, self._reads))
        ]
        self.rows_view = "CREATE VIEW rows AS " + " UNION ALL ".join(
            selects
        )  # what views.sql reads, for another connection
        self._first_rows = selects[0]  # run 0's rows alone (first_run)
        self.columns = [
            f.name for f in ARROW_SCHEMA
        ]  # rows' after run and run_index (named_columns: all of tracer.schema)
        # read once into memory: many small parts, or a trace cut short or still being written (its tracer may merge
        # small parts, removing the files a later scan would open)
        changing = any(not meta.get("complete") for meta in self.runs.values())
        self.narrow = rows <= SMALL_PARTS[2] and (
            changing or files >= SMALL_PARTS[0] and rows <= SMALL_PARTS[1] * files
        )
        batches = [
            (
                literal(name),
                i,
                f"(SELECT {named[i]}, filename, file_row_number FROM read_parquet(["
                f"{', '.join(file_literal(f) for f in fs[k : k + BATCH])}], hive_partitioning = false, "
                "filename = true, file_row_number = true))",
            )
            for i, (name, fs) in enumerate(zip(self.runs, self.files))
            for k in range(0, len(fs), BATCH)
        ]
        nulls = [f"{c} IS NULL" for c in LIST_NOT_NULL if c in self.columns]
        nulls += [f"list_count({c}) < len({c})" for c in ITEMS_NOT_NULL if c in self.columns]  # a null item
        nulls += BAD_ROW_VALUES  # a value the tracer never writes, in a column the grains are not keyed by
        self._null_where = " OR ".join(nulls) or "FALSE"
        made = [self.rows_view, *source("rows", batches if self.narrow else None, self._null_where)]
        if self.narrow:  # a statement a batch: DuckDB holds every part a statement opened until it ends
            for statement in made:
                self.db.execute(statement)
        else:  # one script
            self.db.execute(";\n".join(made))
        unscanned = self._check_values(
            footers, refused, keep
        )  # before the grains: no value the statistics refuse in one
        several = len(self.runs) > 1
        held = {getattr(c, "holds", None) for c in self.kept.values()}  # views a kept consumer holds for run 0
        made = grains(several, self.narrow, "flop_rest" not in held)  # one scan each: most views are read from
        # these (reports.sql.scan), but those kept consumers made of every run's rows (kept_grains: not the _ops
        # grain with flop_rest's keys, which reports.sql.kept_ops.Ops does not make); not TEMP: first_run's
        # connection reads them too
        scanned = () if several or "flop_rest" in held else ("_ops",)
        made = {**made, **kept_grains(self.db, self.kept, [literal(name) for name in self.runs], scanned)}
        self.db.execute(";\n".join(f"CREATE TABLE {name} AS {body}" for name, body in made.items()))
        self._check_null_lists(unscanned)  # a narrow trace's: from _ops, which flagged them as it read the lists
        self._make_views(
            {
                **views(several, "flop_rest" not in held),
                **kept_views(self.db, self.kept, None if several else next(iter(self.runs))),
            }
        )
        for path, meta, ops in zip(self.paths, self.runs.values(), self._ops()):
            broken = describe_damage(meta["damage"])
            if not meta.get("complete") or broken:  # reports.load's warning, word for word
                state = f"incomplete ({stopped_by(meta)})" if not meta.get("complete") else "damaged"
                warnings.warn(
                    f"{path}: trace is {state}{': ' + broken if broken else ''}; reporting the {ops} rows it has"
                )

    def _open_database(self, duckdb, rows, threads):
        """`db`: this Trace's connection (reports.sql.database.connect), `_database` what closes it."""
        self._database = connect(duckdb, rows, threads)
        self.db = Connection(self._database.cursor, self.need, self._database.note, self._database.catalog)

    @classmethod
    def over(cls, table, runs, ranks=None, paths=None, grains=False):
        """A Trace over rows held in memory (the library API's: reports.sql.frame): `table` a pyarrow Table of the
        trace's columns by name, each cast to tracer.schema's type (a column it lacks reads as NULL), with `run_index`
        (int32: the row's run, an index into `runs`); `runs` {run name: metadata}, in order; `ranks` the rank of each
        run (None outside a distributed trace); `paths` what the messages call each run (default: its name).
        `grains`: the rows copied into the database and the views made from the grains of reports.sql.scan, as a
        Trace of files makes them (the report's sections, which read the grains too, and first_run); else views.sql's
        views as written, over the table itself (no copy: one table of the library API scans what it reads). The rows are the caller's: no check of the file path's runs here. The
        grains, views and tables are those of a Trace of files, over `rows` of `table`."""
        import duckdb

        one = object.__new__(cls)
        one.runs, one.ranks = dict(runs), list(ranks) if ranks is not None else [None] * len(runs)
        one.paths, one.files, one.lacking, one.kept, one._reads = list(paths or one.runs), [], [], {}, []
        one._phase_steps, one._totals, one._reference_columns = None, None, None
        one.narrow, one._null_where = False, "FALSE"
        one._open_database(duckdb, table.num_rows, None)
        present = set(table.column_names)
        names = pa.array(list(one.runs), pa.string())
        runs_table = pa.table({"run": names, "run_index": pa.array(range(len(names)), pa.int32())})
        for name, rows in (("_memory_rows", table), ("_memory_runs", runs_table)):
            if not grains:
                one.db.register(name, rows)
                continue
            one.db.register("_arrow", rows)  # a table of the database: a cursor of it (first_run) sees it, as it
            one.db.execute(f"CREATE TABLE {name} AS SELECT * FROM _arrow")  # sees no registered object
            one.db.unregister("_arrow")
        cols = ", ".join(typed_column(f, f.name in present) for f in ARROW_SCHEMA)
        select = f"SELECT n.run, r.run_index, {cols} FROM _memory_rows AS r JOIN _memory_runs AS n ON r.run_index = n.run_index"
        one._first_rows = select + " WHERE r.run_index = 0"  # run 0's rows alone (first_run)
        one.rows_view = "CREATE VIEW rows AS " + select
        one.db.execute(one.rows_view)
        one.columns = [f.name for f in ARROW_SCHEMA]
        if not grains:
            one._make_views({})
            return one
        for statement in source("rows", None, "FALSE"):
            one.db.execute(statement)
        for name, body in _grains(len(runs) > 1).items():
            one.db.execute(f"CREATE TABLE {name} AS {body}")
        one._make_views(views(len(runs) > 1))
        return one

    def first_run(self):
        """Run 0 alone, as a Trace of its own (the report of a trace of several ranks is rank 0's), over a second
        connection to this one's database: no file, footer or row is read again and no grain made again. Its schema
        `first_run` shadows every table and view of this one: `rows` reads run 0's parts (or its rows read once),
        the grains keep run_index = 0, and the views of the .sql files are made again over those (a view reads
        its own schema first)."""
        one = object.__new__(Trace)
        name, meta = next(iter(self.runs.items()))
        one.runs, one.ranks, one.paths, one.files = {name: meta}, self.ranks[:1], self.paths[:1], self.files[:1]
        one.columns, one.narrow, one._reads, one._views = self.columns, self.narrow, self._reads[:1], self._views
        one._reference_columns, one._null_where = self._reference_columns, self._null_where
        one._first_rows = self._first_rows
        one._phase_steps, one._totals, one.rows_view = None, None, "CREATE VIEW rows AS " + self._first_rows
        # a second connection to this Trace's catalogue: its database stays this Trace's (closed by its close)
        # (a statement run through it that changes a setting of the whole database is noted as the Trace's are)
        cursor = self.db._db.cursor()  # (its own statements below are the Trace's: not noted)
        catalog = self._database.catalog
        one.db = Connection(cursor, one.need, self._database.note, f"{catalog}.first_run")
        one._database, one._owner = None, self
        one.kept = self.kept  # run 0's, taken once by either
        # (a second first_run() makes the same views again)
        cursor.execute(
            f"SET enable_progress_bar = false; USE {catalog}; CREATE SCHEMA IF NOT EXISTS first_run; "
            f"USE {catalog}.first_run"
        )
        made = [
            f"CREATE VIEW {table} AS SELECT * FROM {catalog}.main.{table} WHERE run_index = 0"
            for table in (("_rows", *GRAINS) if self.narrow else GRAINS)
        ]
        made += [] if self.narrow else [one.rows_view]
        made += source_views("rows", self.narrow, self._null_where)
        one._pending = None
        one.db.execute(";\n".join(statement.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1) for statement in made))
        one._lazy(self._views)  # made in this schema when first read (Trace.need), so they read its tables
        one._read_totals()  # run 0's row, typed as a Trace of run 0 alone types it
        return one

    def close(self):
        if self._database is None:  # first_run's: a cursor of its Trace's database
            self.db.close()
        else:
            self._database.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def several(self):
        return len(self.runs) > 1

    def _ops(self):
        found = {r["run_index"]: r["ops"] for r in self.run_rows}
        return [int(found.get(i, 0)) for i in range(len(self.runs))]
