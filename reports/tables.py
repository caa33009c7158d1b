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
and shown, as float64 (reports/steps.py `summable`).
When the trace holds several runs (load([a, b])) every table has a `run`
column first and one block of rows per run, in load order; with one run there
is no `run` column. Empty inputs give empty tables with the same columns and
dtypes.
"""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from reports._util import empty_frame, pct
from reports.errors import ReportError
from reports.loading.columns import cell_lists, first_codes
from reports.loading.load import require
from reports.sql import tables
from reports.sql.frame import run_names, trace_of
from tracer.schema import EXTERNAL_MARK, PHASES

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
def _module_tree(names, root):
    """(parent, depth) of every module name, with the intermediate names no op ran in.

    Names are dotted paths relative to the root module (which carries its class
    name, e.g. "GPT"); a dotless name other than the root is a child of the root, unless
    it is a module outside the model (`<ClassName>#<k>`: a root of its own). Without a
    root (a trace made without model=), dotless names are top level."""
    parent, depth = {}, {}

    def add(name):
        if name in parent:
            return
        if name == root:
            up = None
        elif "." in name:
            up = name.rsplit(".", 1)[0]
        elif EXTERNAL_MARK in name:  # a module outside the model (a teacher, a loss module): its own root
            up = None
        else:
            up = root
        parent[name] = up
        if up is not None:
            add(up)
        depth[name] = 0 if up is None else depth[up] + 1

    for name in names:
        add(name)
    return parent, depth


def _rolled_up(own, own_cols, parent, depth):
    """The module tree as a frame in tree order: own figures and subtree sums, in time linear in modules.

    Each module's subtree adds into its parent's, deepest modules first; siblings come
    in the order their subtrees first ran (the smallest `first_seq` below them)."""
    names = list(parent)
    at = {n: i for i, n in enumerate(names)}
    up = np.array([at[parent[n]] if parent[n] is not None else -1 for n in names], dtype=np.int64)
    mine = own.reindex(names, fill_value=0)  # int64 columns stay int64 (summable: no sum of them wraps)
    values = [mine[c].to_numpy().copy() for c in own_cols]
    sub = [v.copy() for v in values]
    first = own["first_seq"].reindex(names).to_numpy(np.float64, na_value=np.inf).copy()
    for i in sorted(range(len(names)), key=lambda i: -depth[names[i]]):  # deepest first: add each into its parent
        if up[i] >= 0:
            for column in sub:
                column[up[i]] += column[i]
            first[up[i]] = min(first[up[i]], first[i])
    children = {}
    for i in sorted(range(len(names)), key=first.__getitem__):
        children.setdefault(up[i], []).append(i)
    order, stack = [], list(reversed(children.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(children.get(i, [])))
    order = np.array(order, dtype=np.int64)
    frame = pd.DataFrame(
        {
            "module": [names[i] for i in order],
            "depth": [depth[names[i]] for i in order],
            "parent": [parent[names[i]] for i in order],
        }
    )
    for k, c in enumerate(own_cols):
        frame[c] = values[k][order]
        frame[f"subtree_{c}"] = sub[k][order]
    return frame


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


MODULE_COLUMNS = [
    "module",
    "depth",
    "parent",
    "ops",
    "subtree_ops",
    "flops",
    "subtree_flops",
    "subtree_flops_pct",
    "bytes_allocated",
    "subtree_bytes_allocated",
    "duration_us",
    "subtree_duration_us",
]
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
    first_seq, indexed by module name in order of first appearance), its root module and its total FLOPs."""
    own_cols = ["ops", "flops", "bytes_allocated", "duration_us"]
    names = [n for n in own.index if n != ""]
    parent, depth = _module_tree(names + ([root] if root and names else []), root)
    t = _rolled_up(own, own_cols, parent, depth)
    if "" in own.index:
        o = own.loc[""]
        outside = {
            "module": "",
            "depth": 0,
            "parent": None,
            **{c: o[c] for c in own_cols},
            **{f"subtree_{c}": o[c] for c in own_cols},
        }
        t = pd.concat([t, pd.DataFrame([outside])], ignore_index=True) if len(t) else pd.DataFrame([outside])
    t = t.reindex(columns=[c for c in MODULE_COLUMNS if c != "subtree_flops_pct"])
    t["subtree_flops_pct"] = pct(t["subtree_flops"].astype("float64"), total)
    return t
