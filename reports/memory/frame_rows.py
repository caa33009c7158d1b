"""The library's feed of the storage-lifetime model (reports.memory.lifetimes.Storages): a run of the frame
reports.load returns, as reports.memory.run_rows.RunRows and Lists (`run_rows`, `lists_of`), read from the frame's
columns. `optrace report` feeds the model from a scan of the trace's files instead, without pandas
(reports.memory.sql_categories.memory_rows); tests/reports/sql/test_sql_sections.py checks that both feeds agree.
"""

import numpy as np
import pandas as pd
import pyarrow as pa

from reports.loading.columns import cell_lists, cell_objects, flat
from reports.loading.load import runs_of
from reports.memory.id_space import dense_enough, lowest
from reports.memory.resizes import collective_storages
from reports.memory.run_rows import Lists, RunRows

__all__ = ["lists_of", "run_rows", "runs_in_order", "take"]


def run_rows(rows):
    """The RunRows of one run's rows (a frame in seq order, from reports.load), its Lists read from the frame."""
    phase = rows["phase"]
    if isinstance(phase.dtype, pd.CategoricalDtype):
        codes, phases = phase.cat.codes.to_numpy(), list(phase.cat.categories)
    else:
        codes, phases = pd.factorize(phase)
    columns = {c: rows[c].to_numpy(dtype=np.int64) for c in ("seq", "step", "live_bytes", "bytes_allocated")}
    return RunRows(
        {**columns, "phase": np.asarray(codes)},
        phases,
        lambda column, positions=None, kind=pa.int64(): cell_lists(rows, column, positions, kind),
        lambda column, positions=None: cell_objects(rows, column, positions),
        lists_of(rows),
    )


def take(series, index):
    """series.to_numpy()[index] as objects, without materialising a whole categorical column."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        labels = np.asarray(series.cat.categories, dtype=object)
        codes = series.cat.codes.to_numpy()[index]
        return np.where(codes >= 0, labels[np.maximum(codes, 0)], None)
    return series.to_numpy(dtype=object)[index]


def runs_in_order(df):
    """(run name, metadata, the run's rows in seq order) for each run, in load order."""
    runs = runs_of(df)
    for name, meta in runs.items():
        rows = df if len(runs) == 1 and bool((df["run"] == name).all()) else df[df["run"] == name]
        if not rows["seq"].is_monotonic_increasing:
            rows = rows.sort_values("seq", kind="stable")
        yield name, meta, rows


def _explode(column):
    """A column of id lists as (row position of each value, values, offset of each row's first value)."""
    offsets, values = flat(column)
    n = len(offsets) - 1
    rows = np.repeat(
        np.arange(n, dtype=np.int32 if n < 2**31 else np.int64), np.diff(offsets)
    )  # int32: half the memory
    return rows, values, offsets


def lists_of(rows):
    """The `Lists` of one run's rows (a frame in seq order with the id list columns)."""
    n = len(rows)
    in_rows, in_ids, in_offsets = _explode(rows["input_storage_ids"])
    out_rows, out_ids, out_offsets = _explode(rows["output_storage_ids"])
    free_rows, free_ids, free_offsets = _explode(rows["freed_storage_ids"])
    top = max([-1] + [int(a.max()) for a in (in_ids, out_ids, free_ids) if len(a)])
    dense = dense_enough(top, len(in_ids) + len(out_ids) + len(free_ids) + n)  # else arrays by id: id_space.py
    # First appearance of each id: the least (row, inputs before outputs, place in the flat list).
    width = max(len(in_ids), len(out_ids)) + 1
    first = np.full(top + 1 if dense else 0, np.iinfo(np.int64).max, dtype=np.int64)
    keys = []
    for ids, rows_of, side in ((in_ids, in_rows, 0), (out_ids, out_rows, 1)):
        key = np.arange(
            len(ids), dtype=np.int64
        )  # (row * 2 + side) * width + place, a slice at a time: small temporaries
        for lo in range(0, len(ids), 1 << 18):
            key[lo : lo + (1 << 18)] += (rows_of[lo : lo + (1 << 18)].astype(np.int64) * 2 + side) * width
        if dense:
            np.minimum.at(first, ids, key)
        else:
            keys.append(key)
        del key
    if dense:
        seen = np.flatnonzero(first != np.iinfo(np.int64).max)
        first = first[seen]
    else:
        seen, first = lowest(np.concatenate([in_ids, out_ids]).astype(np.int64, copy=False), np.concatenate(keys))
    first_key, first_at = np.divmod(first, width)  # index into the flat list
    del first, keys

    def row_max():
        found = np.full(n, -1, dtype=np.int64)
        np.maximum.at(found, in_rows, in_ids)
        np.maximum.at(found, out_rows, out_ids)
        return found

    return Lists(
        in_offsets,
        out_offsets,
        free_rows,
        free_ids,
        free_offsets,
        seen,
        first_key // 2,
        (first_key % 2).astype(bool),
        first_at,
        _first_output_bytes(rows, out_ids, out_offsets, top if dense else None),
        collective_storages(rows, in_rows, in_ids, out_rows, out_ids),
        row_max,
        top,
    )


def _first_output_bytes(rows, out_ids, out_offsets, top):
    """[ids ascending, bytes]: `output_storage_bytes` of each storage at its first appearance as an output with bytes
    (none in a v1 trace). `top`: the highest id, for an array by id; None: ids too sparse for one (id_space.py)."""
    if "output_storage_bytes" not in rows.columns or not len(out_ids):
        return np.zeros((2, 0), dtype=np.int64)
    offsets, values = flat(rows["output_storage_bytes"])  # a null list: no items, so its row is skipped below
    lengths, counts = np.diff(offsets), np.diff(out_offsets)
    ok = lengths == counts
    if not ok.all():  # rows whose sizes do not pair with their outputs one to one are left out
        keep = np.repeat(ok, counts)
        sids, values = out_ids[keep], values[np.repeat(ok, lengths)]
    else:
        sids = out_ids
    with_bytes = np.flatnonzero(values >= 0)
    if top is None:  # outputs are in row order: the first appearance
        hit, first = lowest(sids[with_bytes].astype(np.int64, copy=False), with_bytes)
        return np.stack([hit, values[first]]).astype(np.int64, copy=False)
    first = np.full(top + 1, len(values), dtype=np.int64)
    np.minimum.at(first, sids[with_bytes], with_bytes)
    hit = np.flatnonzero(first < len(values))
    return np.stack([hit, values[first[hit]]]).astype(np.int64, copy=False)
