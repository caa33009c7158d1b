"""The FLOP sections of the report (breakdown, explain, MFU) from a reports.sql.engine.Trace, without a frame
of the whole trace: SQL (reports/sql/flops.sql) cuts the rows down to a small pyarrow.Table, and the functions of
reports/flops (analyse and Roles, breakdown, explain, mfu) run on its numpy columns.

    table(trace)   the small table: one row per run's rows that the sections read one by one, one per group
                   of the other rows (their FLOPs summed), one per step and phase, in this order:

      the walked rows (view flop_rows)  matmul and attention rows, forward convolutions, one-to-one copies
                   and gathers, and in the backward and other phases the adds, the ops that place or move a
                   gradient and collectives: every row a walk of Roles follows or a section reads a cell of
                   (ids, shapes, dtypes, module, causal, grad mode), with those columns only
      the rest (view flop_rest)  every other row: none is a matmul, attention kernel, copy or gradient hop,
                   so its category is "other" and the sections only sum its FLOPs, per phase, FLOP kind and
                   recompute flag (explain's and MFU's masks), per first input dtype and FLOPs > 0 (MFU's
                   dtype when no matmul has FLOPs) and per op in the optimizer phase (explain names its ops).
                   A group stands at its first row's seq and step.
      the steps (view flop_steps)  one zero-FLOP row per step and phase (whether it re-ran checkpointed
                   work), after a run's other rows: the steps each phase ran in, as reports.steps counts
                   them, and the steps with a backward or with recomputation, as Roles and explain read them.

The sections read it as reports.flops.rows.Frame(table(trace), trace.runs); frame(trace) is it as a DataFrame, as
reports.load gives one, for the library's functions.

A Trace that kept run 0's rows from its read of the parts (Trace(keep=[FlopRows]), as `optrace report` opens one) gives
the walked rows and flop_rest from what it kept (reports.sql.flop_rows), the same rows without a query that decodes
five list columns of every row again.

Why the results are those of the whole trace: each walk of Roles reads only walked rows, in their order
(the others are not copies, matmuls or gradient hops), so every walked row gets the role it gets among all
rows and every other row is "other". Each section's figure is a sum per phase divided by the steps that
phase ran in (reports.steps): the integer sums of a group are those of its rows, the step counts are the
flop_steps rows', and a key of a per-key sum (category and phase, FLOP kind, dtype) is first seen where it
was first seen among the rows (a group stands at its first row; the step rows come last and carry no FLOPs,
no FLOP kind and no parameter), so the per-phase figures are added up in the same order. With a trace
whose int64 FLOP sums could wrap, the FLOPs are float64 here (reports.steps sums those as float64
too, row by row): a figure above 2**53 may then differ in its last bits.

    frame(trace, mfu_only=True)   a smaller frame for reports.mfu alone (compare's MFU): the walked rows are the
                   matmul and attention rows only (view mfu_marked: MFU reads the dtype of the first and the
                   shapes of fused attention kernels, and walks no role), with the columns MFU reads; every other
                   row is summed as flop_rest sums them. MFU's figures are sums per phase, recompute flag and
                   step, so they are those of the whole trace for the reasons above.
"""

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.arrays import arrow_of, numpy_of, strings, whole
from reports.sql.engine import statements
from reports.sql.flop_rows import SCHEMA, FlopRows

__all__ = ["frame", "table"]

_ROWS = tuple(SCHEMA.names)  # every column a FLOP section reads
_REST = {
    "seq": "seq",
    "step": "step",
    "phase": "phase",
    "op": "op",
    "flop_kind": "flop_kind",
    "flops": "flops",
    "recompute": "recompute",
    "input_dtypes": "first_dtype",
}
_CATEGORICAL = ("phase", "op", "module", "flop_kind", "grad_mode")
_STEPS = {"seq": "seq", "step": "step", "phase": "phase", "flops": "0", "recompute": "recompute"}
_MFU_ROWS = {
    "seq": "seq",
    "step": "step",
    "phase": "phase",
    "op": "op",
    "flop_kind": "flop_kind",
    "flops": "flops",
    "recompute": "coalesce(recompute, false)",
    "input_dtypes": "input_dtypes[1:2]",
    "input_shapes": "CASE WHEN flop_kind = 'attention' THEN input_shapes END",
}  # (as flop_rows)
_FLOPS_SQL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flops.sql")


def _select(view, columns, flops_type, order, names=_ROWS):
    picked = []
    for c in names:
        value = columns.get(c, "NULL")
        picked.append(f"CAST({value} AS {flops_type}) AS flops" if c == "flops" else f"{value} AS {c}")
    return f"SELECT run_index, {order} AS part, {', '.join(picked)} FROM {view}"


def _mfu_rest():
    """flop_rest's grouping of the rows mfu_marked does not walk (its body, read from flops.sql)."""
    body = {name: body for name, body, _ in statements(_FLOPS_SQL)}["flop_rest"]
    return f"({body.replace('flop_marked', 'mfu_marked')}) AS rest"


def frame(trace, mfu_only=False):
    """The small table as a DataFrame (see the module docstring): reports.breakdown, explain and mfu of it equal
    those of reports.load of the same trace. attrs["runs"] is the trace's runs' metadata. `mfu_only`: the smaller
    frame reports.mfu alone reads (the columns it reads, the matmul and attention rows one by one)."""
    import pandas as pd

    from reports.loading.columns import SharedRuns, to_pandas

    small = table(trace, mfu_only)
    run_index = whole(small.column("run")).indices.to_numpy()
    out = to_pandas(small.drop_columns(["run"]), lists="arrow")
    out.insert(0, "run", pd.Categorical.from_codes(run_index.astype(np.int64), categories=list(trace.runs)))
    out.attrs["runs"] = SharedRuns(trace.runs)
    return out


def table(trace, mfu_only=False):
    """The small table of the FLOP sections (see the module docstring) as a pyarrow.Table: its first column `run`
    (a dictionary of the trace's runs), the string columns dictionary-encoded. `mfu_only`: as for `frame`."""
    wide = any(trace.wide("flops", i) for i in range(len(trace.runs)))
    flops_type = "DOUBLE" if wide else "BIGINT"  # as reports.steps.summable takes sums that could wrap
    if mfu_only:
        names = list(_MFU_ROWS)
        parts = [
            _select("mfu_marked WHERE walked", _MFU_ROWS, flops_type, 0, names),
            _select(_mfu_rest(), _REST, flops_type, 0, names),
        ]
    else:
        names = _ROWS
        parts = [_select("flop_rows", {c: c for c in _ROWS}, flops_type, 0), _select("flop_rest", _REST, flops_type, 0)]
    kept = None if mfu_only or trace.several else trace.take_kept(FlopRows, 0)
    if kept is not None:  # the walked rows and groups from the Trace's read of the parts (reports.sql.flop_rows)
        steps = trace.db.sql(
            "SELECT seq, step, phase, 0 AS flops, recompute FROM flop_steps ORDER BY seq"
        ).to_arrow_table()
        try:
            rows = kept.table(wide, steps)  # the run's steps after its other rows, as below
        except (pa.ArrowException, ValueError):  # parts whose types it cannot join: the query reads them as DuckDB does
            rows = None
    if kept is not None and rows is not None:
        rows = rows.append_column("run_index", arrow_of(np.zeros(len(rows), np.int32)))
    else:
        query = " UNION ALL ".join([*parts, _select("flop_steps", _STEPS, flops_type, 1, names)])
        rows = trace.db.sql(query).to_arrow_table()
        keys = [numpy_of(rows.column(c)) for c in ("seq", "part", "run_index")]
        rows = rows.take(arrow_of(np.lexsort(keys))).drop_columns(
            ["part"]
        )  # in order: run by run, its rows by seq, then
        # its steps (less memory than SQL's sort)
    # categorical, as reports.load gives them: packets and group-bys per category, not per row
    for name in (c for c in _CATEGORICAL if c in names):
        rows = rows.set_column(rows.schema.get_field_index(name), name, pc.dictionary_encode(rows.column(name)))
    run_index = arrow_of(numpy_of(rows.column("run_index")).astype(np.int32))
    run = pa.DictionaryArray.from_arrays(run_index, strings(list(trace.runs)))
    return rows.drop_columns(["run_index"]).add_column(0, "run", run)
