"""reports.sql.database: a small trace's Trace runs in a catalogue of its own in a DuckDB database the process shares
(one database made per process, not one per Trace), its tables its own, removed when it closes or is collected; a
setting changed through a Trace leaves the Traces opened later at DuckDB's defaults."""

import gc

import pytest

from reports.sql import database
from reports.sql.engine import Trace

CATALOGUES = "SELECT database_name FROM duckdb_databases() WHERE database_name LIKE 'optrace_%' ORDER BY 1"


def _catalogues(trace):
    return [name for (name,) in trace.db.execute(CATALOGUES).fetchall()]


def test_two_traces_share_one_database_each_reading_its_own_rows(template, parts, monkeypatch):
    monkeypatch.setattr(database, "_SHARED", None)
    with Trace(template) as mlp, Trace(parts) as two:
        # both catalogues are in the one database (a database of its own each: neither would list the other)
        assert _catalogues(mlp) == _catalogues(two) == sorted([mlp._database.catalog, two._database.catalog])
        assert mlp.db.execute("SELECT count(*) FROM rows").fetchone()[0] == 160  # the template: 160 rows
        assert two.db.execute("SELECT count(*) FROM rows").fetchone()[0] == 70  # parts of 32 rows: 32 + 32 + 6
        assert [r["ops"] for r in mlp.run_rows] == [160] and [r["ops"] for r in two.run_rows] == [70]
        gone = mlp._database.catalog
        mlp.close()
        assert gone not in _catalogues(two)  # detached at close
        one = two.first_run()  # a second connection to the Trace's own catalogue
        assert one.run_rows == two.run_rows and one.db.execute("SELECT count(*) FROM _ops").fetchone()[0] > 0
        one.close()


def test_a_trace_collected_unclosed_leaves_the_shared_database(template, parts, monkeypatch):
    monkeypatch.setattr(database, "_SHARED", None)
    with Trace(parts) as kept:
        lost = Trace(template)
        name = lost._database.catalog
        assert name in _catalogues(kept)
        del lost
        gc.collect()  # (a Trace and its connection refer to each other: collected by the cycle collector)
        assert _catalogues(kept) == [kept._database.catalog]
        assert database._SHARED.users == 1


def test_a_setting_changed_through_a_trace_is_not_read_by_traces_opened_later(template, monkeypatch):
    monkeypatch.setattr(database, "_SHARED", None)
    with Trace(template) as fresh:
        default = fresh.db.execute("SELECT current_setting('max_expression_depth')").fetchone()[0]
    with Trace(template) as changed:
        changed.db.execute(f"SET max_expression_depth = {default + 7}")
        assert changed.db.execute("SELECT current_setting('max_expression_depth')").fetchone()[0] == default + 7
        retired = changed._database._shared
        with Trace(template) as later:  # a database of its own: DuckDB's default
            assert later.db.execute("SELECT current_setting('max_expression_depth')").fetchone()[0] == default
            assert later._database._shared is not retired and retired.users == 1
    assert retired.users == 0 and database._SHARED is not retired  # closed with its last Trace


def test_a_trace_refused_after_its_database_was_made_gives_it_back(template, monkeypatch):
    """A check that fails once the rows are in DuckDB (here a stand-in raising ReportError where the null lists are
    checked) closes the Trace's catalogue before the error reaches the caller, not when the Trace is collected."""
    from reports.errors import ReportError

    def refuse(self, unscanned):
        raise ReportError("refused")

    monkeypatch.setattr(database, "_SHARED", None)
    monkeypatch.setattr(Trace, "_check_null_lists", refuse)
    gc.disable()  # (no collection of the unclosed Trace in between)
    try:
        with pytest.raises(ReportError, match="^refused$"):
            Trace(template)
        assert database._SHARED.users == 0
    finally:
        gc.enable()


def test_a_ctrl_c_while_a_trace_opens_gives_its_database_back_and_reaches_the_caller(template, monkeypatch):
    """A KeyboardInterrupt once the rows are in DuckDB (here raised where the null lists are checked) closes the
    Trace's catalogue and reaches the caller as it was: not held until the Trace is collected, not swallowed."""

    def interrupted(self, unscanned):
        raise KeyboardInterrupt

    monkeypatch.setattr(database, "_SHARED", None)
    monkeypatch.setattr(Trace, "_check_null_lists", interrupted)
    gc.disable()  # (no collection of the unclosed Trace in between)
    try:
        with pytest.raises(KeyboardInterrupt):
            Trace(template)
        assert database._SHARED.users == 0
    finally:
        gc.enable()


_FORK = """
import os, sys
from reports.sql.engine import Trace
path = sys.argv[1]
private, shared = Trace(path, threads=1), Trace(path)  # a database of its own, a catalogue of the shared one
os.makedirs(private._database.spill)  # as DuckDB makes it when it spills
pid = os.fork()
if pid == 0:  # the child opens a Trace of its own and leaves through sys.exit (atexit and finalizers run)
    with Trace(path) as mine:
        print("child", mine.run_rows[0]["ops"], flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print("status", status, "spill", os.path.isdir(private._database.spill), "parent", private.run_rows[0]["ops"],
      shared.run_rows[0]["ops"], flush=True)
private.close(), shared.close()
"""


def test_a_forked_child_opens_its_own_trace_and_exits_leaving_the_parents_alone(template):
    """A child forked while its parent holds Traces (one in a database of its own, one in the shared database) opens
    a Trace, reads it and exits with status 0: its finalizers neither close the parent's databases (a hang or a crash
    of the child at exit) nor remove the parent's spill directory; the parent reads its Traces after."""
    import subprocess
    import sys

    from tests import helpers

    done = subprocess.run([sys.executable, "-c", _FORK, str(template)], capture_output=True, text=True,
                          cwd=str(helpers.ROOT), timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    # the template: 160 rows, in the child and in both of the parent's Traces; waitpid's status 0: exit code 0
    assert done.stdout.split() == ["child", "160", "status", "0", "spill", "True", "parent", "160", "160"]


@pytest.mark.parametrize("statement", ["/* one thread */ SET threads = 1", "-- one thread\nSET threads = 1"])
def test_a_setting_changed_after_a_comment_is_not_read_by_traces_opened_later(template, monkeypatch, statement):
    """A SET that follows a comment changes the whole shared database as a bare one does (threads is a global
    setting): the Trace that ran it retires the database, and a Trace opened later gets DuckDB's default."""
    monkeypatch.setattr(database, "_SHARED", None)
    threads = "SELECT current_setting('threads')"
    with Trace(template) as fresh:
        default = fresh.db.execute(threads).fetchone()[0]
    with Trace(template) as changed:
        changed.db.execute(statement.replace("1", str(default + 1)))
        assert changed.db.execute(threads).fetchone()[0] == default + 1
        with Trace(template) as later:  # before: the retired database's default + 1 (the shared database's setting)
            assert later.db.execute(threads).fetchone()[0] == default


def test_a_setting_changed_through_first_run_is_not_read_by_traces_opened_later(template, monkeypatch):
    """Trace.first_run's Trace is a second connection to its Trace's catalogue: a SET run through it retires the
    shared database as one run through the Trace does (before: a Trace opened later read threads = default + 1);
    first_run itself (its USE and views) retires nothing."""
    monkeypatch.setattr(database, "_SHARED", None)
    threads = "SELECT current_setting('threads')"
    with Trace(template) as fresh:
        default = fresh.db.execute(threads).fetchone()[0]
    with Trace(template) as whole:
        one = whole.first_run()
        assert database._SHARED is whole._database._shared  # first_run retired nothing
        one.db.execute(f"SET threads = {default + 1}")
        with Trace(template) as later:
            assert later.db.execute(threads).fetchone()[0] == default
        one.close()


@pytest.mark.parametrize("how", ["cursor", "query"])
def test_a_setting_changed_through_a_cursor_or_query_is_not_read_by_traces_opened_later(template, monkeypatch, how):
    """trace.db.cursor() is another connection to the Trace's catalogue, and trace.db.query runs a statement as
    execute does: a SET through either retires the shared database (before: the cursor was DuckDB's own, in the
    shared database's default catalogue, without the Trace's rows, and its SET reached every Trace opened later)."""
    monkeypatch.setattr(database, "_SHARED", None)
    threads = "SELECT current_setting('threads')"
    with Trace(template) as fresh:
        default = fresh.db.execute(threads).fetchone()[0]
    with Trace(template) as changed:
        run = changed.db.cursor() if how == "cursor" else changed.db
        if how == "cursor":
            assert run.execute("SELECT count(*) FROM rows").fetchone()[0] == 160  # the template's 160 rows
            run.execute(f"SET threads = {default + 1}")
        else:
            run.query(f"SET threads = {default + 1}")
        with Trace(template) as later:
            assert later.db.execute(threads).fetchone()[0] == default
