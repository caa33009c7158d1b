"""Per-step figures from a view of totals per (keys..., phase), written once over numpy: each phase's total over the
steps it ran in, summed over the phases in reports.steps's order (reports.sql.engine.Trace.per_step, per_step_arrow;
reports.compare.Figures.per_step)."""

import numpy as np
import pyarrow as pa

from reports.arrays import values_of
from tracer.schema import PHASES

__all__ = ["floats", "per_step_arrays"]


def per_step_arrays(steps, runs, arrays, columns, keys=()):
    """Trace.per_step over numpy arrays of a view's columns (run_index, phase, `keys`, `columns`, first_seq), `steps`
    {run_index: {phase: steps}} (Trace.phase_steps) of `runs` runs: {run_index: ([key tuple], {column: float64
    array})}, the keys in order of their least first_seq (ties: in order of first appearance; a key holding a null is
    left out, as pandas' groupby leaves it); no key: one row."""
    run_index = np.asarray(arrays["run_index"]).astype(np.int64)
    out = {}
    for i in range(runs):
        at = np.flatnonzero(run_index == i)  # the run's rows in their order
        names = list(steps[i])
        order = sorted(
            range(len(names)),
            key=lambda c: (PHASES.index(names[c]) if names[c] in PHASES else len(PHASES), names[c]),
        )
        tuples = list(zip(*(arrays[k][at] for k in keys))) if keys else [()] * len(at)
        if keys:
            least = {}
            for key, seq in zip(tuples, arrays["first_seq"][at]):
                if any(k is None or k != k for k in key):  # a null key: no group (pandas' groupby drops it)
                    continue
                least[key] = seq if key not in least else min(least[key], seq)
            found = sorted(least, key=least.__getitem__)  # stable: ties keep their first appearance
        else:
            found = [()]
        where = {key: n for n, key in enumerate(found)}
        slots = np.array([where.get(key, -1) for key in tuples], dtype=np.int64)
        phase = arrays["phase"][at]
        figures = {c: np.zeros(len(found)) for c in columns}
        for c in order:
            p = names[c]
            mine = np.flatnonzero((phase == p) & (slots >= 0))
            for col in columns:
                values = np.zeros(len(found))
                got = np.asarray(arrays[col][at][mine], dtype=np.float64)
                values[slots[mine]] = np.where(np.isnan(got), 0.0, got)
                figures[col] = figures[col] + values / steps[i][p]
        out[i] = (found if keys else [], figures)
    return out


def floats(column):
    """An Arrow column of numbers (a DECIMAL sum too) as float64, a null as NaN."""
    import pyarrow.compute as pc

    return values_of(pc.cast(column, pa.float64(), safe=False))  # an int64 past 2**53 rounded, as numpy rounds it
