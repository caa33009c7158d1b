"""The storage-lifetime model behind the memory reports: each storage's size, birth, death and category.

How a trace's storages are accounted (see tracer.recording.storage):
  * a storage is allocated by the row where it first appears as an output of
    an op that allocated bytes. Its size is the `output_storage_bytes` of its
    first appearance as an output with bytes (schema v2: the whole storage, as
    live_bytes counts it); a v1 trace has none, so the row's `bytes_allocated` is
    used, split over several new outputs by numel x element size;
  * a storage first seen as an input existed before: parameters and buffers
    were registered when the trace began (they are in the first `live_bytes`);
    a tensor made before the trace and first used by row i (the batch) joins
    `live_bytes` at row i. Its size is that of a later appearance as an output
    with bytes (an in-place op on it) when there is one, else read from the rise
    of `live_bytes`;
  * a storage is freed at the row whose `freed_storage_ids` lists it (it was
    gone before that row's op ended); storages never freed are alive at the end.
  * traces from a tracer that registers at entry (metadata storage_roles["at_entry"]:
    [id, bytes] of every storage alive when the Tracer was entered: parameters,
    buffers, gradients, optimizer state, FSDP2's unsharded parameters) take those
    storages and sizes as given, alive from the first row, whether or not a row names
    them; the guesses above are only for what existed before and joined later (the batch);
  * a storage resized in place (storage_roles["resized"]: [seq, id, bytes]; FSDP2
    resizes each unsharded parameter to 0 after use and back before the next) holds
    those bytes from the row with that seq on: its life is cut into pieces of
    constant size, and the `storages` table gives its largest size.
Bytes live at the start that no row ever names (unused buffers, in traces without
"at_entry") appear as one storage with id -1, so that the categories add up to
`live_bytes` at every row.

Categories, first match wins:
  parameters            the model's parameters (trace metadata), and those of modules outside
                        model= (storage_roles["external_parameter"]: a frozen teacher's weights
                        take memory as parameters, though they are not part of N); under FSDP2
                        the rank's shards
  unsharded_parameters  FSDP2's full parameters, all-gathered for a unit's forward and
                        backward (metadata "unsharded_parameters"), while they hold bytes
  gradients             tensors that were a parameter's .grad (FSDP2: the sharded gradient)
  optimizer_state       tensors in the optimizer's state (AdamW: exp_avg, exp_avg_sq, step)
  communication_buffers tensors a collective read or wrote (DDP's gradient buckets, FSDP2's
                        all-gather and reduce-scatter buffers); NB: also an activation that a
                        functional all-reduce writes (tensor parallelism)
  activations           allocated in the forward phase of a step and still alive when
                        the step's next backward begins: what autograd saved for it
  inputs                existed before the op that first used it: the batch, buffers
  temporaries           everything else
"""

import numpy as np
import pyarrow as pa

from reports._util import unique
from reports.arrays import numpy_of, objects_of
from reports.memory.id_space import place
from reports.memory.resizes import largest, resize_deltas, resize_events, split_pieces
from reports.memory.rises import joined_sizes
from reports.memory.run_rows import Lists, RunRows

__all__ = ["CATEGORIES", "DTYPE_BYTES", "Lists", "Storages", "dtype_sizes"]

CATEGORIES = (
    "parameters",
    "unsharded_parameters",
    "gradients",
    "optimizer_state",
    "communication_buffers",
    "activations",
    "inputs",
    "temporaries",
)
AT_ENTRY, RESIZED = "at_entry", "resized"  # size facts in storage_roles (tracer.recording.metadata)
_CAT = {name: i for i, name in enumerate(CATEGORIES)}

# Bytes per element, by the dtype names the tracer writes: the fallback for traces made before the
# run metadata's `dtype_bytes` (the tracer's own `dtype.itemsize` of every dtype it recorded). Every
# dtype of torch 2.13 with its `itemsize`: the sub-byte kinds (int1-int7, uint1-uint7, bits1x8, ...)
# each take a byte per element there.
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    **{f"int{k}": 1 for k in range(1, 8)}, **{f"uint{k}": 1 for k in range(1, 8)},
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
}  # fmt: skip


def dtype_sizes(meta):
    """{dtype name: bytes per element}: the trace's own `dtype_bytes` over the table above (v1/v2 traces lack it)."""
    recorded = (meta or {}).get("dtype_bytes")
    if not isinstance(recorded, dict) or not recorded:
        return DTYPE_BYTES
    return {**DTYPE_BYTES, **{str(k): int(v) for k, v in recorded.items() if isinstance(v, int) and v >= 0}}


def _extent_bytes(shape, stride, itemsize):
    """Bytes a tensor spans in its storage: numel x element size when contiguous, 0 when empty."""
    if any(int(n) == 0 for n in shape):
        return 0
    return itemsize * (1 + sum((int(n) - 1) * abs(int(s)) for n, s in zip(shape, stride)))


class Storages:
    """The storages of one run (with at least one row) as arrays indexed by storage id, or by position among the ids
    named where those are too sparse for that (`space`: reports.memory.id_space); rows are positions, not seq."""

    def __init__(self, name, meta, rows, lists=None):
        """`rows`: a reports.memory.run_rows.RunRows, or a frame of one run's rows in seq order (reports.load's) read
        through reports.memory.frame_rows; `lists`: the run's `Lists` where `rows` holds none."""
        if not isinstance(rows, RunRows):
            from reports.memory.frame_rows import run_rows

            rows = run_rows(rows)
        self.name, self.meta, self.rows = name, meta, rows
        n = self.n = len(rows)
        self.live, self.allocated = rows.live_bytes, rows.bytes_allocated
        lists = rows.lists if lists is None else lists
        self.in_offsets, self.out_offsets = lists.in_offsets, lists.out_offsets

        self.itemsize = dtype_sizes(meta)
        params = {}
        for p in (meta.get("parameters") or {}).values():  # tied parameters share one storage
            params.setdefault(int(p["storage_id"]), (int(p["numel"]) * self.itemsize.get(p["dtype"], 0), p["dtype"]))
        roles = meta.get("storage_roles") or {}
        self.exact = AT_ENTRY in roles  # every storage alive at entry is listed with its size
        entry = np.asarray(roles.get(AT_ENTRY) or [], dtype=np.int64).reshape(-1, 2)
        resized = np.asarray(roles.get(RESIZED) or [], dtype=np.int64).reshape(-1, 3)
        top = max([-1, lists.top, *params] + [int(a.max()) for a in (entry[:, 0], resized[:, 1]) if len(a)])
        known_ids, known_bytes = lists.known
        self.space, lists, params, entry, resized, top = place(lists, params, entry, resized, top, n)
        self.params = params
        self.free_rows, self.free_ids, self.free_offsets = lists.free_rows, lists.free_ids, lists.free_offsets
        self.size = np.full(top + 1, -1, dtype=np.int64)
        self.alloc = np.full(top + 1, -2, dtype=np.int64)  # row that allocated it; -1: before the trace; -2: unseen
        self.made = np.zeros(top + 1, dtype=bool)  # allocated by an op of the trace (not an input from before)

        seen, first_row, as_output, first_at = lists.seen, lists.first_row, lists.as_output, lists.first_at
        new, joined = as_output, ~as_output  # first seen as an output (made by its row), as an input
        if len(entry):  # given, not guessed: neither made by a row nor joined at one
            at_entry = np.zeros(top + 1, dtype=bool)
            at_entry[entry[:, 0]] = True
            keep = ~at_entry[seen]
            new, joined = new & keep, joined & keep
        self.comm = lists.comm

        self._new = (seen, first_at, new)  # the new storages and their flat output positions: `table` reads them
        sids, joined_sids = seen[new], seen[joined]
        known = np.full(top + 1, -1, dtype=np.int64)  # output_storage_bytes at a first appearance with bytes
        known[self.space.dense(known_ids)] = known_bytes
        sizes, joined_known = known[sids], known[joined_sids]  # (-1: none) of the new and of the joined storages
        del known
        # bytes each row's new storages take (bytes_allocated in a v1 trace): rows ascending, running sums
        made = self._outputs(sids, first_row[new], sizes, lambda: first_at[new])
        del sids, sizes
        # made after the new storages' sizes, whose reading is the model's largest moment
        self.dtype = np.full(top + 1, None, dtype=object)
        self.free = np.full(top + 1, -1, dtype=np.int64)  # row whose freed list has it; -1: never freed
        self.free[self.free_ids] = self.free_rows
        for sid, (nbytes, dtype) in params.items():
            self.size[sid], self.dtype[sid], self.alloc[sid] = nbytes, dtype, -1
        self.size[entry[:, 0]], self.alloc[entry[:, 0]] = entry[:, 1], -1
        self.dtype[entry[:, 0]] = np.where(self.dtype[entry[:, 0]] == None, "unknown", self.dtype[entry[:, 0]])  # noqa: E711
        at = np.searchsorted(rows.seq, resized[:, 0])  # the row from which each new size counts
        keep = at < n
        self.resizes = (at[keep], resized[keep, 1], resized[keep, 2])
        if self.exact:  # what the tracer registered at entry is listed: every other input joined at its row
            seen_before = None
        else:
            seen_before = np.maximum.accumulate(np.concatenate([[max(params, default=-1)], lists.row_max()]))[:-1]
        self._inputs(joined_sids, first_row[joined], first_at[joined], seen_before, joined_known, made)
        for sid in np.flatnonzero((self.free >= 0) & (self.size < 0)).tolist():
            self.size[sid], self.dtype[sid], self.alloc[sid] = 0, "unknown", -1  # registered at the start, never named

        # Bytes live when the trace began that no row names (unused buffers): storage -1.
        self.unnamed = 0
        nbytes = self.live_pieces(0, categories=False)[0]
        self.unnamed = int(self.live[0] - nbytes.sum())

    def _outputs(self, sids, row, size, at):
        """New storages (`sids`, made at rows `row`, at the flat output positions at() gives): the size read from
        output_storage_bytes (`size`, filled in place where -1), else one in a row takes the row's bytes_allocated and
        several split it by numel x size. Returns the rows that made storages, ascending, and the running sum of their
        bytes up to each (reports.memory.rises.joined_sizes' `made`)."""
        self.alloc[sids], self.made[sids] = row, True
        # the storages by row (rows come nearly ascending: ids are handed out in order), read once for the rows
        # with one new storage and for the running sums
        by_row = None if (row[1:] >= row[:-1]).all() else np.argsort(row, kind="stable")
        ordered = row if by_row is None else row[by_row]
        alone = np.ones(len(row), dtype=bool)  # the only new storage of its row
        same = ordered[1:] == ordered[:-1]
        alone[1:] &= ~same
        alone[:-1] &= ~same
        if by_row is not None:
            alone[by_row] = alone.copy()
        guess = alone & (size < 0)
        size[guess] = self.allocated[row[guess]]
        several = np.flatnonzero(~alone)
        if len(several):
            self._split(size, several, row[several], at()[several])
        self.size[sids] = size
        running = size if by_row is None else size[by_row]  # (`size` itself is read no more)
        return ordered, np.cumsum(running, out=running)

    def _split(self, size, where, row, at):
        """The sizes of new storages that share their row (at positions `where` of `size`, which holds their
        output_storage_bytes or -1): in the rows where one lacks it, the row's bytes_allocated split by numel x size."""
        # a size read from output_storage_bytes replaces the guess below: guess only rows with a storage lacking one
        unknown = np.isin(row, row[size[where] < 0])
        where, row, at = where[unknown], row[unknown], at[unknown]
        if not len(where):
            return
        several = unique(row)
        shapes = self.rows.cell_lists("output_shapes", several, pa.list_(pa.int64()))
        dtypes = objects_of(self.rows.cell_lists("output_dtypes", several, pa.string()).flatten())
        tensors = shapes.flatten()  # one shape per output tensor of those rows, in order
        dims, bounds = numpy_of(tensors.flatten()), numpy_of(tensors.offsets)
        numel = np.ones(len(tensors), dtype=np.int64)
        filled = bounds[1:] > bounds[:-1]
        if filled.any():
            numel[filled] = np.multiply.reduceat(dims, bounds[:-1][filled])
        itemsize = self.itemsize
        nbytes = numel * np.fromiter((itemsize.get(d, 0) for d in dtypes), dtype=np.int64, count=len(dtypes))
        # flat output index -> index in `tensors`
        starts = self.out_offsets[several]
        local = np.concatenate([[0], np.cumsum(self.out_offsets[several + 1] - starts)])[:-1]
        index = at - starts[np.searchsorted(several, row)] + local[np.searchsorted(several, row)]
        guess = nbytes[index]
        order = np.lexsort((at, row))
        where, row, guess = where[order], row[order], guess[order]
        rest = self.allocated[several] - np.bincount(
            np.searchsorted(several, row), weights=guess, minlength=len(several)
        ).astype(np.int64)
        firsts = np.searchsorted(row, several)  # the first new storage of each row takes what numel x size misses
        guess[firsts] = np.maximum(guess[firsts] + rest, 0)
        size[where] = np.where(size[where] >= 0, size[where], guess)

    def _inputs(self, sids, row, at, seen_before, known, made):
        """Storages first seen as inputs: registered at the start (buffers) or joining live_bytes at their row. `known`:
        each one's output_storage_bytes (-1: none); `made`: what _outputs returns."""
        columns = ("input_shapes", "input_strides", "input_dtypes")
        which = unique(row)  # only the rows where a storage is first seen as an input are read
        dtypes = self.rows.cell_objects(columns[2], which)
        # shapes and strides only where no output_storage_bytes gives the size
        params = np.fromiter(self.params, dtype=np.int64, count=len(self.params))
        measure = unique(row[(known < 0) & ~np.isin(sids, params)])
        shapes, strides = (self.rows.cell_objects(c, measure) if len(measure) else [] for c in columns[:2])
        estimate = {}
        resized = resize_deltas(self.resizes, self.size, self.n)
        keep = ~np.isin(sids, params)
        sids, row, at, known = sids[keep], row[keep], at[keep], known[keep]
        place = at - self.in_offsets[row]  # in the row's inputs
        # ids grow in registration order: one below every id seen before its row was registered at the start
        early = np.zeros(len(sids), dtype=bool) if seen_before is None else sids < seen_before[row]
        for sid, k, i, m, nbytes in zip(
            sids.tolist(),
            place.tolist(),
            np.searchsorted(which, row).tolist(),
            np.searchsorted(measure, row).tolist(),
            known.tolist(),
        ):
            self.dtype[sid] = dtypes[i][k]
            if nbytes < 0:
                estimate[sid] = _extent_bytes(shapes[m][k], strides[m][k], self.itemsize.get(dtypes[i][k], 0))
            else:
                estimate[sid] = nbytes
        start = sids[early]
        self.size[start] = np.fromiter((estimate[s] for s in start.tolist()), dtype=np.int64, count=len(start))
        self.alloc[start] = -1
        frees = (self.free_offsets, self.free_ids)
        joined, size, alloc = joined_sizes(
            sids[~early], row[~early], estimate, resized, self.size, self.live, made, frees
        )
        self.size[joined], self.alloc[joined] = size, alloc

    def arrays(self):
        """(storage ids, nbytes, alloc row, free row, made by an op) of every storage, -1 first if any."""
        sids = np.flatnonzero(self.alloc >= -1)
        arrays = [sids, self.size[sids], self.alloc[sids], self.free[sids], self.made[sids]]
        if self.unnamed:
            arrays = [np.r_[first, a] for first, a in zip((-1, self.unnamed, -1, -1, False), arrays)]
        return arrays

    def pieces(self, arrays=None):
        """(index into `arrays()`, nbytes, alloc row, free row, storage id) of each stretch of a storage's
        life at one size: one per storage, more for a storage resized in place (FSDP2's unsharded
        parameters), none while it holds 0 bytes. `arrays`: what arrays() gives, when the caller holds it."""
        return split_pieces(*(self.arrays() if arrays is None else arrays), *resize_events(self.resizes, self.size))

    def largest(self, sids, nbytes):
        """nbytes of each storage, or the largest size a resize gave it."""
        return largest(sids, nbytes, self.resizes, len(self.size))

    def live_pieces(self, row=None, categories=True):
        """(nbytes, alloc row, free row, category index) of each piece (see `pieces`); with `row`, of the pieces
        live after that row (counted from alloc + 1, gone from free + 1: reports.memory.live.live_columns), the
        others not looked at where no storage is resized in place; `categories`: False for None in their place."""
        if row is None or len(self.resizes[1]):
            sids, _, by_alloc, by_free, made = arrays = self.arrays()
            index, nbytes, alloc, free, _ = self.pieces(arrays)
            if row is not None:
                live = (alloc <= row) & ((free < 0) | (free > row))
                index, nbytes, alloc, free = index[live], nbytes[live], alloc[live], free[live]
            cat = self.categories(sids, by_alloc, by_free, made)[index] if categories else None
            return nbytes, alloc, free, cat
        # a piece per storage that holds bytes (split_pieces without resizes), the live ones picked by id
        alloc, free = self.alloc, self.free
        sids = np.flatnonzero((alloc >= -1) & (alloc <= row) & ((free < 0) | (free > row)) & (self.size != 0))
        arrays = [sids, self.size[sids], alloc[sids], free[sids], self.made[sids]]
        if self.unnamed:  # storage -1 (see `arrays`): live from before the first row to the end
            arrays = [np.r_[first, a] for first, a in zip((-1, self.unnamed, -1, -1, False), arrays)]
        sids, nbytes, alloc, free, made = arrays
        return nbytes, alloc, free, self.categories(sids, alloc, free, made) if categories else None

    def categories(self, sids, alloc, free, made):
        """Category index (into CATEGORIES) of each storage."""
        cat = np.where(made, _CAT["temporaries"], _CAT["inputs"])
        rows = self.rows
        steps = rows.step
        backward = rows.in_phase("backward")
        # rows where a backward begins (several per step with gradient accumulation)
        begins = np.flatnonzero(backward & ~np.r_[False, backward[:-1] & (steps[1:] == steps[:-1])])
        if len(begins):
            take = np.maximum(alloc, 0)
            after = np.minimum(np.searchsorted(begins, take, side="right"), len(begins) - 1)
            start = begins[after]  # the first backward to begin after the storage was allocated, in its step
            forward = made & rows.in_phase("forward")[take] & (start > take) & (steps[start] == steps[take])
            cat[forward & ((free < 0) | (free > start))] = _CAT["activations"]
        roles = self.meta.get("storage_roles") or {}
        cat[np.isin(sids, self.comm)] = _CAT["communication_buffers"]
        ids = self.space.raw(sids)  # the metadata's roles name ids, not positions
        cat[np.isin(ids, np.asarray(roles.get("optimizer_state", []), dtype=np.int64))] = _CAT["optimizer_state"]
        cat[np.isin(ids, np.asarray(roles.get("gradient", []), dtype=np.int64))] = _CAT["gradients"]
        unsharded = [int(p["storage_id"]) for p in (self.meta.get("unsharded_parameters") or {}).values()]
        cat[np.isin(ids, np.asarray(unsharded, dtype=np.int64))] = _CAT["unsharded_parameters"]
        cat[np.isin(ids, np.asarray(roles.get("external_parameter", []), dtype=np.int64))] = _CAT["parameters"]
        cat[np.isin(sids, np.fromiter(self.params, dtype=np.int64, count=len(self.params)))] = _CAT["parameters"]
        return cat

    def table(self):
        """{column: array} of one row per storage (see reports.memory.memory.storages) without `run`, `phase`, `module`
        and `op` (-1 in `free_seq`: alive at the end), plus the row positions `_alloc_row` and `_free_row`."""
        rows = self.rows
        sids, nbytes, alloc, free, made = self.arrays()
        cat = self.categories(sids, alloc, free, made)
        nbytes = self.largest(sids, nbytes)
        dtype = np.full(len(sids), "unknown", dtype=object)
        known = sids >= 0
        dtype[known] = self.dtype[sids[known]]
        seen, first_at, new = self._new
        new_out = seen[new]
        if len(new_out):  # output dtypes, read only now
            flat = objects_of(rows.cell_lists("output_dtypes", kind=pa.string()).flatten())
            dtype[np.searchsorted(sids, new_out)] = flat[first_at[new]]
        has = alloc >= 0
        at = np.where(has, alloc, 0)
        return {
            "storage_id": np.asarray(self.space.raw(sids), dtype=np.int64),
            "nbytes": nbytes.astype(np.int64),
            "dtype": dtype,
            "category": np.asarray(CATEGORIES, dtype=object)[cat],
            "allocated": made,
            "alloc_seq": np.where(has, rows.seq[at], -1),
            "free_seq": np.where(free >= 0, rows.seq[np.maximum(free, 0)], -1),
            "step": np.where(has, rows.step[at], -1),
            "_alloc_row": alloc,
            "_free_row": free,
        }
