"""What changed between a run and the baseline, in words: the totals, ops added or removed, recompute, dtypes.

    changes(runs)   {run: [sentence, ...]} for every run but the baselines, from [reports.compare.Figures]

Each sentence comes from compare.sql's views (the per-step totals, compare_recompute, compare_dtypes), so a
baseline file gives the same words as the trace it was saved from.
"""

import math

import numpy as np

from reports.compare import TOTAL, baselines_of, rows_of, side_by_side_runs

__all__ = ["changes", "facts"]

_SHOWN = 3  # names listed per sentence, then "and N more"


def _names(names):
    names = list(names)
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _pct(v):
    if v != v:
        return "N/A"
    return "new" if math.isinf(v) else f"{v:+.1f}%"


def _recompute(run):
    """FLOPs and ops per step of the rows flagged `recompute`."""
    table = run.views["compare_recompute"]
    if not len(table["phase"]):
        return 0.0, 0.0
    _, got = run.per_step(table, ("flops", "ops"))
    return float(got["flops"][0]), float(got["ops"][0])


def _dtypes(run):
    """{op: frozenset of dtypes}, and the ops per step of each dtype ('' for an op without tensors is left out)."""
    by_op = {}
    for op, dtype in zip(run.views["compare_dtypes"]["op"], run.views["compare_dtypes"]["dtype"]):
        if dtype:
            by_op.setdefault(op, set()).add(dtype)
    return {op: frozenset(d) for op, d in by_op.items()}


def _per_step(ops, key):
    return f"{key} ({ops[key]:g}/step)"


def _rows(table, by, run):
    """{key: {column: Python value}} of `run`'s rows of a compare table (reports.compare_table.side_by_side), in
    the table's order."""
    mine = np.flatnonzero(table["run"] == run)
    return {row[by]: row for row in rows_of({c: a[mine] for c, a in table.items()})}


def _memory(before, after):
    """The memory categories at the peak that changed, in words ("" when none did)."""
    for known in (before, after):
        if isinstance(known, str):
            return known
    moved = []
    for category in dict.fromkeys([*before, *after]):
        was, now = before.get(category, 0), after.get(category, 0)
        if was != now:
            moved.append(f"{category} {was:,} -> {now:,} bytes ({_pct(_change(now, was))})")
    return "memory at peak: " + ", ".join(moved) if moved else ""


def _change(now, was):
    return math.inf if not was else 100.0 * (now - was) / was


def facts(run):
    """A run's facts the words compare: recompute FLOPs and ops per step, dtypes per op."""
    flops, ops = _recompute(run)
    return {"recompute_flops_per_step": flops, "recompute_ops_per_step": ops, "dtypes": _dtypes(run)}


def changes(runs, baseline=None):
    """{run: [sentence]} of each run but the baselines (default the first run; a distributed trace's ranks:
    reports.compare.baselines_of) of [reports.compare.Figures], each against its baseline."""
    names = [r.name for r in runs]
    pairs = baselines_of(runs, baseline)
    by_op = side_by_side_runs(runs, "op", baseline)
    totals = side_by_side_runs(runs, "phase", baseline)
    known = {}  # {baseline run: (its ops per step by op, its Figures, its facts)}
    out = {}
    for run in runs:
        baseline = pairs[run.name]
        if run.name == baseline:
            continue
        if baseline not in known:
            base_run = runs[names.index(baseline)]
            ops_of = {k: row["ops_per_step"] for k, row in _rows(by_op, "op", baseline).items()}
            known[baseline] = ops_of, base_run, facts(base_run)
        base_ops, base_run, base_facts = known[baseline]
        words = []
        t = _rows(totals, "phase", run.name)[TOTAL]
        moved = [
            f"{label} {_pct(t[f'{m}_change_pct'])}"
            for m, label in (
                ("flops", "FLOPs/step"),
                ("bytes_allocated", "bytes allocated/step"),
                ("peak_live_bytes", "peak live bytes"),
                ("ops", "ops/step"),
            )
        ]
        words.append("totals: " + ", ".join(moved))
        ops = {k: row["ops_per_step"] for k, row in _rows(by_op, "op", run.name).items()}
        keys = [k for k in ops if k != TOTAL]
        added = [k for k in keys if base_ops[k] == 0 and ops[k] > 0]
        removed = [k for k in keys if base_ops[k] > 0 and ops[k] == 0]
        if added:
            words.append("ops added: " + _names(_per_step(ops, k) for k in added))
        if removed:
            words.append("ops removed: " + _names(_per_step(base_ops, k) for k in removed))
        mine = facts(run)
        was, now = base_facts["recompute_flops_per_step"], mine["recompute_flops_per_step"]
        share = f" ({100.0 * now / t['flops_per_step']:.1f}% of its FLOPs)" if t["flops_per_step"] else ""
        if not was and (now or mine["recompute_ops_per_step"]):
            words.append(
                f"recompute: new, {now:,.0f} FLOPs/step in {mine['recompute_ops_per_step']:g} ops/step{share}: "
                "checkpointing re-runs forward work"
            )
        elif was and not now and not mine["recompute_ops_per_step"]:
            words.append(f"recompute: gone ({was:,.0f} FLOPs/step in {baseline})")
        elif was != now:
            words.append(f"recompute: {was:,.0f} -> {now:,.0f} FLOPs/step{share}")
        switched = {}
        for op, dtypes in mine["dtypes"].items():
            before = base_facts["dtypes"].get(op)
            if before is not None and before != dtypes:
                switched.setdefault((before, dtypes), []).append(op)
        for (before, after), ops_ in switched.items():
            words.append(f"dtype {'/'.join(sorted(before))} -> {'/'.join(sorted(after))}: {_names(ops_)}")
        memory = _memory(base_run.categories, run.categories)
        if memory:
            words.append(memory)
        if len(words) == 1 and all(
            t[f"{m}_change_pct"] == 0 for m in ("flops", "bytes_allocated", "peak_live_bytes", "ops")
        ):
            words = ["no change: the same ops, FLOPs, bytes, peak and dtypes per step"]
        out[run.name] = words
    return out
