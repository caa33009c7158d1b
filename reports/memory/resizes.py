"""Storages whose size changes in place, and storages collectives use: helpers of reports.memory.lifetimes.

A resize is (row, storage id, bytes): from that row on the storage holds that many bytes
(storage_roles["resized"] of the trace metadata, seq turned into row positions). FSDP2
resizes each unsharded parameter to 0 after use and back before the next, so its life
is cut into pieces of constant size.
"""

import numpy as np

from reports._util import unique

COLLECTIVE_PREFIXES = ("c10d.", "_c10d_functional.", "_c10d_functional_autograd.")


def collective_storages(rows, in_rows, in_ids, out_rows, out_ids):
    """Ids of the storages a collective row read or wrote (`rows`: a frame of reports.load's)."""
    import pandas as pd  # the frame's: imported already

    op = rows["op"]
    if isinstance(op.dtype, pd.CategoricalDtype):
        names = np.asarray(op.cat.categories, dtype=str)
        hit = np.zeros(len(names), dtype=bool)
        for prefix in COLLECTIVE_PREFIXES:
            hit |= np.char.startswith(names, prefix)
        codes = op.cat.codes.to_numpy()
        collective = np.where(codes >= 0, np.r_[hit, False][codes], False)
    else:
        collective = op.astype(str).str.startswith(COLLECTIVE_PREFIXES).to_numpy()
    if not collective.any():
        return np.zeros(0, dtype=np.int64)
    return unique(np.concatenate([in_ids[collective[in_rows]], out_ids[collective[out_rows]]]))


def resize_events(resizes, size):
    """The resizes by storage, then row, one per (storage, row) (the last recorded):
    (row, storage id, bytes, the size before). `size`: each storage's size before its first resize."""
    rows, sids, nbytes = resizes
    if not len(sids):
        return rows, sids, nbytes, nbytes
    order = np.lexsort((np.arange(len(sids)), rows, sids))
    rows, sids, nbytes = rows[order], sids[order], nbytes[order]
    last = np.r_[(sids[1:] != sids[:-1]) | (rows[1:] != rows[:-1]), True]
    rows, sids, nbytes = rows[last], sids[last], nbytes[last]
    first = np.r_[True, sids[1:] != sids[:-1]]
    before = np.where(first, np.maximum(size[sids], 0), np.r_[0, nbytes[:-1]])
    return rows, sids, nbytes, before


def resize_deltas(resizes, size, n):
    """{row: bytes that resizes added to that row's live_bytes}."""
    rows, _, nbytes, before = resize_events(resizes, size)
    delta = np.bincount(rows, weights=nbytes - before, minlength=n) if len(rows) else np.zeros(0)
    return {int(r): int(round(delta[r])) for r in np.flatnonzero(delta)}


def split_pieces(sids, nbytes, alloc, free, made, rows, rsids, rbytes, before):
    """(index into the storages, nbytes, alloc row, free row, storage id) of each stretch of a
    storage's life at one size; `sids` ascend. A piece holding 0 bytes is left out."""
    index = np.arange(len(sids))
    if len(rsids):
        at = np.searchsorted(sids, rsids)
        ok = (at < len(sids)) & (sids[np.minimum(at, len(sids) - 1)] == rsids)
        rows, rsids, rbytes, at = rows[ok], rsids[ok], rbytes[ok], at[ok]
        rows = np.maximum(rows, alloc[at])  # a resize before the storage joined counts from its first row
        ok = (free[at] < 0) | (rows < free[at])
        rows, rsids, rbytes, at = rows[ok], rsids[ok], rbytes[ok], at[ok]
    if len(rsids):
        first = np.r_[True, rsids[1:] != rsids[:-1]]
        more = np.r_[~first[1:], False]  # the next resize is the same storage's
        end = np.where(more, np.r_[rows[1:], 0], free[at])
        base_free = free.copy()
        base_free[at[first]] = rows[first]  # the size before a storage's first resize ends there
        index, nbytes = np.r_[index, at], np.r_[nbytes, rbytes]
        alloc, free, sids = np.r_[alloc, rows], np.r_[base_free, end], np.r_[sids, rsids]
    held = (nbytes != 0) & ((free < 0) | (free > np.maximum(alloc, 0)))
    return index[held], nbytes[held], alloc[held], free[held], sids[held]


def largest(sids, nbytes, resizes, top):
    """nbytes of each storage, or the largest size a resize gave it (`top`: ids below it)."""
    _, rsids, rbytes = resizes
    if not len(rsids):
        return nbytes
    most = np.zeros(top, dtype=np.int64)
    np.maximum.at(most, rsids, rbytes)
    return np.maximum(nbytes, np.where(sids >= 0, most[np.maximum(sids, 0)], 0))
