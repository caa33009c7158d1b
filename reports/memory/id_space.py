"""Storage ids as array positions, in memory bounded by how many ids a run names, never by how large they are.

The lifetime model (reports.memory.lifetimes) keeps its facts in arrays indexed by storage id. The tracer hands
ids out one by one as storages appear, so a run's ids stay below its count of storages and such arrays cost what the
run's lists do. A trace's checks allow ids up to a bound that grows with the damage its metadata counts
(reports.loading.load.id_limit: lost rows, record errors), so a hand-edited count of 10^15 let an id of 2^40 through,
and arrays of 2^40 entries (8 TiB) were asked for. Metadata counts are facts to report, never sizes to allocate from:

  dense_enough(top, count)   arrays up to id `top` are used only while top < SLACK + PER_ID x count, `count` the
                             ids (or rows) there are;
  IdSpace(ids)               else the distinct ids, ascending, stand for themselves by position: `dense(raw)` maps
                             an id to its position (an order kept, so "ids below" comparisons still hold),
                             `raw(dense)` maps back (-1, the storage of bytes no row names, stays -1);
  lowest(ids, keys)          each distinct id with its least key, by a sort: memory by count, not by value;
  place(...)                 the space of a run's lifetimes.Lists and metadata ids, and them moved into it.
"""

import numpy as np

__all__ = ["IdSpace", "PER_ID", "SLACK", "dense_enough", "lowest", "place"]

SLACK = 2**20  # ids beyond the count that arrays by id may span (the same slack the checks allow: max_storage_id)
PER_ID = 16  # ... and per id (or row) counted


def dense_enough(top, count):
    """Whether arrays indexed by id from 0 to `top` cost no more than `count` ids (or rows) do."""
    return top < SLACK + PER_ID * max(int(count), 0)


def lowest(ids, keys):
    """(distinct `ids` ascending, the least of `keys` of each): a sort, whatever the ids' values."""
    if not len(ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((keys, ids))
    ids, keys = ids[order], keys[order]
    start = np.r_[True, ids[1:] != ids[:-1]]
    return ids[start], keys[start]


class IdSpace:
    """Positions for the distinct ids a run names (see the module docstring); None ids: each id is its own position."""

    def __init__(self, ids=None):
        self.ids = ids

    def dense(self, raw):
        """Positions of ids that are in the space (-1 stays -1)."""
        if self.ids is None:
            return raw
        raw = np.asarray(raw, dtype=np.int64)
        return np.where(raw >= 0, np.searchsorted(self.ids, raw), -1)

    def raw(self, dense):
        """The ids at positions `dense` (-1 stays -1)."""
        if self.ids is None:
            return dense
        dense = np.asarray(dense, dtype=np.int64)
        return np.where(dense >= 0, self.ids[np.maximum(dense, 0)] if len(self.ids) else -1, -1)


def place(lists, params, entry, resized, top, rows):
    """(IdSpace, lists, params, entry, resized, top) for lifetimes.Storages: as given when arrays by id up to `top`
    are dense_enough, else moved to positions among the ids named. `lists`: the run's lifetimes.Lists; `params`:
    {storage id: (bytes, dtype)}; `entry`: [id, bytes] rows; `resized`: [row, id, bytes] rows; `rows`: the run's."""
    count = len(lists.seen) + len(lists.free_ids) + len(params) + len(entry) + len(resized) + rows
    if dense_enough(top, count):
        return IdSpace(), lists, params, entry, resized, top
    ids = np.unique(
        np.concatenate(
            [
                np.asarray(a, dtype=np.int64)
                for a in (
                    lists.seen,
                    lists.free_ids,
                    lists.comm,
                    lists.known[0],
                    list(params),
                    entry[:, 0],
                    resized[:, 1],
                )
            ]
        )
    )
    space = IdSpace(ids)
    to, row_max = space.dense, lists.row_max
    lists = lists._replace(
        seen=to(lists.seen),
        free_ids=to(lists.free_ids),
        comm=to(lists.comm),
        row_max=lambda: to(row_max()),
        top=len(ids) - 1,
    )
    params = dict(zip(to(np.fromiter(params, np.int64, len(params))).tolist(), params.values()))
    entry = np.stack([to(entry[:, 0]), entry[:, 1]], axis=1) if len(entry) else entry
    resized = np.stack([resized[:, 0], to(resized[:, 1]), resized[:, 2]], axis=1) if len(resized) else resized
    return space, lists, params, entry, resized, len(ids) - 1
