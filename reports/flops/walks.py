"""The storage walks behind reports.flops.roles.Roles: which storages are copies of a weight (casts, gathers of a
stacked expert weight, the weights a parametrization computes from it), and which become a gradient through adds,
placing ops and at most one cast. Rows and their storage id lists as (offsets, ids) pairs (Rows.flat)."""

from math import prod

import numpy as np

from reports._util import ONE_TO_ONE_COPIES, unique
from reports.flops.rows import Labels, as_rows

__all__ = [
    "DERIVED",
    "GRADIENT_PLACES",
    "NO_ID",
    "SCALED",
    "copies_of",
    "gradient_ids",
    "gradient_sources",
    "member",
    "ordered_unique",
    "take_rows",
]

_ADDS = frozenset({"aten.add", "aten.add_"})
NO_ID = np.iinfo(np.int64).min  # no storage: a matmul row with fewer than two inputs


def _flat_ids(rows, ins, outs):
    """(offsets, ids) of the input and the output storage ids of `rows` (Rows.flat), reusing given ones."""
    ins = rows.flat("input_storage_ids") if ins is None else ins
    outs = rows.flat("output_storage_ids") if outs is None else outs
    return ins, outs


def _items(lists, row):
    offsets, values = lists
    return values[offsets[row] : offsets[row + 1]].tolist()


def member(keys, table):
    """np.isin(keys, table) for a sorted, unique int64 `table` (one binary search per key)."""
    if not len(table):
        return np.zeros(keys.shape, dtype=bool)
    at = np.minimum(np.searchsorted(table, keys), len(table) - 1)
    return table[at] == keys


def ordered_unique(keys):
    """The distinct values of int `keys` that come nearly in order (keyed by their row's step, rows in order), sorted:
    a stable sort (a merge of the runs it finds) of such keys takes about a tenth of np.sort's time."""
    keys = np.sort(keys, kind="stable")
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if len(keys) else keys


def take_rows(lists, at):
    """(offsets, ids) of the rows at positions `at` of (offsets, ids)."""
    offsets, ids = lists
    counts = offsets[at + 1] - offsets[at]
    new = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    index = np.repeat(offsets[at] - new[:-1], counts) + np.arange(new[-1], dtype=np.int64)
    return new, ids[index]


# Gathers of a stacked weight: w[expert_ids] copies whole expert matrices of w [E, K, N] (first input).
_GATHERS = frozenset({"aten.index", "aten.index_select", "aten._unsafe_index"})
# Weights a parametrization computes from a parameter at each forward (torch.nn.utils.parametrizations):
# weight_norm's _weight_norm_interface(v, g) -> (the weight, from v; the norms), and a weight times or over a
# scalar (a number, or a tensor of one element): spectral_norm's weight / sigma, an equalized learning rate.
DERIVED = frozenset({"aten._weight_norm_interface", "aten._weight_norm"})
SCALED = frozenset({"aten.mul", "aten.div"})


def _scalar_sides(rows, at, in_off):
    """For rows `at` of SCALED ops: (the row scales one tensor by a scalar, its scaled tensor is the second
    input). One tensor input: a number is the scalar; two: the one of one element (0-d or [1])."""
    count = in_off[at + 1] - in_off[at]
    ok, second = count == 1, np.zeros(len(at), dtype=bool)
    two = np.flatnonzero(count == 2)
    if len(two):
        for k, shapes in zip(two.tolist(), rows.cells("input_shapes", at[two])):
            first, other = (prod(int(d) for d in shape) for shape in list(shapes)[:2])
            ok[k], second[k] = (other == 1 or first == 1), (first == 1 and other != 1)
    return ok, second


def copies_of(rows, packets, sources, ins=None, outs=None, stacked=()):
    """{storage: source} for `sources` and every one-to-one copy (cast) made of them, transitively; with
    `stacked` (storages of stacked expert weights, 3 dims or more) also their gathers (w[expert_ids]); and the
    weights parametrizations compute from them (DERIVED, SCALED: their first output)."""
    alias = {sid: sid for sid in sources}
    if not alias:
        return alias
    (in_off, in_ids), outs = _flat_ids(rows, ins, outs)
    copy = packets.isin(ONE_TO_ONE_COPIES)
    if stacked:
        first = np.full(len(rows), NO_ID, dtype=np.int64)
        has = in_off[1:] > in_off[:-1]
        first[has] = in_ids[in_off[:-1][has]]
        copy |= packets.isin(_GATHERS) & np.isin(first, np.fromiter(stacked, dtype=np.int64))
    derived = packets.isin(DERIVED)
    copied = np.flatnonzero(copy | derived)
    # the sources and what these rows made, sorted (np.isin would hash tens of thousands of ids for each call): a row
    # adds a copy only where it reads one of them
    made = ordered_unique(
        np.concatenate([np.fromiter(alias, dtype=np.int64, count=len(alias)), take_rows(outs, copied)[1]])
    )
    scaled = np.flatnonzero(packets.isin(SCALED))
    if len(scaled) and len(in_ids):  # only those scaling a source or what a copy made (shapes are read row by row)
        count = in_off[scaled + 1] - in_off[scaled]
        first = np.where(count > 0, in_ids[np.minimum(in_off[scaled], len(in_ids) - 1)], NO_ID)
        second = np.where(count > 1, in_ids[np.minimum(in_off[scaled] + 1, len(in_ids) - 1)], NO_ID)
        scaled = scaled[member(first, made) | member(second, made)]
    scales, scaled_second = _scalar_sides(rows, scaled, in_off) if len(scaled) else ((), ())
    at = copied
    if len(scaled):
        by_scale = scaled[np.asarray(scales, dtype=bool)]
        at = np.concatenate([at, by_scale])
        made = ordered_unique(np.concatenate([made, take_rows(outs, by_scale)[1]])) if len(by_scale) else made
    order = np.argsort(at, kind="stable")  # in row order: a copy of a scaled weight follows it
    at = at[order]
    count = in_off[at + 1] - in_off[at]
    second = packets.take(at).eq("aten.copy_") & (count > 1)  # copy_(dst, src): the source is the second input
    if len(scaled):  # the scaled tensor of `scalar * w` is the second input
        second[np.isin(at, scaled[np.asarray(scaled_second, dtype=bool)])] = True
    first_only = derived[at] | np.isin(at, scaled)
    src = np.full(len(at), NO_ID, dtype=np.int64)
    has = count > 0
    src[has] = in_ids[in_off[at[has]] + second[has]]
    near = member(src, made)  # the walk below skips the other rows
    at, src, first_only = at[near], src[near], first_only[near]
    for row, sid, one in zip(at.tolist(), src.tolist(), first_only.tolist()):
        if sid in alias:
            for o in _items(outs, row)[:1] if one else _items(outs, row):
                alias.setdefault(o, alias[sid])
    return alias


_GRADIENT_MOVES = frozenset(("fsdp.chunk_cat", "aten._chunk_cat"))
# Ops that place a gradient piece into a larger gradient: the backward of a view of a weight
# (w[:, :k], w[e], w.split / w.chunk, w[expert_ids]) writes dL/d(piece) into zeros of w's shape,
# or concatenates the pieces' gradients. They move values, they compute nothing on them.
GRADIENT_PLACES = frozenset(
    "aten.slice_backward aten.select_backward aten.index_put aten.index_put_ aten._index_put_impl_ "
    "aten.index_add aten.index_add_ aten.cat aten.stack aten.slice_scatter aten.select_scatter "
    "aten.as_strided_scatter".split()
)


def gradient_sources(rows, packets, gradients, ins=None, outs=None):
    """Storages that become a gradient directly or through adds, placing ops and at most one cast (backward/other rows).

    A collective (DDP's all-reduce, FSDP2's reduce-scatter) and FSDP2's packing of gradients
    into its flat reduce buffer (`chunk_cat`) move a gradient without computing on it, an
    add only sums contributions (the dW of every use of a weight, an accumulated micro-batch)
    and a placing op (GRADIENT_PLACES) puts the gradient of a slice of a weight into the
    weight's gradient: they pass states through unchanged. `rows`: Rows (or a DataFrame), `packets`: their ops'
    packets (Labels, or a sequence of names); `gradients`: the gradient storages (a collection of ids)."""
    return set(gradient_ids(rows, packets, gradients, ins, outs).tolist())


def gradient_ids(rows, packets, gradients, ins=None, outs=None):
    """gradient_sources as a sorted int64 array of storage ids."""
    rows = as_rows(rows)
    packets = packets if isinstance(packets, Labels) else Labels.of(list(packets))
    kept = isinstance(gradients, np.ndarray)
    gradients = ordered_unique(np.asarray(gradients, dtype=np.int64) if kept else np.fromiter(gradients, np.int64))
    if not len(gradients):
        return gradients
    ins, outs = _flat_ids(rows, ins, outs)
    moved = packets.isin(_GRADIENT_MOVES) | packets.isin(GRADIENT_PLACES)
    if "flop_kind" in rows:
        moved |= rows.labels("flop_kind").eq("collective")
    one_to_one = packets.isin(ONE_TO_ONE_COPIES)
    hop = rows.labels("phase").isin(("backward", "other")) & (one_to_one | packets.isin(_ADDS) | moved)
    at = np.flatnonzero(hop)
    casts = one_to_one[at] & ~moved[at]
    (in_off, in_ids), (out_off, out_ids) = (take_rows(lists, at) for lists in (ins, outs))
    # A row passes states on only where an output of it is a gradient or an input of a row that passes them on: the
    # other rows are left out before the walk (in rounds, each leaving out rows that fed only rows left out)
    writes = _rows_hit(member(out_ids, gradients), out_off)  # rows that write a gradient: always walked
    for _ in range(_ROUNDS):
        keep = writes | _rows_hit(member(out_ids, ordered_unique(in_ids)), out_off)
        if keep.all():
            break
        at, casts, writes = at[keep], casts[keep], writes[keep]
        (in_off, in_ids), (out_off, out_ids) = (take_rows(lists, at) for lists in (ins, outs))
    # storage -> {casts used on the way to a gradient}: the gradients the walk's rows write, and what it reaches
    reach = dict.fromkeys(gradients[member(gradients, ordered_unique(out_ids))].tolist(), _NONE)
    in_off, in_ids, out_off, out_ids = in_off.tolist(), in_ids.tolist(), out_off.tolist(), out_ids.tolist()
    casts = casts.tolist()
    for k in range(len(at) - 1, -1, -1):  # the last op first: cast -> add -> gradient is followed back
        start, end = out_off[k], out_off[k + 1]
        if end - start == 1:  # one output (most rows): its states, if any
            states = reach.get(out_ids[start])
            if states is None:
                continue
        else:
            hits = [reach[o] for o in out_ids[start:end] if o in reach]
            if not hits:
                continue
            states = frozenset().union(*hits)
        after = frozenset(c + 1 for c in states if c == 0) if casts[k] else states  # a cast: at most one on the way
        for sid in in_ids[in_off[k] : in_off[k + 1]] if after else ():
            reach[sid] = reach.get(sid, frozenset()) | after
    found = np.fromiter(reach, dtype=np.int64, count=len(reach))
    found = found[~member(found, gradients)]
    return unique(np.concatenate([gradients, found])) if len(found) else gradients


def _rows_hit(hit, offsets):
    """Per row of (offsets, ids): whether `hit` (a bool per id) holds for one of its ids."""
    rows = np.zeros(len(offsets) - 1, dtype=bool)
    rows[np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))[hit]] = True
    return rows


_NONE = frozenset({0})  # a gradient itself: no cast on the way
_ROUNDS = 8  # rounds of gradient_ids' pruning at most (a round: about 1 ms a million-row trace)
