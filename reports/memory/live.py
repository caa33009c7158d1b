"""Bytes live per memory category, from the storage-lifetime model (reports.memory.lifetimes.Storages), as numpy
arrays: what reports.memory.memory's by_category and timeline return as DataFrames, and what `optrace report`'s
memory section prints (reports.memory.sql_categories.by_category, without pandas)."""

import numpy as np

from reports._util import pct
from reports.errors import ReportError
from reports.memory.lifetimes import CATEGORIES

__all__ = ["AT", "categories_at", "live_at", "live_columns"]

AT = ("peak", "end", "max")  # by_category's `at`, besides an op's seq


def live_columns(run):
    """For each of CATEGORIES, a function giving the int64 bytes of that category live after each row of a run.

    One category at a time, so a million-row run never holds a [rows, categories] matrix."""
    nbytes, alloc, free, cat = run.live_pieces()
    n = run.n
    start, end = alloc + 1, free + 1  # index 0: before the first row
    freed = end > 0
    index = np.concatenate([start, end[freed]])
    weights = np.concatenate([nbytes, -nbytes[freed]]).astype(np.float64)
    which = np.concatenate([cat, cat[freed]])

    def live(c):
        mine = which == c
        delta = np.bincount(index[mine], weights=weights[mine], minlength=n + 1)[: n + 1]
        return np.rint(delta).astype(np.int64).cumsum()[1:]

    return [lambda c=c: live(c) for c in range(len(CATEGORIES))]


def live_at(run, row):
    """Bytes live per category after one row of a run: what live_columns gives at that row, without a column per
    category."""
    nbytes, alloc, free, cat = run.live_pieces(row)  # those live after `row`: the mask below keeps them all
    alive = (alloc <= row) & ((free < 0) | (free > row))  # counted from alloc + 1, gone from free + 1 (live_columns)
    values = np.zeros(len(CATEGORIES), dtype=np.int64)
    np.add.at(values, cat[alive], nbytes[alive].astype(np.int64))
    return values


def categories_at(run, at):
    """{column: array} of by_category's rows of one run (a `Storages`; `at` checked by the caller): run, category,
    bytes (int64), seq (int64), live_pct (float64)."""
    seq, name = run.rows.seq, run.name
    total = run.live
    if at == "max":
        where, values = np.zeros(len(CATEGORIES), dtype=np.int64), np.zeros(len(CATEGORIES), dtype=np.int64)
        for c, column in enumerate(live_columns(run)):
            live = column()
            where[c] = live.argmax()
            values[c] = live[where[c]]
    else:
        if at == "peak":
            row = int(np.argmax(total))
        elif at == "end":
            row = run.n - 1
        else:
            hits = np.flatnonzero(seq == at)
            if not len(hits):
                raise ReportError(
                    f"by_category: run {name!r} has no op with seq {at} (its seq runs {seq[0]}..{seq[-1]})"
                )
            row = int(hits[0])
        where = np.full(len(CATEGORIES), row)
        values = live_at(run, row)
    return {
        "run": np.full(len(CATEGORIES), name, dtype=object),
        "category": np.asarray(CATEGORIES, dtype=object),
        "bytes": values.astype(np.int64),
        "seq": seq[where].astype(np.int64),
        "live_pct": np.asarray(pct(values, total[where]), dtype=np.float64),
    }
