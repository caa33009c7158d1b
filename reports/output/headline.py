"""The answer first: the headline of `optrace report` and every caveat of its figures, assembled once from the
report's tables (reports.output.source.Source) and printed by the text report (reports.output.report_text) and by
`--json` (its `headline` object and `caveats` list) from the same `Report`.

The headline holds: FLOPs per step against 6·N·T; one MFU (a metered run's Meter figures, with their spread, unless
--step-time is given; else the traced step time's); peak live memory with its largest category; the top op and the
top module by FLOPs; the count of caveats. A caveat is {code, message}: a figure that is bounded, missing or noisy,
or a trace that is cut short or damaged, named in words."""

from dataclasses import dataclass, field

import numpy as np

from reports._util import tokens_text
from reports.arrays import arrow_of, values_of
from reports.errors import ReportError
from reports.output.caveats import NOISY, meta_caveats, meter_caveats, noise, step_time_spread, title_state
from reports.output.table import descending, first_row, values
from reports.output.text import human, human_bytes, json_number, percent, printable

__all__ = ["Report", "assemble", "headline_lines", "top_modules"]


@dataclass
class Report:
    """One run's figures for the report: the headline (a JSON-ready dict), the caveats ({code, message}), and the
    tables the text sections print, each computed once."""

    run: str
    meta: dict
    state: str  # complete, INCOMPLETE (cut short), DAMAGED, ...
    breakdown: object = None  # reports.breakdown's pyarrow.Table, or None (no model= or tokens=: `breakdown_error`)
    breakdown_error: str = ""
    explain: list = field(default_factory=list)
    rate: dict = field(default_factory=dict)  # Source.mfu
    spread: dict = None  # the traced step times' {count, min, max}, when the step time is the trace's
    meter: dict = None  # Source.meter_summary
    modules: object = None  # the top-modules pyarrow.Table at `depth`
    depth: int = 2
    headline: dict = field(default_factory=dict)
    caveats: list = field(default_factory=list)


def _mfu(report, step_time_s):
    """The headline's one MFU: the Meter's median over its metered steps (unless a step time is given), else the
    step-time MFU of reports.mfu; with the caveats it needs."""
    rate, meter, caveats = report.rate, report.meter, []
    if step_time_s is None and meter is not None and meter.get("mfu") is not None:
        figure, times = meter["mfu"], meter.get("step_time_s") or {}
        out = {
            "value": figure["median"],
            "source": "meter",
            "min": figure["min"],
            "max": figure["max"],
            "steps": meter["metered_steps"],
            "step_time_s": times.get("median"),
            "hfu": (meter.get("hfu") or {}).get("median"),
        }
        if times and times["max"] > NOISY * times["min"]:
            what = f"step time: the median of {meter['metered_steps']:,} metered steps"
            caveats.append(("step_time_noise", noise(times["min"], times["max"], what)))
        return out, caveats
    value = json_number(rate.get("mfu"))
    out = {
        "value": value,
        "source": "step_time" if value is not None else None,
        "min": None,
        "max": None,
        "steps": None,
        "step_time_s": json_number(rate.get("step_time_s")),
        "hfu": json_number(rate.get("hfu")),
    }
    spread = report.spread
    if value is not None and spread:
        out["steps"] = spread["count"]
        out["min"] = value * out["step_time_s"] / spread["max"]  # the same FLOPs over the slowest step
        out["max"] = value * out["step_time_s"] / spread["min"]
        if spread["max"] > NOISY * spread["min"]:
            what = f"step time: the median of {spread['count']} untraced steps"
            caveats.append(("step_time_noise", noise(spread["min"], spread["max"], what)))
    if out["step_time_s"] is None:
        out["reason"] = "no untraced step time (Tracer.set_step_time(time_step(...)) or --step-time)"
        caveats.append(("mfu_unavailable", f"MFU N/A: {out['reason']}"))
    elif value is None:
        out["reason"] = "no peak FLOP/s for this device and dtype (--peak-tflops)"
        caveats.append(("mfu_unavailable", f"MFU N/A: {out['reason']}"))
    if (value or 0) > 1 or (json_number(rate.get("hfu")) or 0) > 1:
        caveats.append(
            (
                "mfu_above_100",
                "MFU above 100%, outside its model: the step time or the peak is wrong (a step time shorter than the "
                "traced step, or a peak below the device's dense peak for this dtype)",
            )
        )
    return out, caveats


def assemble(
    src, step_time_s=None, peak_tflops=None, depth=2, top=8, accounts=None, explain=True, present=1, every=None
):
    """The Report of `src` (a reports.output.source.Source of one run): every table the headline and the sections
    read, computed once. `accounts`: reports.flops.accounting.analyse's, when the caller holds it; `explain`:
    whether to keep the explain lines (the text report's); `present`: rank directories in the trace; `every`: {run:
    metadata} of every rank of a distributed trace (the caveats of what the rank sections read of them all)."""
    from reports.flops.coverage import FIX

    run, meta = src.run()
    src.categories()  # first: the memory model's arrays are the report's largest, made before the FLOP rows are held
    state, said = title_state(meta)
    report = Report(run=run, meta=meta, state=state, depth=depth)
    bound = src.bounds()
    if bound["rows"]:
        said.append(
            (
                "flops_bound",
                f"{bound['rows']:,} ops count an upper bound of their FLOPs ({human(bound['flops'])} per step): the "
                "lengths or group sizes they depend on could not be read (meta or fake tensors); column flops_bound",
            )
        )
    said += meta_caveats(meta, every)
    try:
        accounts = src.accounts() if accounts is None else accounts
        report.breakdown = src.breakdown(accounts)
        report.explain = [str(line) for line in src.explain(accounts)] if explain else []
    except ReportError as exc:  # traced without model= or tokens=: no N or T, the rest still reports
        report.breakdown_error = str(exc)
        said.append(("no_model", f"no 6·N·T: {exc}"))
    report.rate = src.mfu(step_time_s, peak_tflops * 1e12 if peak_tflops is not None else None)
    report.spread = step_time_spread(meta.get("step_time"), step_time_s)
    report.meter = src.meter_summary()
    mfu, more = _mfu(report, step_time_s)
    said += more
    said += meter_caveats(report.meter)
    uncounted = src.uncounted()
    if uncounted.num_rows:
        shares = np.array([0.0 if v is None else v for v in values(uncounted, "time_pct")], dtype=np.float64)
        time_pct = float(np.nan_to_num(shares).sum())  # numpy's sum, as pandas' Series.sum adds them
        said.append(
            (
                "uncounted_ops",
                f"{uncounted.num_rows} op(s) without a FLOP formula counted as 0 FLOPs ({sum(values(uncounted, 'ops')):,} "
                f"calls, {time_pct:.1f}% of traced time: {', '.join(printable(o) for o in values(uncounted, 'op')[:3])}"
                f"{', ...' if uncounted.num_rows > 3 else ''}); {FIX}",
            )
        )
    job = src.job(present)
    if job is not None and job["fake_process_group"]:
        said.append(("fake_process_group", "a fake process group moves no data: no bandwidth or collective time"))
    report.modules = top_modules(src, depth, top)
    report.caveats = [{"code": code, "message": message} for code, message in said]
    report.headline = _headline(src, report, mfu, top)
    return report


def top_modules(src, depth, top):
    """The modules by subtree FLOPs down to `depth` (0: the root), the largest `top` of them."""
    mods = src.by_module()
    mods = mods.filter(arrow_of(np.array(values(mods, "depth")) <= depth)) if mods.num_rows else mods
    return mods.take(arrow_of(descending(values_of(mods.column("subtree_flops")))[:top])) if mods.num_rows else mods


def _headline(src, report, mfu, top):
    table, total = report.breakdown, src.phase_flops().get("total")
    flops = {"per_step": total, "expected": None, "ratio": None, "n": None, "tokens": None}
    if table is not None:
        row = next(r for r in table.to_pylist() if r["phase"] == "total")
        flops.update(
            expected=json_number(row["expected_flops"]),
            ratio=json_number(row["ratio"]),
            n=json_number(row["n_rank"]),  # the N its 6·N·T uses: this rank's shards under tensor parallelism
            tokens=json_number(row["tokens"]),
        )
    highest = src.peak()
    categories = src.categories().to_pylist()
    largest = max(categories, key=lambda r: r["bytes"]) if categories else None  # the first of the largest
    memory = {"peak_live_bytes": json_number(highest["peak_live_bytes"]), "largest_category": None, "bytes": None}
    if largest is not None:
        memory.update(largest_category=str(largest["category"]), bytes=json_number(largest["bytes"]))
    r = first_row(src.top_ops(max(top, 1)))  # the top ops section's table (its order is total: first_seq last)
    top_op = None
    if r is not None:
        top_op = {
            "op": str(r["op"]),
            "flops_per_step": json_number(r["flops_per_step"]),
            "pct": json_number(r["flops_pct"]),
        }
    mods = report.modules.to_pylist()
    named = [r for r in mods if r["depth"] > 0 and r["module"] != ""]  # below the root; not "(outside modules)"
    named = named or [r for r in mods if r["module"] != ""]
    top_module = None
    if named:
        r = named[0]
        top_module = {
            "module": str(r["module"]),
            "depth": int(r["depth"]),
            "flops": json_number(r["subtree_flops"]),
            "pct": json_number(r["subtree_flops_pct"]),
        }
    return {
        "flops": flops,
        "mfu": mfu,
        "memory": memory,
        "top_op": top_op,
        "top_module": top_module,
        "steps_traced": src.steps_traced(),
        "warnings": len(report.caveats),
    }


def headline_lines(report, width=100):
    """The headline as text lines (each within `width` where its names allow: wrapped by the caller)."""
    h = report.headline
    f, m, mem = h["flops"], h["mfu"], h["memory"]
    lines = []
    if f["expected"] is not None:
        lines.append(
            f"FLOPs      {human(f['per_step'])} per step = {f['ratio']:.3f} x 6·N·T = {human(f['expected'])} "
            f"(N = {f['n']:,}, T = {tokens_text(f['tokens'])} tokens)"
        )
    else:
        lines.append(f"FLOPs      {human(f['per_step'])} per step; 6·N·T N/A (no model= or tokens=)")
    if m["source"] == "meter":
        lines.append(
            f"MFU        {percent(m['value'])} (Meter: median of {m['steps']:,} metered steps, {percent(m['min'])}-"
            f"{percent(m['max'])}), step {_ms(m['step_time_s'])}"
        )
    elif m["value"] is not None:
        spread = (
            f" (median of {m['steps']} untraced steps, {percent(m['min'])}-{percent(m['max'])})" if m["steps"] else ""
        )
        lines.append(f"MFU        {percent(m['value'])}{spread}, step {_ms(m['step_time_s'])}")
    else:
        lines.append(f"MFU        N/A: {m['reason']}")
    if any(c["code"] == "step_time_noise" for c in report.caveats):
        lines[-1] += "; NOISY: see Caveats"
    largest = ""
    if mem["largest_category"] is not None and mem["peak_live_bytes"]:
        share = mem["bytes"] / mem["peak_live_bytes"]
        largest = f", largest {mem['largest_category']} {human_bytes(mem['bytes'])} ({percent(share)})"
    lines.append(f"Memory     peak {human_bytes(mem['peak_live_bytes'])} live{largest}")
    if h["top_op"] is not None:
        op = h["top_op"]
        lines.append(
            f"Top op     {printable(op['op'])}: {human(op['flops_per_step'])} FLOPs per step ({op['pct']:.1f}%)"
        )
    if h["top_module"] is not None:
        mod = h["top_module"]
        lines.append(
            f"Top module {printable(mod['module'])}: {human(mod['flops'])} FLOPs over {h['steps_traced']} step(s) "
            f"({mod['pct']:.1f}%, with its children)"
        )
    codes = [c["code"] for c in report.caveats]
    lines.append(f"Warnings   {len(codes)}" + (f": {', '.join(codes)} (Caveats below)" if codes else ""))
    return lines


def _ms(seconds):
    return "N/A" if seconds is None else f"{seconds * 1e3:.1f} ms"
