"""The module tree of one run (reports.by_module, over the view module_own), written once over numpy: each module's own figures and its subtree's sums, in tree
order. reports.tables.by_module makes the library's DataFrame of it; the printed report (reports.output.source)
reads it as columns of Python values, without pandas."""

import numpy as np

from tracer.schema import EXTERNAL_MARK

__all__ = ["MODULE_COLUMNS", "OWN_COLUMNS", "module_columns", "module_tree"]

OWN_COLUMNS = ["ops", "flops", "bytes_allocated", "duration_us"]
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


def module_tree(names, root):
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


def module_columns(modules, own, first_seq, root, total):
    """One run's by_module columns ({column: numpy array or list}, MODULE_COLUMNS), from `modules` (each module's
    name, in order of first appearance; "" for the ops outside any module), `own` ({OWN_COLUMNS: array}: each
    module's own figures, int64 or float64 as summed), `first_seq` (array) and the run's root module and total FLOPs.

    Each module's subtree adds into its parent's, deepest modules first; siblings come in the order their subtrees
    first ran (the smallest `first_seq` below them); the ops outside any module are one row, last. That row's
    figures pass through float64, as a row of the library's frame of mixed columns gives them."""
    at = {m: i for i, m in enumerate(modules)}
    named = [m for m in modules if m != ""]
    parent, depth = module_tree(named + ([root] if root and named else []), root)
    names = list(parent)
    where = {n: i for i, n in enumerate(names)}
    up = np.array([where[parent[n]] if parent[n] is not None else -1 for n in names], dtype=np.int64)
    rows = np.array([at.get(n, -1) for n in names], dtype=np.int64)
    values = [np.where(rows >= 0, own[c][np.maximum(rows, 0)], 0).astype(own[c].dtype) for c in OWN_COLUMNS]
    sub = [v.copy() for v in values]
    first = np.where(rows >= 0, np.asarray(first_seq, dtype=np.float64)[np.maximum(rows, 0)], np.inf)
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
    out = {
        "module": [names[i] for i in order],
        "depth": np.array([depth[names[i]] for i in order], dtype=np.int64),
        "parent": [parent[names[i]] for i in order],
    }
    for k, c in enumerate(OWN_COLUMNS):
        out[c], out[f"subtree_{c}"] = values[k][order], sub[k][order]
    if "" in at:  # the ops outside any module: one row, whose figures (and so every row's) pass through float64
        out["module"].append("")
        out["depth"] = np.append(out["depth"], 0)
        out["parent"].append(None)
        for c in OWN_COLUMNS:
            value = np.float64(own[c][at[""]])
            for name in (c, f"subtree_{c}"):
                out[name] = np.append(out[name].astype(np.float64), value)
    subtree = np.asarray(out["subtree_flops"], dtype=np.float64)
    out["subtree_flops_pct"] = subtree * 100.0 / total if total else subtree * 0.0
    return {c: out[c] for c in MODULE_COLUMNS}
