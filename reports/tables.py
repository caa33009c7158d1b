"""Summary tables of a loaded trace: FLOPs, bytes and time by op, module, phase, step and dtype.

Each function takes the DataFrame `reports.load` returns (or a pyarrow Table of trace
columns), runs the view of reports/sql/views.sql that `optrace report` runs over the files
on its rows (reports.sql.frame), and gives back a new DataFrame with a RangeIndex and
units in the column names:

    ops              number of aten ops (rows of the trace)
    flops            analytic FLOPs, 2 per multiply-add (see tracer.flops.formulas)
    flops_pct        share of the run's FLOPs, in percent (0-100)
    bytes_allocated  bytes of the storages the ops created (views create none)
    bytes_read       bytes of the tensor inputs; bytes_written: of the outputs
    duration_us      traced wall time in microseconds. The tracer's bookkeeping
                     slows every op, so use these times to rank ops, not to
                     measure speed (reports.mfu uses the untraced step time).

The FLOPs here are totals over the whole trace; `by_step` gives them per step. Totals
never wrap: a column whose int64 sum could pass 2**63 - 1 (a 405B model's FLOPs) is summed,
and shown, as float64 (reports.steps.summable).
When the trace holds several runs (load([a, b])) every table has a `run`
column first and one block of rows per run, in load order; with one run there
is no `run` column. Empty inputs give empty tables with the same columns and
dtypes.
"""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import empty_frame
from reports.errors import ReportError
from reports.loading.columns import cell_lists, first_codes
from reports.loading.load import require
from reports.sql import tables
from reports.sql.frame import run_names, trace_of
from reports.sql.module_tree import MODULE_COLUMNS, OWN_COLUMNS, module_columns
from tracer.schema import PHASES

__all__ = ["by_dtype", "by_module", "by_op", "by_phase", "by_step"]

_BASE = ["flops", "bytes_allocated", "duration_ns"]
_SUMS = [*_BASE, "bytes_read", "bytes_written"]


# helpers shared with the other reports -----------------------------------------------------
def split_runs(df):
    """[(run name, that run's rows)] in load order; rows keep the trace's order."""
    names = run_names(df)
    if len(names) == 1 and len(df) and bool((df["run"] == names[0]).all()):
        return [(names[0], df)]  # one run: its rows are the frame (no copy of a big trace)
    column = df["run"]
    if isinstance(column.dtype, pd.CategoricalDtype) and list(column.cat.categories) == names:
        codes = column.cat.codes.to_numpy()
        if len(codes) and codes.min() >= 0 and (np.diff(codes) >= 0).all():  # runs in load order: slices, not copies
            bounds = np.searchsorted(codes, np.arange(len(names) + 1))
            return [(run, df.iloc[bounds[i] : bounds[i + 1]]) for i, run in enumerate(names)]
    groups = dict(iter(df.groupby("run", observed=True, sort=False))) if len(df) else {}
    return [(run, groups[run] if run in groups else df.iloc[0:0]) for run in run_names(df)]


def combine(frames, columns, dtypes, several):
    """Concatenate one frame per run; add the `run` column first when there are several runs."""
    parts = []
    for run, frame in frames:
        frame = frame.reindex(columns=columns)
        if several:
            frame.insert(0, "run", run)
        parts.append(frame)
    cols = (["run"] if several else []) + list(columns)
    types = {"run": object, **dtypes} if several else dict(dtypes)
    if parts:
        out = pd.concat(parts, ignore_index=True)
    else:
        out = empty_frame({c: types.get(c, object) for c in cols})
    wide = [
        c
        for c, t in types.items()
        if t == "int64" and c in out.columns and out[c].dtype.kind == "f" and bool((out[c].abs() >= 2.0**63).any())
    ]  # sums past int64 stay float64 (2**63 - 1: 2.0**63)
    types.update(dict.fromkeys(wide, "float64"))
    return out.astype({c: t for c, t in types.items() if c in out.columns}).reset_index(drop=True)[cols]


def several_runs(df):
    return len(run_names(df)) > 1


# the tables: views.sql's, run over the frame's rows (reports.sql.frame) -----------------------------------------
def by_op(df):
    """FLOPs, bytes and time per aten op, most FLOPs first (then most time)."""
    with trace_of(df, "by_op", [*_SUMS, "op", "flop_kind"], ["phase", "is_view"]) as trace:
        return tables.by_op(trace)


def by_phase(df):
    """FLOPs, bytes and time per phase (forward, backward, optimizer, other), in that order."""
    with trace_of(df, "by_phase", [*_SUMS, "phase"]) as trace:
        return tables.by_phase(trace)


def by_dtype(df):
    """FLOPs, matmul FLOPs, bytes and time per dtype.

    An op's dtype is the dtype of its first tensor input (of its first output for
    ops without tensor inputs, "" for ops with neither): a matmul under bf16
    autocast is "bfloat16", the cast that feeds it "float32"."""
    with trace_of(
        df, "by_dtype", [*_BASE, "input_dtypes", "output_dtypes", "flop_kind"], ["bytes_read", "bytes_written"]
    ) as trace:
        return tables.by_dtype(trace)


def by_step(df):
    """Per training step: ops, FLOPs (all and per phase), bytes allocated, peak live bytes, time.

    The step advances when an optimizer step ends (or on Tracer.step())."""
    with trace_of(df, "by_step", [*_BASE, "step", "phase", "live_bytes"]) as trace:
        return tables.by_step(trace)


def row_dtypes(rows):
    """Per row, the dtype of its first tensor input, else of its first output ('' with neither),
    computed in Arrow: no Python object per list cell, so a million rows take well under a second."""
    codes, words = row_dtype_codes(rows)
    return np.array(words, dtype=object)[codes]


def row_dtype_codes(rows):
    """row_dtypes as (codes, words): row i's dtype is words[codes[i]]."""
    codes, words = first_codes(cell_lists(rows, "input_dtypes", kind=None))
    bare = np.flatnonzero(codes == 0)  # no tensor input (factories): read the outputs of these rows only
    if len(bare):
        codes[bare] = first_codes(cell_lists(rows, "output_dtypes", bare, kind=None), words)[0]
    return codes, words


# modules ------------------------------------------------------------------------------------
def by_module(df, phase=None):
    """FLOPs, bytes and time per module, as a tree: each module's own ops and its subtree.

    `flops`, `bytes_allocated`, `duration_us`, `ops` count the ops whose innermost
    module is this one; the `subtree_` columns add every descendant, so the root
    module's subtree is everything that ran inside the model. `depth` is 0 for the
    root; modules that ran no op themselves (a ModuleList such as "blocks") still
    appear, with zero own counts. Rows come in tree order (depth first, children in
    the order they first ran). Ops outside any module (the optimizer, the loss when
    it is computed outside the model) form one row with module "" and depth 0, last.
    `subtree_flops_pct` is the subtree's share of all the run's FLOPs (in percent).

    `df`: a loaded frame, an Arrow table, or a reports.sql.engine.Trace (the CLI's); an Arrow table names its root
    module in the run metadata of its schema (tracer.schema.read_part's), else each of the root's children is a root;
    `phase`: None for all ops, or a phase name (or a list of them) to keep."""
    if phase is not None:
        arrow = isinstance(df, pa.Table)
        if arrow and "phase" not in df.column_names:
            raise ReportError("by_module: the trace lacks column(s) ['phase']; load it with them")
        if not arrow:
            require(df, ["phase"], "by_module")
        phases = [phase] if isinstance(phase, str) else list(phase)
        bad = [p for p in phases if p not in PHASES]
        if bad:
            raise ReportError(f"by_module: unknown phase(s) {bad}; phases are {list(PHASES)}")
        if arrow:
            df = df.filter(pc.is_in(df.column("phase"), value_set=pa.array(phases, pa.string())))
        else:
            df = df[df["phase"].isin(phases)]
    with trace_of(df, "by_module", [*_BASE, "module", "seq"]) as trace:
        return _modules(trace)


def _modules(trace):
    """by_module of a Trace: each module's own rows from the view module_own, the tree added up here."""
    runs = list(trace.runs.items())
    frames = []
    for i, own in tables.module_own(trace).items():
        if not len(own):
            continue
        own.index = own.index.astype(object)
        own = trace.sums(own, ["flops", "bytes_allocated"], i)  # float64 where a sum could wrap, as pandas sums them
        t = module_rows(own, runs[i][1].get("root_module"), trace.totals.set_index("run_index").loc[i, "flops"])
        if trace.several:
            t.insert(0, "run", runs[i][0])
        frames.append(t)
    cols = (["run"] if trace.several else []) + MODULE_COLUMNS
    dtypes = {"run": object, **MODULE_DTYPES}
    if not frames:
        return empty_frame({c: dtypes[c] for c in cols})
    out = pd.concat(frames, ignore_index=True)
    return out.astype(
        {
            c: t
            for c, t in dtypes.items()
            if c in out and not (t == "int64" and out[c].dtype.kind == "f" and (out[c].abs() >= 2.0**63).any())
        }
    )[cols]


MODULE_DTYPES = {
    "module": object,
    "depth": "int64",
    "parent": object,
    "ops": "int64",
    "subtree_ops": "int64",
    "flops": "int64",
    "subtree_flops": "int64",
    "subtree_flops_pct": "float64",
    "bytes_allocated": "int64",
    "subtree_bytes_allocated": "int64",
    "duration_us": "float64",
    "subtree_duration_us": "float64",
}


def module_rows(own, root, total):
    """One run's by_module rows from `own` (each module's own ops, flops, bytes_allocated, duration_us and
    first_seq, indexed by module name in order of first appearance), its root module and its total FLOPs
    (reports.sql.module_tree.module_columns, made a DataFrame)."""
    figures = {c: own[c].to_numpy() for c in OWN_COLUMNS}
    columns = module_columns(list(own.index), figures, own["first_seq"].to_numpy(), root, total)
    named = len(columns["module"]) - ("" in own.index)  # the tree's rows, before the one outside any module
    # a parent as pandas infers the tree's names (the root's None a NaN), the outside row's None as it is
    columns["parent"] = pd.Series(columns["parent"][:named]).astype(object).tolist() + columns["parent"][named:]
    return pd.DataFrame({c: pd.Series(v, dtype=object) if c in ("module", "parent") else v for c, v in columns.items()})
