"""Sizes read from the rise of live_bytes: the storages that joined live_bytes at the row that first used them (a
tensor made before the trace: the batch), for reports.memory.lifetimes.Storages. Rows are positions in seq order."""

import numpy as np

__all__ = ["joined_sizes"]


def joined_sizes(sids, row, estimate, resized, size_now, live, made, frees):
    """Sizes of the storages that joined live_bytes at their row (`sids`, first seen at rows `row`; `estimate`:
    {id: guessed bytes}), from the rise of live_bytes there (row 0 has no rise to read). Of a row's storages those
    registered at the start have the smaller ids: the split that explains the rise best says which, and the first
    one that joined takes what the guesses miss. A row's rise counts the bytes it frees at the sizes known when
    the rows are taken in order: a storage that joined at an earlier row freed at the size found there.

    `resized`: {row: bytes resizes added}; `size_now`: each storage's size so far (-1: unknown); `live`: live_bytes
    per row; `made`: the rows that made storages, ascending, and the running sum of their bytes up to each; `frees`:
    (offsets, ids) of each row's freed ids. Returns (`sids` by row then id, their sizes, their alloc rows: -1 where a storage
    was registered at the start)."""
    if not len(sids):
        return sids, [], []
    free_offsets, free_ids = frees
    order = np.lexsort((sids, row))
    sids, row = sids[order], row[order]
    guess = [estimate[s] for s in sids.tolist()]
    rows, first = _starts(row)
    # each joined row's freed ids (`owner`: the joined row's index), those that joined at an earlier row apart
    counts = free_offsets[rows + 1] - free_offsets[rows]
    owner = np.repeat(np.arange(len(rows)), counts)
    offsets = np.cumsum(counts) - counts
    freed = free_ids[np.repeat(free_offsets[rows] - offsets, counts) + np.arange(len(owner))]
    cand = _position(sids, freed)
    earlier = cand >= 0
    earlier[earlier] = row[cand[earlier]] < rows[owner[earlier]]
    # the others at the size they hold: a known size, else the guess, else 0
    ids = np.fromiter(estimate, dtype=np.int64, count=len(estimate))
    guessed = np.fromiter(estimate.values(), dtype=np.int64, count=len(estimate))
    at = _position(ids, freed[~earlier])
    sizes = size_now[freed[~earlier]]
    held = np.where(sizes > 0, sizes, np.where((sizes < 0) & (at >= 0), guessed[np.maximum(at, 0)], 0))
    freed_bytes = _sums(held, owner[~earlier], len(rows))
    before = np.maximum(rows - 1, 0)
    shift = np.fromiter((resized.get(r, 0) for r in rows.tolist()), dtype=np.int64, count=len(rows))
    base = (live[rows] - live[before] - _made_at(made, rows) + freed_bytes - shift).tolist()
    deps, dep_bounds = cand[earlier].tolist(), np.searchsorted(owner[earlier], np.arange(len(rows) + 1)).tolist()
    size, alloc, bounds = list(guess), row.tolist(), [*first.tolist(), len(sids)]
    for j, r in enumerate(rows.tolist()):
        lo, hi, d0, d1 = bounds[j], bounds[j + 1], dep_bounds[j], dep_bounds[j + 1]
        rise = base[j] if d0 == d1 else base[j] + sum(size[d] for d in deps[d0:d1])
        if hi - lo == 1 and r:  # one storage (most rows): it joined here, or it was registered at the start
            if abs(rise - guess[lo]) <= abs(rise):
                size[lo] = max(0, rise)
            else:
                alloc[lo] = -1
            continue
        mine = guess[lo:hi]
        if r == 0:
            split, rise = 0, sum(mine)
        else:
            split = min(range(len(mine) + 1), key=lambda k: (abs(rise - sum(mine[k:])), k))
        alloc[lo : lo + split] = [-1] * split
        if split < len(mine):
            size[lo + split] = max(0, rise - sum(mine[split + 1 :]))
    return sids, size, alloc


def _made_at(made, rows):
    """Bytes the new storages of each of `rows` take (`made`: the rows where storages were made, ascending, and
    the running sum of their bytes up to each)."""
    made_rows, running = made

    def before(k):  # the bytes of the first k storages
        return np.where(k > 0, running[np.maximum(k - 1, 0)], 0) if len(running) else np.zeros(len(k), np.int64)

    return before(np.searchsorted(made_rows, rows, side="right")) - before(np.searchsorted(made_rows, rows))


def _starts(values):
    """(the distinct values of a sorted int array, the position of each one's first)."""
    first = np.flatnonzero(np.r_[True, values[1:] != values[:-1]]) if len(values) else np.zeros(0, dtype=np.int64)
    return values[first], first


def _position(table, keys):
    """Each key's position in `table` (distinct ints, in any order), -1 where it is not there."""
    if not len(table) or not len(keys):
        return np.full(len(keys), -1, dtype=np.int64)
    order = np.argsort(table, kind="stable")
    at = order[np.minimum(np.searchsorted(table, keys, sorter=order), len(table) - 1)]
    return np.where(table[at] == keys, at, -1)


def _sums(values, groups, count):
    """The int64 sum of `values` per group (`groups`: ascending group numbers below `count`), 0 for a group with none."""
    running = np.r_[0, np.cumsum(values, dtype=np.int64)]
    return (
        running[np.searchsorted(groups, np.arange(count), side="right")]
        - running[np.searchsorted(groups, np.arange(count))]
    )
