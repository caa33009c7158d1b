"""Memory: the peak, live bytes over time, and what the live bytes are.

Every function takes the DataFrame `reports.load` returns (one run or several)
and returns a DataFrame with a `run` column.

How a trace's storages are accounted (see tracer/storage.py):
  * a storage is allocated by the row where it first appears as an output of
    an op that allocated bytes; its size is the row's `bytes_allocated`, split
    over several new outputs by numel x element size;
  * a storage first seen as an input existed before: parameters and buffers
    were registered when the trace began (they are in the first `live_bytes`);
    a tensor made before the trace and first used by row i (the batch) joins
    `live_bytes` at row i, and its size is read from the rise of `live_bytes`;
  * a storage is freed at the row whose `freed_storage_ids` lists it (it was
    gone before that row's op ended); storages never freed are alive at the end.
Bytes live at the start that no row ever names (unused buffers) appear as one
storage with id -1, so that the categories add up to `live_bytes` at every row.

Categories, first match wins:
  parameters       the model's parameters (trace metadata)
  gradients        tensors that were a parameter's .grad
  optimizer_state  tensors in the optimizer's state (AdamW: exp_avg, exp_avg_sq, step)
  activations      allocated in the forward phase of a step and still alive when
                   the step's next backward begins: what autograd saved for it
  inputs           existed before the op that first used it: the batch, buffers
  temporaries      everything else
"""

import numpy as np
import pandas as pd
import pyarrow as pa

from reports.errors import ReportError
from reports.load import require, runs_of

__all__ = ["CATEGORIES", "by_category", "by_dtype", "peak", "storages", "timeline"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "temporaries")
_CAT = {name: i for i, name in enumerate(CATEGORIES)}

# Bytes per element, by the dtype names the tracer writes.
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
}  # fmt: skip

_STORAGE_COLUMNS = (
    "seq", "step", "op", "phase", "module", "input_storage_ids", "input_shapes", "input_strides",
    "input_dtypes", "output_storage_ids", "output_shapes", "output_dtypes", "freed_storage_ids",
    "bytes_allocated", "live_bytes",
)  # fmt: skip

_STORAGE_DTYPES = {
    "run": "object", "storage_id": "int64", "nbytes": "int64", "dtype": "object", "category": "object",
    "allocated": "bool", "alloc_seq": "int64", "free_seq": "Int64", "step": "int64", "phase": "object", "module": "object", "op": "object",
}  # fmt: skip


def _empty(dtypes):
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in dtypes.items()})


def _lists(column, kind=pa.int64()):
    """A column of lists as a pyarrow ListArray (fast to flatten)."""
    return pa.array(column.to_numpy(dtype=object), type=pa.list_(kind))


def _explode(column):
    """A column of id lists as (row position of each value, values, offset of each row's first value)."""
    lists = _lists(column)
    offsets = lists.offsets.to_numpy()
    rows = np.repeat(np.arange(len(lists), dtype=np.int64), np.diff(offsets))
    return rows, lists.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False), offsets


def _extent_bytes(shape, stride, dtype):
    """Bytes a tensor spans in its storage: numel x element size when contiguous, 0 when empty."""
    if any(int(n) == 0 for n in shape):
        return 0
    return DTYPE_BYTES.get(dtype, 0) * (1 + sum((int(n) - 1) * abs(int(s)) for n, s in zip(shape, stride)))


def _take(series, index):
    """series.to_numpy()[index] as objects, without materialising a whole categorical column."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        labels = np.asarray(series.cat.categories, dtype=object)
        codes = series.cat.codes.to_numpy()[index]
        return np.where(codes >= 0, labels[np.maximum(codes, 0)], None)
    return series.to_numpy(dtype=object)[index]


def _runs(df):
    """(run name, metadata, the run's rows in seq order) for each run, in load order."""
    for name, meta in runs_of(df).items():
        rows = df[df["run"] == name]
        if not rows["seq"].is_monotonic_increasing:
            rows = rows.sort_values("seq", kind="stable")
        yield name, meta, rows


class _Run:
    """The storages of one run (with at least one row) as arrays indexed by storage id; rows are positions, not seq."""

    def __init__(self, name, meta, rows):
        self.name, self.meta, self.rows = name, meta, rows
        n = self.n = len(rows)
        self.live = rows["live_bytes"].to_numpy(dtype=np.int64)
        self.allocated = rows["bytes_allocated"].to_numpy(dtype=np.int64)
        in_rows, in_ids, self.in_offsets = _explode(rows["input_storage_ids"])
        out_rows, out_ids, self.out_offsets = _explode(rows["output_storage_ids"])
        self.free_rows, self.free_ids, self.free_offsets = _explode(rows["freed_storage_ids"])

        params = {}
        for p in (meta.get("parameters") or {}).values():  # tied parameters share one storage
            params.setdefault(int(p["storage_id"]), (int(p["numel"]) * DTYPE_BYTES.get(p["dtype"], 0), p["dtype"]))
        self.params = params
        top = max([-1, *params] + [int(a.max()) for a in (in_ids, out_ids, self.free_ids) if len(a)])
        self.size = np.full(top + 1, -1, dtype=np.int64)
        self.dtype = np.full(top + 1, None, dtype=object)
        self.alloc = np.full(top + 1, -2, dtype=np.int64)  # row that allocated it; -1: before the trace; -2: unseen
        self.made = np.zeros(top + 1, dtype=bool)  # allocated by an op of the trace (not an input from before)
        self.free = np.full(top + 1, -1, dtype=np.int64)  # row whose freed list has it; -1: never freed
        self.free[self.free_ids] = self.free_rows

        # First appearance of each id; within a row the inputs come first.
        ids = np.concatenate([in_ids, out_ids])
        key = np.concatenate([in_rows * 2, out_rows * 2 + 1])
        at = np.concatenate([np.arange(len(in_ids)), np.arange(len(out_ids))])  # index into the flat list
        order = np.argsort(key, kind="stable")
        seen, first = np.unique(ids[order], return_index=True)
        first_key, first_at = key[order][first], at[order][first]
        first_row, as_output = first_key // 2, (first_key % 2).astype(bool)

        self.new_out, self.new_out_at = seen[as_output], first_at[as_output]
        self._outputs(self.new_out, first_row[as_output], self.new_out_at)
        for sid, (nbytes, dtype) in params.items():
            self.size[sid], self.dtype[sid], self.alloc[sid] = nbytes, dtype, -1
        row_max = np.full(n, -1, dtype=np.int64)
        if len(ids):
            np.maximum.at(row_max, np.concatenate([in_rows, out_rows]), ids)
        seen_before = np.maximum.accumulate(np.concatenate([[max(params, default=-1)], row_max]))[:-1]
        self._inputs(seen[~as_output], first_row[~as_output], first_at[~as_output], seen_before)
        for sid in np.flatnonzero((self.free >= 0) & (self.size < 0)).tolist():
            self.size[sid], self.dtype[sid], self.alloc[sid] = 0, "unknown", -1  # registered at the start, never named

        # Bytes live when the trace began that no row names (unused buffers): storage -1.
        joined0 = int(self.size[(self.alloc == 0) & ~self.made].sum())
        start = int(self.live[0] - self.allocated[0] - joined0 + self.size[self.freed_at(0)].sum())
        self.unnamed = start - int(self.size[(self.alloc == -1) & (self.size > 0)].sum())

    def freed_at(self, row):
        return self.free_ids[self.free_offsets[row] : self.free_offsets[row + 1]]

    def _outputs(self, sids, row, at):
        """New storages: one in a row takes the row's bytes_allocated; several split it by numel x size."""
        self.alloc[sids], self.made[sids] = row, True
        single = np.bincount(row, minlength=self.n)[row] == 1
        self.size[sids[single]] = self.allocated[row[single]]
        if single.all():
            return
        sids, row, at = sids[~single], row[~single], at[~single]
        several = np.unique(row)
        shapes = pa.array(self.rows["output_shapes"].to_numpy(dtype=object)[several], type=pa.list_(pa.list_(pa.int64())))
        dtypes = _lists(self.rows["output_dtypes"].iloc[several], pa.string()).flatten().to_numpy(zero_copy_only=False)
        tensors = shapes.flatten()  # one shape per output tensor of those rows, in order
        dims, bounds = tensors.flatten().to_numpy(), tensors.offsets.to_numpy()
        numel = np.ones(len(tensors), dtype=np.int64)
        filled = bounds[1:] > bounds[:-1]
        if filled.any():
            numel[filled] = np.multiply.reduceat(dims, bounds[:-1][filled])
        nbytes = numel * pd.Series(dtypes, dtype=object).map(DTYPE_BYTES).fillna(0).to_numpy(dtype=np.int64)
        # flat output index -> index in `tensors`
        starts = self.out_offsets[several]
        local = np.concatenate([[0], np.cumsum(self.out_offsets[several + 1] - starts)])[:-1]
        index = at - starts[np.searchsorted(several, row)] + local[np.searchsorted(several, row)]
        guess = nbytes[index]
        order = np.lexsort((at, row))
        sids, row, guess = sids[order], row[order], guess[order]
        rest = self.allocated[several] - np.bincount(np.searchsorted(several, row), weights=guess, minlength=len(several)).astype(np.int64)
        firsts = np.searchsorted(row, several)  # the first new storage of each row takes what numel x size misses
        guess[firsts] = np.maximum(guess[firsts] + rest, 0)
        self.size[sids] = guess

    def _inputs(self, sids, row, at, seen_before):
        """Storages first seen as inputs: registered at the start (buffers) or joining live_bytes at their row."""
        columns = ("input_shapes", "input_strides", "input_dtypes")
        shapes, strides, dtypes = (self.rows[c].to_numpy(dtype=object) for c in columns)
        estimate, joined = {}, {}
        for sid, r, j in zip(sids.tolist(), row.tolist(), at.tolist()):
            if sid in self.params:
                continue
            k = j - self.in_offsets[r]
            self.dtype[sid] = dtypes[r][k]
            estimate[sid] = _extent_bytes(shapes[r][k], strides[r][k], dtypes[r][k])
            if sid < seen_before[r]:  # ids grow in registration order: this one was registered at the start
                self.size[sid], self.alloc[sid] = estimate[sid], -1
            else:
                joined.setdefault(r, []).append(sid)
        for r in sorted(joined):  # the rise of live_bytes gives their size (row 0 has no rise to read)
            cands = sorted(joined[r])
            guesses = [estimate[s] for s in cands]
            if r == 0:
                split, rise = 0, sum(guesses)
            else:
                freed = self.freed_at(r)
                sizes = self.size[freed]
                freed_bytes = int(sizes[sizes > 0].sum()) + sum(estimate.get(int(s), 0) for s in freed[sizes < 0])
                rise = int(self.live[r] - self.live[r - 1] - self.allocated[r] + freed_bytes)
                # those registered at the start have the smaller ids: the split that explains the rise best
                split = min(range(len(cands) + 1), key=lambda k: (abs(rise - sum(guesses[k:])), k))
            for i, sid in enumerate(cands):
                self.size[sid], self.alloc[sid] = guesses[i], (-1 if i < split else r)
            if split < len(cands):
                self.size[cands[split]] = max(0, rise - sum(guesses[split + 1 :]))

    def arrays(self):
        """(storage ids, nbytes, alloc row, free row, made by an op) of every storage, -1 first if any."""
        sids = np.flatnonzero(self.alloc >= -1)
        arrays = [sids, self.size[sids], self.alloc[sids], self.free[sids], self.made[sids]]
        if self.unnamed:
            arrays = [np.r_[first, a] for first, a in zip((-1, self.unnamed, -1, -1, False), arrays)]
        return arrays

    def categories(self, sids, alloc, free, made):
        """Category index (into CATEGORIES) of each storage."""
        cat = np.where(made, _CAT["temporaries"], _CAT["inputs"])
        rows = self.rows
        steps = rows["step"].to_numpy(dtype=np.int64)
        backward = (rows["phase"] == "backward").to_numpy()
        # rows where a backward begins (several per step with gradient accumulation)
        begins = np.flatnonzero(backward & ~np.r_[False, backward[:-1] & (steps[1:] == steps[:-1])])
        if len(begins):
            take = np.maximum(alloc, 0)
            after = np.minimum(np.searchsorted(begins, take, side="right"), len(begins) - 1)
            start = begins[after]  # the first backward to begin after the storage was allocated, in its step
            forward = made & (rows["phase"] == "forward").to_numpy()[take] & (start > take) & (steps[start] == steps[take])
            cat[forward & ((free < 0) | (free > start))] = _CAT["activations"]
        roles = self.meta.get("storage_roles") or {}
        cat[np.isin(sids, np.asarray(roles.get("optimizer_state", []), dtype=np.int64))] = _CAT["optimizer_state"]
        cat[np.isin(sids, np.asarray(roles.get("gradient", []), dtype=np.int64))] = _CAT["gradients"]
        cat[np.isin(sids, np.fromiter(self.params, dtype=np.int64, count=len(self.params)))] = _CAT["parameters"]
        return cat

    def table(self):
        """One row per storage (see `storages`), plus the row positions `_alloc_row` and `_free_row`."""
        rows = self.rows
        sids, nbytes, alloc, free, made = self.arrays()
        cat = self.categories(sids, alloc, free, made)
        dtype = np.full(len(sids), "unknown", dtype=object)
        known = sids >= 0
        dtype[known] = self.dtype[sids[known]]
        if len(self.new_out):  # output dtypes, read only now
            flat = _lists(rows["output_dtypes"], pa.string()).flatten().to_numpy(zero_copy_only=False)
            dtype[np.searchsorted(sids, self.new_out)] = flat[self.new_out_at]
        has = alloc >= 0
        take = np.where(has, alloc, 0)
        seq = rows["seq"].to_numpy(dtype=np.int64)
        free_seq = pd.array(seq[np.maximum(free, 0)], dtype="Int64")
        free_seq[free < 0] = pd.NA
        return pd.DataFrame(
            {
                "run": self.name,
                "storage_id": sids.astype(np.int64),
                "nbytes": nbytes.astype(np.int64),
                "dtype": dtype,
                "category": np.asarray(CATEGORIES, dtype=object)[cat],
                "allocated": made,
                "alloc_seq": np.where(has, seq[take], -1),
                "free_seq": free_seq,
                "step": np.where(has, rows["step"].to_numpy(dtype=np.int64)[take], -1),
                **{c: np.where(has, _take(rows[c], take), "") for c in ("phase", "module", "op")},
                "_alloc_row": alloc,
                "_free_row": free,
            }
        )


def _each_run(df, what):
    """A `_Run` for each run of `df` that has rows, after checking the columns."""
    require(df, _STORAGE_COLUMNS, what)
    for name, meta, rows in _runs(df):
        if len(rows):
            yield _Run(name, meta, rows)


def storages(df):
    """One row per storage of each run: its size, dtype, lifetime and memory category.

    Columns: run, storage_id (-1: bytes live at the start that no row names),
    nbytes, dtype, category (see CATEGORIES), allocated (an op of the trace
    allocated it; False for what existed before: parameters, buffers, the batch,
    torch.tensor constants), alloc_seq (the op after which it counts as live: the
    op that allocated it or first used it; -1: registered when the trace began),
    free_seq (the op whose freed_storage_ids lists it; <NA>: alive at the end),
    and the step, phase, module and op at alloc_seq ("" and -1 before the trace)."""
    frames = [run.table().drop(columns=["_alloc_row", "_free_row"]) for run in _each_run(df, "storages")]
    if not frames:
        return _empty(_STORAGE_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_STORAGE_DTYPES)


def _live_by_category(run):
    """[rows, categories] int64: bytes live per category after each row of a run."""
    sids, nbytes, alloc, free, made = run.arrays()
    cat = run.categories(sids, alloc, free, made)
    n, ncat = run.n, len(CATEGORIES)
    start, end = alloc + 1, free + 1  # index 0: before the first row
    freed = end > 0
    index = np.concatenate([start * ncat + cat, end[freed] * ncat + cat[freed]])
    weights = np.concatenate([nbytes, -nbytes[freed]]).astype(np.float64)
    delta = np.bincount(index, weights=weights, minlength=(n + 1) * ncat)[: (n + 1) * ncat]
    return np.rint(delta).astype(np.int64).reshape(n + 1, ncat).cumsum(axis=0)[1:]


_TIMELINE_DTYPES = {
    "run": "object", "seq": "int64", "step": "int64", "phase": "object", "live_bytes": "int64",
    **{f"{c}_bytes": "int64" for c in CATEGORIES},
}  # fmt: skip


def timeline(df):
    """Live bytes after every row, and how they split into CATEGORIES (`<category>_bytes` columns).

    The category columns add up to `live_bytes` on every row (storage -1 of `storages`
    holds what no row names)."""
    frames = []
    for run in _each_run(df, "timeline"):
        live, rows = _live_by_category(run), run.rows
        frame = pd.DataFrame(
            {
                "run": run.name,
                "seq": rows["seq"].to_numpy(dtype=np.int64),
                "step": rows["step"].to_numpy(dtype=np.int64),
                "phase": _take(rows["phase"], slice(None)),
                "live_bytes": rows["live_bytes"].to_numpy(dtype=np.int64),
            }
        )
        for i, name in enumerate(CATEGORIES):
            frame[f"{name}_bytes"] = live[:, i]
        frames.append(frame)
    frames = [f for f in frames if len(f)]
    if not frames:
        return _empty(_TIMELINE_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_TIMELINE_DTYPES)


_PEAK_DTYPES = {
    "run": "object", "peak_live_bytes": "int64", "seq": "int64", "step": "int64",
    "phase": "object", "module": "object", "op": "object",
}  # fmt: skip


def peak(df):
    """The highest `live_bytes` of each run and the op after which it was reached (the first, on a tie)."""
    require(df, ("seq", "step", "op", "phase", "module", "live_bytes"), "peak")
    found = []
    for name, _, rows in _runs(df):
        if not len(rows):
            continue
        top = rows.iloc[int(np.argmax(rows["live_bytes"].to_numpy()))]
        found.append(
            {"run": name, "peak_live_bytes": top["live_bytes"], "seq": top["seq"], "step": top["step"],
             "phase": str(top["phase"]), "module": str(top["module"]), "op": str(top["op"])}
        )  # fmt: skip
    if not found:
        return _empty(_PEAK_DTYPES)
    return pd.DataFrame(found).astype(_PEAK_DTYPES)


_CATEGORY_DTYPES = {"run": "object", "category": "object", "bytes": "int64", "seq": "int64", "live_pct": "float64"}
_AT = ("peak", "end", "max")


def by_category(df, at="peak"):
    """Bytes live per category (see CATEGORIES) in each run, one row per (run, category).

    at   "peak": after the op with the run's highest live_bytes (default);
         "end": after the last op; an int: after the op with that seq;
         "max": each category at its own highest (activations peak when the
         backward begins, gradients when it ends: these are not simultaneous).
    Columns: run, category, bytes, seq (where measured), live_pct (share of
    live_bytes at that seq)."""
    if not (at in _AT or (isinstance(at, (int, np.integer)) and not isinstance(at, bool))):
        raise ReportError(f"by_category: at must be one of {list(_AT)} or an op's seq (int), got {at!r}")
    frames = []
    for run in _each_run(df, "by_category"):
        n, rows, name = run.n, run.rows, run.name
        if not n:
            continue
        live = _live_by_category(run)
        seq = rows["seq"].to_numpy(dtype=np.int64)
        total = rows["live_bytes"].to_numpy(dtype=np.int64)
        if at == "max":
            where = live.argmax(axis=0)
        else:
            if at == "peak":
                row = int(np.argmax(total))
            elif at == "end":
                row = n - 1
            else:
                hits = np.flatnonzero(seq == at)
                if not len(hits):
                    raise ReportError(f"by_category: run {name!r} has no op with seq {at} (its seq runs {seq[0]}..{seq[-1]})")
                row = int(hits[0])
            where = np.full(len(CATEGORIES), row)
        values = live[where, np.arange(len(CATEGORIES))]
        frames.append(
            pd.DataFrame(
                {
                    "run": name,
                    "category": list(CATEGORIES),
                    "bytes": values,
                    "seq": seq[where],
                    "live_pct": 100.0 * values / np.maximum(total[where], 1),
                }
            )
        )
    if not frames:
        return _empty(_CATEGORY_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_CATEGORY_DTYPES)


_DTYPE_DTYPES = {"run": "object", "dtype": "object", "storages": "int64", "bytes_allocated": "int64", "peak_live_bytes": "int64"}


def by_dtype(df):
    """Bytes allocated per dtype: one row per (run, dtype), most bytes first.

    Columns: storages and bytes_allocated (the storages ops of the trace allocated,
    so parameters and inputs are not counted), peak_live_bytes (bytes of that dtype
    live, whoever made them, after the op with the run's highest live_bytes).
    With bf16 autocast the matmul outputs move from float32 to bfloat16 at half the bytes."""
    frames = []
    for run in _each_run(df, "by_dtype"):
        if not run.n:
            continue
        table = run.table()
        top = int(np.argmax(run.live))
        a, f = table["_alloc_row"].to_numpy(), table["_free_row"].to_numpy()
        live = (a <= top) & ((f < 0) | (f > top))
        made = run.arrays()[4]
        frame = pd.DataFrame(
            {
                "run": table["run"],
                "dtype": table["dtype"],
                "storages": made.astype(np.int64),
                "bytes_allocated": np.where(made, table["nbytes"], 0),
                "peak_live_bytes": np.where(live, table["nbytes"], 0),
            }
        )
        frame = frame.groupby(["run", "dtype"], sort=False, as_index=False).sum()
        frames.append(frame.sort_values(["bytes_allocated", "peak_live_bytes"], ascending=False, kind="stable"))
    if not frames:
        return _empty(_DTYPE_DTYPES)
    return pd.concat(frames, ignore_index=True).astype(_DTYPE_DTYPES)
