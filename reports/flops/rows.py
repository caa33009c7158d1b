"""The rows the FLOP sections read, as numpy arrays over a pyarrow.Table: no DataFrame on the report's path.

Rows(table)            one run's rows (reports.sql.flops.table's, or a user's DataFrame at the library's
                       boundary: `as_rows`), each column read once, when first asked for
rows[name]             a numeric column as a numpy array; rows.flag(name) a boolean one, nulls False
rows.labels(name)      a string column as Labels: a code per row into its distinct words
rows.flat(name)        a list column as (offsets, values) (reports.loading.columns.flat's layout)
rows.cells(name, at)   the list cells at positions `at`, as Python lists
per_step(rows, ...)    reports.steps.per_step_of over Rows

runs(table, names)     [(run name, its Rows)] of a Table with a `run` column, in the order of `names`
from_frame(df, names)  a DataFrame's columns `names` (those it has) as a Table: the library's way in
"""

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import array_of, arrow_of, numpy_of, strings, values_of, whole
from reports.errors import ReportError
from reports.sql.flop_rows import SCHEMA
from reports.steps import count_steps_of, per_step_of, steps_of

__all__ = [
    "COLUMNS",
    "Frame",
    "Labels",
    "Rows",
    "as_rows",
    "flat",
    "frame_of",
    "from_frame",
    "per_step",
    "records_table",
    "first_row",
    "require",
    "runs",
    "runs_table",
    "to_frame",
]

COLUMNS = ("run", *SCHEMA.names)  # every column a FLOP section reads (reports.sql.flops.table's columns)


class Labels:
    """A column of strings as `codes` (a signed integer per row, -1 for a null) into `words` (distinct strings):
    each comparison is made once per word, not once per row."""

    def __init__(self, codes, words):
        self.codes, self.words = codes, list(words)

    @classmethod
    def of(cls, values):
        """Labels of a sequence of strings (None for a null)."""
        index, codes = {}, []
        for v in values:
            codes.append(-1 if v is None else index.setdefault(v, len(index)))
        return cls(np.asarray(codes, dtype=np.int64), list(index))

    def __len__(self):
        return len(self.codes)

    def isin(self, values):
        """Boolean array: the rows whose word is one of `values`."""
        hits = [i for i, w in enumerate(self.words) if w in values]
        if not hits:
            return np.zeros(len(self.codes), dtype=bool)
        return np.isin(self.codes, hits) if len(hits) > 1 else self.codes == hits[0]

    def eq(self, value):
        """Boolean array: the rows whose word is `value`."""
        return self.isin((value,))

    def notna(self):
        return self.codes >= 0

    def map(self, f):
        """Labels of f(word) for each row's word (f called once per word)."""
        mapped = [f(w) for w in self.words]
        distinct = list(dict.fromkeys(mapped))
        recode = np.asarray([distinct.index(m) for m in mapped] + [-1], dtype=np.int64)
        return Labels(recode[self.codes], distinct)  # a null's -1 takes recode's last entry, -1

    def take(self, at):
        """The Labels of the rows at positions (or a mask) `at`."""
        return Labels(self.codes[at], self.words)

    def strings(self, at=None):
        """The words of the rows `at` (every row when None) as an object array, None for a null."""
        codes = self.codes if at is None else self.codes[at]
        return np.array([*self.words, None], dtype=object)[codes]


class Rows:
    """One run's rows: the columns of `table` (a pyarrow.Table), each turned into numpy once."""

    def __init__(self, table):
        self.table = table
        self._read = {}

    def __len__(self):
        return self.table.num_rows

    def __contains__(self, name):
        return name in self.table.column_names

    def _column(self, name):
        column = self.table.column(name)
        return whole(column)

    def __getitem__(self, name):
        """A numeric column as a numpy array (int64 for integers)."""
        key = ("values", name)
        if key not in self._read:
            column = self._column(name)
            values = values_of(column)
            self._read[key] = values.astype(np.int64, copy=False) if pa.types.is_integer(column.type) else values
        return self._read[key]

    def flag(self, name):
        """A boolean column as a numpy bool array, a null False (all False without the column)."""
        key = ("flag", name)
        if key not in self._read:
            if name not in self or pa.types.is_null(self.table.schema.field(name).type):
                self._read[key] = np.zeros(len(self), dtype=bool)
            else:
                column = self._column(name)
                self._read[key] = numpy_of(
                    column if pa.types.is_boolean(column.type) else column.cast(pa.bool_()), null=False
                )
        return self._read[key]

    def labels(self, name):
        """A string (or dictionary) column as Labels."""
        key = ("labels", name)
        if key not in self._read:
            column = self._column(name)
            if pa.types.is_null(column.type):
                self._read[key] = Labels(np.full(len(column), -1, dtype=np.int64), [])
            else:
                if not pa.types.is_dictionary(column.type):
                    column = pc.dictionary_encode(
                        column.cast(pa.string()) if not pa.types.is_string(column.type) else column
                    )
                codes = numpy_of(column.indices, null=-1)  # int8-int32: no int64 per row
                codes = codes if codes.dtype.kind == "i" else codes.astype(np.int64)
                self._read[key] = Labels(codes, [str(w) for w in column.dictionary.to_pylist()])
        return self._read[key]

    def lists(self, name, kind=None, at=None):
        """A list column as one ListArray (its items cast to `kind` when given); only the rows at positions `at`
        when given (taken chunk by chunk: no copy of the whole column)."""
        if at is not None:
            column = whole(self.table.column(name).take(arrow_of(np.asarray(at, dtype=np.int64))))
        else:
            column = self._column(name)
        if not len(column) and not pa.types.is_list(column.type):  # an empty column of objects has no list type
            column = pa.nulls(0, pa.list_(kind or pa.int64()))
        if kind is not None and column.type != pa.list_(kind):
            column = column.cast(pa.list_(kind))
        return column

    def flat(self, name, kind=pa.int64()):
        """(offsets, values) of a list column: row i's items are values[offsets[i]:offsets[i + 1]]; a null row is
        empty. Integers come as int64 with -1 for a null item, other items as objects."""
        key = ("flat", name, kind)
        if key not in self._read:
            self._read[key] = flat(self.lists(name, kind), kind)
        return self._read[key]

    def phases(self):
        """reports.steps.steps_of the rows: (phase codes, phase names, steps each phase ran in), made once."""
        if "phases" not in self._read:
            phase = self.labels("phase")
            self._read["phases"] = steps_of(phase.codes, np.asarray(phase.words, dtype=object), self["step"])
        return self._read["phases"]

    def count_steps(self):
        """reports.steps.count_steps of the rows, counted once."""
        if "count_steps" not in self._read:
            phase = self.labels("phase")
            self._read["count_steps"] = count_steps_of(phase.codes, phase.words, self["step"])
        return self._read["count_steps"]

    def once(self, key, make):
        """make()'s result, made on the first call with `key` for these rows (a figure several sections read)."""
        if ("once", key) not in self._read:
            self._read[("once", key)] = make()
        return self._read[("once", key)]

    def cells(self, name, at):
        """The cells of list column `name` at row positions `at`, as Python lists (None for a null)."""
        return self.table.column(name).take(arrow_of(np.asarray(at, dtype=np.int64))).to_pylist()


def flat(lists, kind=pa.int64()):
    """(offsets, values) of a ListArray (see Rows.flat)."""
    offsets = numpy_of(lists.offsets).astype(np.int64)
    items = lists.values.slice(offsets[0], offsets[-1] - offsets[0]) if len(offsets) else lists.values.slice(0, 0)
    offsets = offsets - offsets[0] if len(offsets) else np.zeros(1, dtype=np.int64)
    if pa.types.is_integer(kind):
        values = numpy_of(items, null=-1)
        values = values.astype(np.int64, copy=False)  # the Arrow buffer itself where it holds int64 without nulls
    else:
        values = np.asarray(items.to_pylist(), dtype=object) if len(items) else np.zeros(0, dtype=object)
    return offsets, values


def as_rows(rows, columns=COLUMNS):
    """`rows` as Rows: Rows as they are, a DataFrame's `columns` (those it has) converted (the library's boundary:
    reports.flops.roles.Roles and reports.flops.recompute may be handed one, as reports.plan does)."""
    if isinstance(rows, Rows):
        return rows
    return Rows(from_frame(rows, columns))


def runs(table, names):
    """[(run name, Rows of its rows)] of a Table whose `run` column names each row's run, in the order of `names`
    (a run without rows gets empty Rows); rows keep their order."""
    if len(names) == 1 and "run" not in table.column_names:
        return [(names[0], Rows(table))]
    run = Rows(table).labels("run")
    out = []
    for name in names:
        mine = run.eq(name)
        if mine.all():
            out.append((name, Rows(table)))
            continue
        at = np.flatnonzero(mine)
        contiguous = len(at) and at[-1] - at[0] + 1 == len(at)
        out.append((name, Rows(table.slice(int(at[0]), len(at)) if contiguous else table.take(arrow_of(at)))))
    return out


def _plain(value):
    """A cell of an object column (numpy arrays of numpy arrays) as nested Python lists."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def from_frame(df, names):
    """The columns `names` of DataFrame `df` (those it has) as a pyarrow.Table; a categorical column becomes a
    dictionary column, a column of list cells a list column."""
    arrays, fields = [], []
    for name in dict.fromkeys(names):
        if name not in df.columns:
            continue
        column = df[name]
        try:
            array = pa.Array.from_pandas(column)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):  # list cells of numpy arrays of arrays
            array = pa.array([_plain(v) for v in column.to_numpy(dtype=object)])
        arrays.append(array)
        fields.append(name)
    return pa.Table.from_arrays(arrays, names=fields) if arrays else pa.table({"run": strings([])})


def require(columns, needed, what):
    """Raise ReportError naming the columns of `needed` not among `columns` (reports.loading.load.require's message)."""
    missing = [c for c in needed if c not in columns]
    if missing:
        raise ReportError(f"{what}: the trace lacks column(s) {missing}; load it with them")


class Frame(NamedTuple):
    """What the FLOP sections read: `table`, a pyarrow.Table of rows with a `run` column (the columns of COLUMNS
    it has), and `runs`, {run name: metadata} in load order; `shared`, a dict where the sections that read one
    Frame share its split (each run's Rows, their columns read once: reports.output.source.Source's), else None."""

    table: pa.Table
    runs: dict
    shared: dict = None

    def split(self):
        """[(run name, Rows of its rows)] in load order."""
        if self.shared is None:
            return runs(self.table, list(self.runs))
        if "split" not in self.shared:
            self.shared["split"] = runs(self.table, list(self.runs))
        return self.shared["split"]

    @property
    def column_names(self):
        return self.table.column_names


def frame_of(df):
    """A DataFrame of reports.load (or reports.sql.flops.frame) as a Frame: the library's boundary; the runs a filter
    emptied left out (reports.loading.load.kept_runs)."""
    from reports.loading.load import kept_runs, runs_of

    return Frame(from_frame(df, COLUMNS), kept_runs(df, runs_of(df)))


def per_step(rows, values="flops", mask=None, by=None):
    """reports.steps.per_step_of over Rows: one figure, or with `by` (a string column's name, Labels or an integer
    array aligned with the rows) {key: figure} in order of first appearance."""
    v = rows[values] if isinstance(values, str) else values
    if by is None:
        return per_step_of(v, rows.phases(), mask)
    if isinstance(by, (str, Labels)):
        labels = rows.labels(by) if isinstance(by, str) else by
        key_codes, keys = labels.codes, np.asarray(labels.words, dtype=object)
    elif mask is None:
        distinct, key_codes = np.unique(by, return_inverse=True)
        keys = np.asarray(distinct.tolist(), dtype=object)
    else:  # the keys of the rows summed only (-1: a row left out)
        at = np.flatnonzero(mask)
        distinct, inverse = np.unique(np.asarray(by)[at], return_inverse=True)
        key_codes = np.full(len(v), -1, dtype=np.int64)
        key_codes[at] = inverse.reshape(-1)
        keys = np.asarray(distinct.tolist(), dtype=object)
    found, figures = per_step_of(v, rows.phases(), mask, (key_codes.astype(np.int64).reshape(-1), keys))
    return dict(zip(found.tolist(), figures))


def _array(values, kind):
    if pa.types.is_integer(kind):
        values = [None if v is None else int(v) for v in values]
    elif pa.types.is_floating(kind):
        values = [None if v is None else float(v) for v in values]
    return array_of(values, kind)


def records_table(records, types):
    """A pyarrow.Table of `records` (dicts): its columns those of `types` ({column: pyarrow type}), in that order."""
    return pa.table({c: _array([r.get(c) for r in records], kind) for c, kind in types.items()})


def runs_table(frames, types, several):
    """One pyarrow.Table of [(run name, records)], with a `run` column first when `several` (reports.tables.combine's
    layout)."""
    if several:
        records = [{"run": run, **r} for run, rs in frames for r in rs]
        return records_table(records, {"run": pa.string(), **types})
    return records_table([r for _, rs in frames for r in rs], types)


def to_frame(table):
    """A section's pyarrow.Table as the DataFrame the library returns (pandas imported here only): strings as
    objects (None for a null), as the library's tables have always held them, not pandas' string dtype."""
    import pandas as pd

    data = {}
    for name in table.column_names:
        column = table.column(name)
        text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        data[name] = pd.Series(column.to_pylist(), dtype=object) if text else column.to_pandas()
    return pd.DataFrame(data)


def first_row(table):
    """The first row of a section's pyarrow.Table as {column: value}, a null float NaN (as a DataFrame's row gives it)."""
    row = table.slice(0, 1).to_pylist()[0]
    floating = {f.name for f in table.schema if pa.types.is_floating(f.type)}
    return {c: float("nan") if v is None and c in floating else v for c, v in row.items()}
