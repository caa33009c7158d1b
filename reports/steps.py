"""The one place where totals become per-step figures.

A run's rows carry a `step` number. Every report that gives a figure per training
step asks this module how many steps a phase ran in and divides by it here, once:

  phase_steps(rows)   {phase: steps it has ops in}; each phase is averaged over its
                      own steps, so a trace cut mid-step (a forward without its
                      backward) does not halve the backward; "other" (which runs in
                      the step it follows) over at least the run's training steps
  count_steps(rows)   the run's training steps: steps with forward or backward ops
  per_step(rows, ...) sum a column (or any values) per phase, divide each phase's
                      total by its steps, add the phases up: one figure per step,
                      or one per key with `by=`

Integer totals are summed before the one division, so a trace of k identical steps
gives exactly the figures of one step (k·a / k == a in floating point; summing
a/k row by row would not).

No sum wraps: `summable(values)` gives integers unchanged when no sum of them can pass
int64, else as float64 (exact to float64's 53 bits, up to 1e308). A 405B model's step
is ~4e19 FLOPs, past int64's 9.2e18; every report sums through it (`per_step` here,
reports.tables, reports.time.roofline).

The array forms (`steps_of`, `count_steps_of`, `per_step_of`) take numpy columns: the FLOP sections
(reports/flops) call them on their Arrow rows; the functions of a DataFrame above are thin adapters of them.
"""

import numpy as np

from reports._util import unique
from tracer.schema import PHASES

__all__ = [
    "count_steps",
    "count_steps_of",
    "fits_int64",
    "per_step",
    "per_step_of",
    "phase_steps",
    "row_divisor",
    "step_phases",
    "steps_of",
    "summable",
]

INT64_MAX = 2**63 - 1


def fits_int64(values):
    """Whether every sum of some of these integers fits in int64 (so an int64 sum cannot wrap)."""
    v = np.asarray(values)
    if not len(v) or not (np.issubdtype(v.dtype, np.integer) or v.dtype == bool):
        return True
    return max(int(v.max()), -int(v.min()), 0) * len(v) <= INT64_MAX


def summable(values):
    """`values` (integers: a Series or an array) ready to be summed: as they are when no sum
    of them can pass int64, else as float64, so that a total is exact or float64, never wrapped."""
    if fits_int64(values):
        return values
    return values.astype(np.float64)


_FORWARD_BACKWARD = ("forward", "backward")
_OTHER = "other"


def _codes(column):
    """(integer code per row, the values the codes stand for), -1 for missing values."""
    import pandas as pd

    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(dtype=np.int64), np.asarray(column.cat.categories, dtype=object)
    codes, uniques = pd.factorize(column.astype(object) if column.dtype != np.int64 else column)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def _steps_per_phase(rows):
    """(phase codes, phase names, steps each phase code ran in: at least 1 for a phase with rows)."""
    codes, names = _codes(rows["phase"])
    return steps_of(codes, names, rows["step"].to_numpy(dtype=np.int64))


def steps_of(codes, names, steps):
    """step_phases of arrays: (`codes`, `names`, the steps each phase code ran in, at least 1 for a phase with rows),
    from each row's phase code (-1: missing) into `names` and its step number."""
    n = len(names)
    low = int(steps.min(initial=0))
    if len(codes) and (int(steps.max()) - low + 1) * max(n, 1) > 2**62:  # a step * n key would wrap int64
        pairs = np.unique(np.stack([steps, codes], axis=1), axis=0)[:, 1]  # the phase code of each distinct pair
    else:
        pairs = _distinct((steps - low) * max(n, 1) + codes) if len(codes) else np.zeros(0, np.int64)
    counts = np.bincount(pairs % max(n, 1), minlength=n) if n else np.zeros(0, np.int64)
    # "other" runs between an optimizer step and the next forward, in the step it follows: the data
    # loading of k iterations sits in k - 1 steps (step 0 holds two), so it is averaged over the
    # run's training steps, never over fewer
    if _OTHER in names:
        c = list(names).index(_OTHER)
        counts[c] = max(counts[c], count_steps_of(codes, names, steps))
    return codes, names, np.maximum(counts, 1)


def _distinct(keys):
    """np.unique(keys) for keys >= -1; a presence table when the keys span little more than their count."""
    top = int(keys.max())
    if top > 4 * len(keys) + 1024:  # sparse step numbers: sort instead
        return unique(keys)
    seen = np.zeros(top + 2, dtype=bool)
    seen[keys + 1] = True
    return np.flatnonzero(seen) - 1


def phase_steps(rows):
    """{phase: number of distinct steps with ops of that phase} for one run's rows."""
    codes, names, counts = _steps_per_phase(rows)
    present = np.unique(codes[codes >= 0])
    return {str(names[c]): int(counts[c]) for c in present}


def row_divisor(rows):
    """Per row, the steps its phase ran in: weights of 1 / row_divisor(rows) turn a
    row-level sum into the per-step figure `per_step` gives."""
    codes, _, counts = _steps_per_phase(rows)
    import pandas as pd

    return pd.Series(
        np.where(codes >= 0, counts[np.maximum(codes, 0)], 1) if len(codes) else np.zeros(0, np.int64),
        index=rows.index,
        dtype=np.int64,
    )


def count_steps(rows):
    """Training steps in one run's rows: steps with forward or backward ops (at least 1)."""
    if len(rows) == 0:
        return 1
    fb = rows.loc[rows["phase"].isin(_FORWARD_BACKWARD), "step"]
    return max(1, int(fb.nunique() if len(fb) else rows["step"].nunique()))


def count_steps_of(codes, names, steps):
    """count_steps of arrays: each row's phase code into `names` (-1: missing) and its step number."""
    if len(steps) == 0:
        return 1
    fb = steps[np.isin(codes, [c for c, name in enumerate(names) if name in _FORWARD_BACKWARD])]
    return max(1, _count_distinct(fb if len(fb) else steps))


def _count_distinct(values):
    """len(np.unique(values)) of a non-empty int array: a presence table when the values span little more than their
    count (step numbers), else a sort."""
    low, high = int(values.min()), int(values.max())
    if high - low > 4 * len(values) + 1024:
        return len(unique(values))
    seen = np.zeros(high - low + 1, dtype=bool)
    seen[values - low] = True
    return int(np.count_nonzero(seen))


def _phase_order(names):
    rank = {p: i for i, p in enumerate(PHASES)}
    return sorted(range(len(names)), key=lambda c: (rank.get(names[c], len(rank)), str(names[c])))


def _totals(index, size, values):
    """Sum of `values` per index in [0, size): exact int64 sums for integer values that cannot
    wrap, else float64 sums."""
    if (np.issubdtype(values.dtype, np.integer) or values.dtype == bool) and fits_int64(values):
        out = np.zeros(size, dtype=np.int64)
        np.add.at(out, index, values.astype(np.int64))
        return out
    return np.bincount(index, weights=values.astype(np.float64), minlength=size)[:size]


def step_phases(rows):
    """The phases and step counts of `rows` that per_step works from: compute them once and pass
    them as per_step(..., phases=) when taking many figures of the same rows."""
    return _steps_per_phase(rows)


def per_step(rows, values="flops", mask=None, by=None, phases=None):
    """Per-step figure(s) of `values` over one run's `rows`.

    values  a column name or a Series aligned with `rows`
    mask    a boolean Series aligned with `rows`: sum only these rows (the steps a
            phase ran in are still counted over all rows)
    by      None for one number, or a column name / Series aligned with `rows`: a
            Series with one figure per key (keys in order of first appearance)
    phases  step_phases(rows), to reuse over many calls (computed here when None)"""
    phases = _steps_per_phase(rows) if phases is None else phases
    v = (rows[values] if isinstance(values, str) else values).to_numpy()
    if by is None:
        return per_step_of(v, phases, mask)
    import pandas as pd

    keys, figures = per_step_of(v, phases, mask, _codes(rows[by] if isinstance(by, str) else by))
    return pd.Series(figures, index=pd.Index(keys, dtype=object))


def per_step_of(values, phases, mask=None, by=None):
    """per_step of arrays: `values` per row, `phases` as steps_of gives them, `mask` a boolean array; `by`
    (key code per row, -1: none; the keys) for (the keys in order of first appearance, their figures)."""
    codes, names, steps = phases
    v = values
    keep = codes >= 0
    if mask is not None:
        keep &= np.asarray(mask, dtype=bool)
    n = len(names)
    if by is None:
        if keep.all():  # every row counts: no copies of the columns
            totals = _totals(codes, n, v)
        else:
            picked = np.flatnonzero(keep)
            totals = _totals(codes[picked], n, v[picked])
        return sum((totals[c] / steps[c] for c in _phase_order(names)), 0.0)
    key_codes, keys = by
    keep &= key_codes >= 0
    summed = key_codes[keep]
    first = np.full(len(keys), len(summed), dtype=np.int64)  # each key's first row among those summed
    np.minimum.at(first, summed, np.arange(len(summed)))
    used = np.flatnonzero(first < len(summed))
    totals = _totals(summed * max(n, 1) + codes[keep], len(keys) * max(n, 1), v[keep]).reshape(len(keys), max(n, 1))
    figures = np.zeros(len(keys))
    for c in _phase_order(names):
        figures = figures + totals[:, c] / steps[c]
    order = used[np.argsort(first[used], kind="stable")]  # keys in order of first appearance
    return keys[order], figures[order]
