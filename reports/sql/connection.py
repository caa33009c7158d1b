"""A Trace's DuckDB connection: the views a statement names made first, and a statement that may change a setting of
a database the process shares noted (reports.sql.database.Database.note)."""

__all__ = ["Connection"]

_STATEMENTS = ("sql", "execute", "query", "from_query", "executemany")  # the connection's methods taking a statement


class Connection:
    """A Trace's DuckDB connection (or cursor) whose methods that take a statement (`_STATEMENTS`) first make the
    views of the .sql files it names that are not made yet (Trace.need): a view is bound when first read, so a Trace
    pays for the views it reads (a library table reads 2-5 of 35; binding one takes about 1-2 ms); and have it noted
    (reports.sql.database.Database.note: a setting of a shared database changed). `cursor()` is another such
    connection, in the same schema (`schema`: the Trace's catalogue, or its first_run schema). Every other attribute
    is the connection's."""

    def __init__(self, db, need, note=None, schema=None):
        self._db, self._need, self._note, self._schema = db, need, note, schema

    def _statement(self, name):
        run = getattr(self._db, name)

        def guarded(query, *args, **kwargs):
            if isinstance(query, str):
                self._need(query)
                if self._note is not None:
                    self._note(query)
            return run(query, *args, **kwargs)

        return guarded

    def sql(self, query, *args, **kwargs):
        return self._statement("sql")(query, *args, **kwargs)

    def execute(self, query, *args, **kwargs):
        return self._statement("execute")(query, *args, **kwargs)

    def cursor(self):
        cursor = self._db.cursor()
        if self._schema is not None:  # DuckDB's new connection starts in the database's default catalogue
            cursor.execute(f"USE {self._schema}")
        return Connection(cursor, self._need, self._note, self._schema)

    def __getattr__(self, name):
        if name in _STATEMENTS:
            return self._statement(name)
        return getattr(self._db, name)
