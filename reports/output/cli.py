"""The `optrace` command: `optrace report TRACE`, `optrace compare A B [C ...]`, `optrace export TRACE -o OUT.json`,
`optrace plan TRACE --gpu NAME`.

Bad input (a missing file, not Parquet, no optrace metadata, a newer schema)
prints one line naming the file and what is wrong, and exits with status 2; so does a
stdout that cannot be written (a full disk), while a closed pipe (`| head -1`) ends the
command quietly with status 0 (reports/output/stdout.py).
"""

import argparse
import json
import math
import sys
import warnings

from reports._util import tokens_text
from reports.errors import ReportError
from reports.loading.columns import SharedRuns
from reports.loading.integrity import describe_damage, list_parts, merged_away, one_line, signal_of, stopped_by
from reports.output.report_json import sections, strict
from reports.output.source import Source
from reports.output.stdout import checked_stdout
from reports.output.text import column_formatters, human, human_bytes, human_seconds, json_number, percent, printable
from reports.plan.devices import CHOICES as GPU_CHOICES

# Columns no section of `optrace report` reads, left out of its load (a section that needs one takes it out of here).
_REPORT_UNUSED = ("layout", "device", "inplace")
# ... and those only the rank figures read: left out for a trace of one rank.
_RANKS_ONLY = ("start_ns", "comm_bytes", "group_size", "process_group")
# ... of which one rank's own job section (reports/output/distributed.py print_job) reads these.
_JOB_COLUMNS = ("comm_bytes", "group_size", "process_group")


def summary(sql, peak_tflops=None, step_time_s=None, ranks_present=None, top=8):
    """What `report --json` prints, as a dict: the summary figures, then every section of the text report
    (reports/output/report_json.py), from `sql`, a reports.sql.engine.Trace of the run (reports/output/source.py).
    `ranks_present`: rank directories in the trace (reports.loading.load.ranks_present), for its `distributed`
    object; default: the runs loaded."""

    src = Source(sql)
    run, meta = src.run()
    try:
        accounts = src.accounts()  # one analysis of the rows for breakdown and explain
        table = src.breakdown(accounts).set_index("phase")
    except ReportError:  # traced without model= or tokens=: no N or T, the rest still reports
        table = accounts = None
    rate = src.mfu(step_time_s, peak_tflops * 1e12 if peak_tflops is not None else None)
    highest = src.peak().iloc[0]
    return {
        "run": run,
        "complete": bool(meta.get("complete")),
        "signal": signal_of(meta),  # the signal that stopped the run (tracer.recording.signals), or None
        "device": (meta.get("device") or {}).get("name"),
        "params": json_number(table["n_params"].iloc[0]) if table is not None else None,
        "n_rank": json_number(table["n_rank"].iloc[0]) if table is not None else None,  # the N this rank multiplies by
        "n_active": json_number(table["n_active"].iloc[0]) if table is not None else None,  # parameters a token uses
        "tokens": json_number(table["tokens"].iloc[0]) if table is not None else json_number(meta.get("tokens")),
        "steps": src.count_steps(),
        "flops": src.phase_flops(),  # per step; the phases add up to total
        "bound_flops": src.bounds(),  # of those, per step, upper bounds rather than counts
        "external_weight_flops": None if table is None else json_number(table.loc["total", "external_weight_flops"]),
        "expected": None
        if table is None
        else {phase: json_number(table.loc[phase, "expected_flops"]) for phase in ("forward", "backward", "total")},
        "mfu": json_number(rate["mfu"]),
        "achieved_flops_per_s": json_number(rate["achieved_flops_per_s"]),
        "step_time_s": json_number(rate["step_time_s"]),
        "peak_flops_per_s": json_number(rate["peak_flops_per_s"]),
        "peak_live_bytes": json_number(highest["peak_live_bytes"]),
        "damage": dict(meta.get("damage") or {}),
        "compiled_ran_eagerly": bool(meta.get("compiled_ran_eagerly")),
        "compiled_regions_eager": meta.get(
            "compiled_regions_eager"
        ),  # {calls, names, other_calls} (tracer.recording.compiled)
        "compiled_note": compiled_note(meta) or None,
        "backward_unnamed_rows": int(meta.get("backward_unnamed_rows") or 0),
        "attention": meta.get("attention"),  # on meta: which SDPA kernels ran (tracer.recording.meta_attention)
        **_coverage_json(src),
        "distributed": src.job(len(src.runs) if ranks_present is None else ranks_present),
        "untraced_optimizer_steps": int(meta.get("untraced_optimizer_steps") or 0),  # compiled before the trace
        "cycles_without_step": int(meta.get("cycles_without_step") or 0),  # iterations no step boundary split
        "optimizer_state_found_late": int(meta.get("optimizer_state_found_late") or 0),  # bytes live_bytes missed
        "collector": meta.get("collector"),  # which path traced it (tracer.native.loader); null before it was recorded
        "meter": src.meter_summary(),  # a metered run's per-step figures (tracer.metering.meter); null without
        **sections(meta, accounts, peak_tflops, step_time_s, top, src),
    }


def _text(frame, formatters=None, na_rep="NaN", header=None):
    """A table as the report prints it (reports.output.table.render: DataFrame.to_string(index=False)'s text)."""
    import pyarrow as pa

    from reports.output.table import render

    return render(pa.Table.from_pandas(frame, preserve_index=False), formatters, na_rep, header)


def compiled_note(meta):
    """What the report says of torch.compile'd code the tracer ran eagerly (tracer.recording.compiled), or ""."""
    if not meta.get("compiled_ran_eagerly"):
        return ""
    regions = meta.get("compiled_regions_eager") or {}
    counted = ""
    if regions.get("calls"):
        named = [
            f"{printable(str(name))} {calls:,}" if isinstance(calls, int) else printable(str(name))
            for name, calls in (regions.get("names") or {}).items()
        ]
        if regions.get("other_calls"):
            named.append(f"others {regions['other_calls']:,}")
        calls = regions["calls"]
        counted = f" ({calls:,} call{'s' if calls != 1 else ''} of compiled regions: {', '.join(named)})"
    return (
        f"torch.compile'd code ran eagerly under the tracer{counted}; the figures describe the eager program. "
        "Its FLOPs are the eager program's (a compiler's fusion changes bytes and time, not FLOPs); traced "
        "numerics can differ from compiled ones in the last bits"
    )


def python_path_note(meta):
    """The note of a trace the pure-Python path wrote (its metadata's `collector`, tracer.native.loader): why, and what it
    cost; "" for the compiled hook's and for traces from before `collector` was recorded."""
    collector = meta.get("collector")
    if not isinstance(collector, dict) or collector.get("path") != "python":
        return ""
    reason = printable(str(collector.get("reason") or "no reason recorded"))
    return (
        f"traced by optrace's pure-Python path ({reason}): the same rows as the compiled hook's, at about twice its "
        "tracing cost per op (docs/performance.md)"
    )


def _coverage_json(src):
    """`uncounted_ops`: the ops no FLOP formula counted (op, ops, time_pct)."""
    table = src.uncounted()
    return {
        "uncounted_ops": [
            {"op": r.op, "ops": int(r.ops), "time_pct": json_number(r.time_pct)} for r in table.itertuples()
        ]
    }


def _print_coverage(src, out):
    """Ops no FLOP formula counted: never a silent zero."""
    from reports.flops.coverage import FIX

    table = src.uncounted()
    if len(table):
        print(f"\nOps without a FLOP formula (counted as 0 FLOPs; {FIX})", file=out)
        shown = table.assign(time_pct=table["time_pct"].map(lambda v: f"{v:.1f}%"))
        print(_text(shown[["op", "ops", "time_pct"]]), file=out)


def _print_report(sql, args, out):
    from reports.flops.explain import cycles_note

    src = Source(sql)  # every table from the views over `sql`, a Trace of the run
    run, meta = src.run()
    device = (meta.get("device") or {}).get("name", "?")
    state = "complete" if meta.get("complete") else f"INCOMPLETE ({stopped_by(meta)}): figures cover the rows it has"
    if not meta.get("complete") and meta.get("error"):  # the exception the traced code raised (tracer.recording.mode)
        after = f" after {signal_of(meta)}" if signal_of(meta) else ""  # a SIGTERM handler's sys.exit
        state = f"INCOMPLETE: the traced code raised {printable(meta['error'])}{after}; figures cover the rows it has"
    broken = describe_damage(meta.get("damage") or {})
    if broken:
        state = ("DAMAGED" if meta.get("complete") else state) + f"; {broken}"
    print(
        f"optrace report: {printable(run)}  ({src.ops()} ops, {src.steps_traced()} step(s), {printable(device)}, {state})",
        file=out,
    )
    if meta.get("compiled_ran_eagerly"):
        print(f"Note: {compiled_note(meta)}", file=out)
    math_calls = (meta.get("attention") or {}).get("math") or 0
    if math_calls:
        print(
            f"Note: {math_calls} scaled_dot_product_attention call(s) ran PyTorch's math path on the meta device: it keeps "
            "the full score matrix for the backward, where a GPU's fused kernel keeps one value per row; trace with "
            "Tracer(..., meta_attention='fused') (the default) for a GPU's FLOPs and memory",
            file=out,
        )
    if meta.get("untraced_optimizer_steps"):
        k = meta["untraced_optimizer_steps"]
        print(
            f"Note: {k:,} optimizer step{'s' if k != 1 else ''} ran untraced (compiled before the trace: their "
            f"kernels bypass the dispatcher); optimizer FLOPs and bytes leave them out",
            file=out,
        )
    if meta.get("optimizer_state_found_late"):
        print(
            f"Note: {meta['optimizer_state_found_late']:,} bytes of optimizer state were alive when the Tracer was "
            "entered but found only at their optimizer's step: live_bytes and the memory figures before it leave "
            "them out",
            file=out,
        )
    if python_path_note(meta):
        print(f"Note: {python_path_note(meta)}", file=out)
    if cycles_note(meta):  # explain says it too, but it needs model= and tokens=
        print(f"Note: {cycles_note(meta)}", file=out)
    if meta.get("backward_unnamed_rows"):
        print(
            f"Note: {meta['backward_unnamed_rows']:,} backward ops have no module (an engine run of more autograd "
            f"nodes than the tracer names, 20,000); FLOP and byte figures are unaffected",
            file=out,
        )

    bound = src.bounds()
    if bound["rows"]:
        print(
            f"Note: {bound['rows']:,} ops count an upper bound of their FLOPs ({human(bound['flops'])} per step): "
            f"the lengths or group sizes they depend on could not be read (meta or fake tensors); "
            f"column flops_bound",
            file=out,
        )
    print("\nFLOPs per step against 2/4/6 x N x T", file=out)
    try:
        accounts = src.accounts()  # one analysis of the rows for breakdown and explain
        table = src.breakdown(accounts)
    except ReportError as exc:  # traced without model= or tokens=: say why, report the rest
        print(f"  N/A: {exc}", file=out)
    else:
        split = ["weight_matmul_flops", "attention_flops", "other_flops"]
        if "external_weight_flops" in table and table["external_weight_flops"].fillna(0).any():
            split.insert(2, "external_weight_flops")  # a frozen teacher's matmuls: outside ratio and N
        shown = table[["phase", "flops", "expected_flops", "ratio", *split]]
        print(shown.to_string(index=False, formatters=column_formatters(shown), na_rep=""), file=out)
        active = table["n_active"].iloc[0]
        # N_active is of the N this rank multiplies: its shards under tensor parallelism, of which a token uses all
        routed = f", N_active = {active:,.0f} used per token" if active < table["n_rank"].iloc[0] - 0.5 else ""
        if table["n_rank"].iloc[0] != table["n_params"].iloc[0]:
            routed += f", this rank multiplies N = {table['n_rank'].iloc[0]:,} (its tensor-parallel shards)"
        print(
            f"N = {table['n_params'].iloc[0]:,} parameters ({table['n_kind'].iloc[0]}){routed}, "
            f"T = {tokens_text(table['tokens'].iloc[0])} tokens per step",
            file=out,
        )
        for line in src.explain(accounts):
            print(f"  - {printable(line)}", file=out)
        del accounts  # its per-row arrays: freed before the memory section's own

    peak_flops = args.peak_tflops * 1e12 if args.peak_tflops is not None else None
    rate = src.mfu(args.step_time, peak_flops)
    print("\nMFU (model FLOPs per second of untraced step time / promised FLOP/s)", file=out)
    if rate["step_time_s"] is None or (isinstance(rate["step_time_s"], float) and math.isnan(rate["step_time_s"])):
        print("  N/A: no untraced step time (Tracer.set_step_time(time_step(...)) or --step-time)", file=out)
    else:
        print(
            f"  step {rate['step_time_s'] * 1e3:.1f} ms, achieved {human(rate['achieved_flops_per_s'], 'FLOP/s')}, "
            f"peak {human(rate['peak_flops_per_s'], 'FLOP/s')} ({rate['peak_source']}): "
            f"MFU {percent(rate['mfu'])}, HFU {percent(rate['hfu'])}",
            file=out,
        )
        if (json_number(rate["mfu"]) or 0) > 1 or (json_number(rate["hfu"]) or 0) > 1:
            print(
                "  Caveat: above 100%, outside its model: the step time or the peak is wrong (a step time shorter "
                "than the traced step, or a peak below the device's dense peak for this dtype)",
                file=out,
            )
        if "mfu_of_achievable" in rate and json_number(rate["mfu_of_achievable"]) is not None:
            print(f"  of the measured matmul ceiling: {percent(rate['mfu_of_achievable'])}", file=out)
        spread = _step_time_spread(meta.get("step_time"), args.step_time)
        if spread:
            print(f"  {spread}", file=out)

    ops = src.top_ops(args.top)
    print(f"\nTop {len(ops)} ops by FLOPs, per step ({src.steps_traced()} step(s) traced)", file=out)
    print(_text(ops, column_formatters(ops)), file=out)
    mods = src.by_module()
    mods = mods[mods["depth"] <= 2].sort_values("subtree_flops", ascending=False).head(args.top)
    mods = mods.assign(module=mods["module"].replace("", "(outside modules)"))
    mods = mods[["module", "subtree_flops", "subtree_flops_pct"]].rename(
        columns={"subtree_flops": "subtree_flops_total"}
    )
    print(f"\nTop modules by FLOPs, totals over all {src.steps_traced()} step(s) (children rolled up)", file=out)
    print(_text(mods, column_formatters(mods)), file=out)

    _print_coverage(src, out)
    _print_roofline(args, out, src)

    top = src.peak().iloc[0]
    print(
        f"\nMemory: peak {human_bytes(top['peak_live_bytes'])} live at op {top['seq']} ({printable(top['op'])}, {printable(top['phase'])}, module {printable(top['module'] or '-')})",
        file=out,
    )
    for _, row in src.categories().iterrows():
        print(f"  {row['category']:<22} {human_bytes(row['bytes'])}", file=out)

    v = src.views()
    kinds = v.groupby("kind", sort=False)[["ops", "bytes_allocated"]].sum().reset_index()
    print(f"\nViews (no new memory) vs copies, totals over all {src.steps_traced()} step(s)", file=out)
    print(_text(kinds, column_formatters(kinds)), file=out)
    made = v[v["kind"] == "copy"].head(args.top)
    if len(made):
        print(
            "Copies:",
            ", ".join(f"{printable(r.op)} x{r.ops} ({human_bytes(r.bytes_allocated)})" for r in made.itertuples()),
            file=out,
        )


def _print_roofline(args, out, src):
    """The roofline section: the top op kinds by time, and the step's time by what bounds it."""
    table, split = src.roofline_with_split()  # the rows prepared once for both tables
    table = table.head(args.top)
    if not table["bound"].ne("other").any():
        print("\nRoofline: N/A (no roof: record Tracer.set_bandwidth(tracer.memory_bandwidth()) on a CPU)", file=out)
        return
    bw, peak = table["peak_bytes_per_s"].iloc[0], table["peak_flops_per_s"].max()
    print(
        f"\nRoofline, per step ({src.steps_traced()} step(s) traced; op time from busy_ns; bytes are algorithmic; "
        f"roofs {human(peak, 'FLOP/s')}, {human(bw, 'B/s')})",
        file=out,
    )
    shown = table.assign(
        op=table["op"].str.removeprefix("aten."),
        intensity=table["arithmetic_intensity"].round(2),
        efficiency_pct=100 * table["efficiency"],
    )
    shown = shown[
        [
            "op",
            "dtype",
            "ops_per_step",
            "flops_per_step",
            "bytes_per_step",
            "intensity",
            "time_s_per_step",
            "achieved_flops_per_s",
            "bound",
            "efficiency_pct",
        ]
    ]
    shown = shown.rename(columns={"time_s_per_step": "time_per_step"})
    formatters = {**column_formatters(shown), "bytes_per_step": human_bytes}
    above = shown["efficiency_pct"].astype("float64") > 100
    formatters["efficiency_pct"] = lambda v: "N/A" if v is None or v != v else f"{v:.1f}%" + ("*" if v > 100 else "")
    print(_text(shown, formatters, "N/A"), file=out)
    if above.any():
        print(
            f"  * {int(above.sum())} row(s) above 100% of the roof: outside the roofline's model (the bandwidth roof "
            "is a DRAM triad, and small tensors stay in cache, which is faster than DRAM)",
            file=out,
        )
    for row in split.itertuples():
        roof = "" if row.bound == "other" else f", {human_seconds(row.roof_time_s)} at the roof"
        label = "other ops" if row.bound == "other" else f"{row.bound}-bound"
        print(f"  {label:<15} {human_seconds(row.time_s):>8} per step ({percent(row.time_pct / 100)}){roof}", file=out)


def _step_time_spread(timing, given):
    """'the median of 5 untraced steps (78.0-719.0 ms; the slowest 9.2x the fastest): ...' or None."""
    times = (timing or {}).get("times_s") if given is None and isinstance(timing, dict) else None
    if not isinstance(times, list) or len(times) < 2 or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        return None
    low, high = min(times), max(times)
    line = f"step time: the median of {len(times)} untraced steps ({low * 1e3:.1f}-{high * 1e3:.1f} ms)"
    if high > 1.5 * low:
        line += (
            f"; the slowest took {high / low:.1f}x the fastest, so MFU is uncertain by as much "
            "(a busy machine, or more threads than cores: set OMP_NUM_THREADS)"
        )
    return line


def _report(args):
    from reports.loading.load import ranks_present
    from reports.output.distributed import print_job, print_ranks
    from reports.output.meter import print_meter

    list_parts(args.trace)  # a directory that cannot be listed: one line, before the ranks are looked for
    # every rank, checked and warned about as a load of the pandas engine's columns would be
    columns = _frame_columns(args.trace, args.plot)
    everyone = _sql_all(args.trace, columns, _report_keep) if args.engine == "sql" else None
    if everyone is None:  # --engine pandas, or a trace the Trace does not read from its files (v1, v2): the views
        everyone = _memory(args.trace, columns)  # over its rows loaded with reports.load (the reference loader)
    sql = everyone.first_run() if everyone.several else everyone  # rank 0's sections: no second open
    ranks_src = Source(everyone)
    ranks_src = ranks_src if ranks_src.multi_rank() else None
    src = Source(sql)
    if not src.ops():
        _no_ops(args.trace)
    if args.plot:
        from reports.output.plots import save_plots

        paths = save_plots(_first_rank_frame(args.trace, everyone), args.plot)
    if args.json:
        extra = ranks_src.rank_summary() if ranks_src is not None else {}
        found = summary(sql, args.peak_tflops, args.step_time, ranks_present(args.trace), args.top)
        print(json.dumps(strict({**found, **extra}), indent=2, allow_nan=False))
    else:
        _print_report(sql, args, sys.stdout)
        print_meter(src, sys.stdout, ranks_src)  # a metered run's per-step figures (reports/output/meter.py)
        print_job(src, ranks_present(args.trace), sys.stdout)
        if ranks_src is not None:
            print_ranks(ranks_src, sys.stdout)
        if args.plot:
            print("\nPlots: " + ", ".join(str(p) for p in paths))


def _no_ops(path):
    """Raise the one line for a report of no ops: the trace's, or its lowest rank's when other ranks have rows."""
    from reports.loading.load import rank_paths

    ranks = rank_paths(path)
    if len(ranks) > 1:
        (first, rank), (other, _) = ranks[0], ranks[1]
        raise ReportError(
            f"{first}: rank {rank} has no ops (nothing ran inside `with Tracer(...)` there), and the report "
            f"is of the lowest rank; report another rank's directory, e.g. {other}"
        )
    raise ReportError(f"{path}: the trace has no ops (nothing ran inside `with Tracer(...)`){_meter_errors(path)}")


def _meter_errors(path):
    """A metered run's bookkeeping failures, for the one line of a trace with no ops ('' when none or unreadable)."""
    from reports.flops.meter import meter_summary

    try:
        errors = (meter_summary(path) or {}).get("errors")
    except (ReportError, OSError, ValueError):
        return ""
    return (
        (f"; its Meter counted {errors:,} bookkeeping error(s), as a Meter made on another thread than the loop's does")
        if errors
        else ""
    )


def _memory(paths, columns):
    """A Trace over the rows of `paths` loaded with reports.load (`columns`): the views of a trace the Trace does not
    read from its files, and `--engine pandas`, whose loader checks the rows (reports.sql.frame)."""
    from reports.loading.load import load
    from reports.sql.frame import memory_trace

    return memory_trace(load(paths, columns=columns, lists="arrow"), "report", [], columns, grains=True)


def _frame_columns(path, plot):
    from reports.loading.load import rank_paths
    from tracer.schema import COLUMN_NAMES

    unused = _REPORT_UNUSED  # --json holds every section too
    if len(rank_paths(path)) <= 1 and not plot:
        unused += tuple(c for c in _RANKS_ONLY if c not in _JOB_COLUMNS)
    return [c for c in COLUMN_NAMES if c not in unused]


def _sql_all(path, columns, keep=()):
    """The SQL engine's Trace of every rank of the trace (one run per rank), checked and warned about as
    reports.load does (damage named in the words of a load of `columns`: the pandas engine's); None for a trace
    it does not read (v1, v2: the frame's sections then). `keep`: what its read of rank 0's rows keeps for the
    sections (reports/sql/engine.py Trace)."""
    from reports.sql.engine import Trace, Unsupported

    try:
        return Trace(path, columns=columns, keep=keep() if callable(keep) else keep)
    except Unsupported:
        return None


def _report_keep():
    """What the report's FLOP and memory sections, its by-module table and its peak read of rank 0's rows, kept from
    the Trace's read of its parts."""
    from reports.memory.row_scan import Scan
    from reports.sql.flop_rows import FlopRows
    from reports.sql.kept_views import ModuleOwn, Peak

    return (FlopRows, Scan, ModuleOwn, Peak)


def _first_rank_frame(path, everyone):
    """The first rank's rows (for plots) as reports.load of the whole trace names them (run `<name>/rank=R`, a
    `rank` column), without reading the other ranks' rows; `everyone` (a Trace of all ranks) has checked and warned."""
    from reports.loading.load import load, runs_with_ranks

    (first, rank), *_ = runs_with_ranks([path])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once, by `everyone`
        df = load(first, lists="arrow")
    if rank is None:
        return df
    (loaded, meta), (name, _) = next(iter(df.attrs["runs"].items())), next(iter(everyone.runs.items()))
    if loaded != name:
        df["run"] = df["run"].cat.rename_categories([name])
        df.attrs["runs"] = SharedRuns({name: meta})
    if "rank" in df.columns:
        df["rank"] = int(rank)
    else:
        df.insert(1, "rank", int(rank))
    return df


def _compare(args):
    from reports.baseline import is_baseline
    from reports.compare import columns, figures, runs_of_sources, save_baseline, side_by_side_runs
    from reports.compare_words import changes
    from reports.gate import breaches, parse
    from reports.output.compare_text import compare_json, compare_text

    rules = [parse(e) for e in args.fail_if or ()]  # a bad expression: one line, before any work
    traces = [p for p in args.traces if not is_baseline(p)]
    trace = None
    if traces:
        trace = _sql_all(traces, columns(args.by)) if args.engine == "sql" else None
        if trace is None:  # --engine pandas, or a trace the Trace does not read from its files: over its loaded rows
            trace = _memory(traces, columns(args.by))
        ops = dict(zip(trace.totals["run_index"], trace.totals["ops"]))
        for i, (name, path) in enumerate(zip(trace.runs, traces)):
            if not ops.get(i):
                raise ReportError(
                    f"{path}: the trace has no ops (nothing ran inside `with Tracer(...)`); nothing to compare"
                )
    found = iter(figures(trace) if trace is not None else [])
    runs = runs_of_sources([p if is_baseline(p) else next(found) for p in args.traces])
    if args.save_baseline:
        run = save_baseline(runs[0], args.save_baseline, args.traces[0])
        print(
            f"optrace compare: saved the baseline of {printable(run.name)} ({args.traces[0]}) to {args.save_baseline}"
        )
        return 0
    names = [r.name for r in runs]
    table = side_by_side_runs(runs, args.by, None, args.depth)
    words = changes(runs)
    found_breaches = breaches(runs, rules)
    if args.json:
        print(
            json.dumps(
                compare_json(table, names, args.by, names[0], words, rules, found_breaches), indent=2, allow_nan=False
            )
        )
    else:
        print(compare_text(table, names, names[0], args.by, words, args.top, rules, found_breaches))
    for b in found_breaches:
        print(f"optrace compare: breach: {printable(b)}", file=sys.stderr)
    return 1 if found_breaches else 0


def _export(args):
    from reports.output.export import export_trace

    ops = export_trace(args.trace, args.output)
    if args.output.endswith(".pftrace"):  # protobuf: chrome://tracing cannot read it
        hint = "open it at https://ui.perfetto.dev"
    else:
        hint = "open it at https://ui.perfetto.dev or chrome://tracing"
    where = "stdout" if args.output == "-" else args.output
    # with -o - the trace is stdout, so the note goes to stderr
    print(f"optrace export: {ops} ops -> {where} ({hint})", file=sys.stderr if args.output == "-" else sys.stdout)


def _plan(args):
    from reports.loading.load import load
    from reports.output.plan_text import plan_json, print_plan
    from reports.plan.plan import plan

    df = load(args.trace)
    if not len(df):
        raise ReportError(f"{args.trace}: the trace has no ops (nothing ran inside `with Tracer(...)`)")
    assumed = dict(args.assume or [])
    frame = plan(
        df.loc[df["run"] == df["run"].iloc[0]],
        args.gpu,
        args.gpus_per_node,
        args.micro_batch,
        args.batch,
        args.overlap,
        assumed,
    )
    if args.json:
        print(json.dumps(plan_json(frame), indent=2, allow_nan=False))
    else:
        print_plan(frame, sys.stdout, assumptions=args.assumptions, anyway=args.anyway)


def _assumption(text):
    """An argparse type: NAME=NUMBER."""
    name, _, value = text.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=NUMBER, got {text!r}") from None


def _step_time(text):
    """An argparse type: seconds, at least MIN_STEP_TIME_S (one ns), as Tracer.set_step_time takes them."""
    from tracer.schema import MIN_STEP_TIME_S

    value = _positive(text)
    if value < MIN_STEP_TIME_S:
        raise argparse.ArgumentTypeError(f"expected seconds >= {MIN_STEP_TIME_S:g} (one ns), got {text!r}")
    return value


def _positive(text):
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _top(text):
    """An argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def _version():
    """The installed package's version (importlib.metadata: no import of torch or of the tracer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("optrace")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (it printed the usage first: four lines more before the one that matters)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser():
    parser = _Parser(prog="optrace", description="Read optrace traces: FLOPs, MFU, memory, views.")
    parser.add_argument("--version", action="version", version=f"optrace {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="summarise one trace")
    rep.add_argument(
        "trace", help="a trace directory written by tracer.Tracer (with or without rank=R sub-directories)"
    )
    rep.add_argument("--peak-tflops", type=_positive, help="promised peak TFLOP/s (overrides the device table)")
    rep.add_argument("--step-time", type=_step_time, help="untraced step time in seconds (overrides the trace's)")
    rep.add_argument("--json", action="store_true", help="print one JSON object")
    rep.add_argument("--plot", metavar="DIR", help="write PNG plots to DIR")
    rep.add_argument("--top", type=_top, default=8, help="rows in the top-N tables")
    rep.add_argument(
        "--engine",
        choices=("sql", "pandas"),
        default="sql",
        help="how the rows reach the views: DuckDB over the files, holding only the results (sql, default), "
        "or the rows loaded with reports.load and the views run over them (pandas); the output is the same",
    )
    rep.set_defaults(run=_report)
    cmp = sub.add_parser("compare", help="compare several traces")
    cmp.add_argument(
        "traces",
        nargs="+",
        help="two or more traces or baseline files (FILE.json, from --save-baseline); changes are against the first",
    )
    cmp.add_argument(
        "--by",
        choices=("phase", "op", "module"),
        default="phase",
        help="one row per phase, aten op or module and run (default: phase)",
    )
    cmp.add_argument("--json", action="store_true", help="print one JSON object")
    cmp.add_argument("--top", type=_top, default=20, help="keys shown, each with a row per run (default: 20)")
    cmp.add_argument("--depth", type=_top, help="by module: a module and its submodules under the first DEPTH names")
    cmp.add_argument(
        "--fail-if",
        action="append",
        metavar="EXPR",
        help="exit 1 when a run breaks EXPR against the first, e.g. 'flops>+1%%', 'peak_live_bytes>+5%%', "
        "'op:aten.mm.default:flops>+0%%' ([phase|op|module:NAME:]METRIC(>|>=|<|<=)[+|-]NUMBER[%%]); repeatable",
    )
    cmp.add_argument(
        "--save-baseline",
        metavar="FILE",
        help="write the one trace's compare figures to FILE (JSON) to compare against later instead of the trace",
    )
    cmp.add_argument(
        "--engine",
        choices=("sql", "pandas"),
        default="sql",
        help="DuckDB over the files (sql, default) or over the rows loaded with reports.load; same output",
    )
    cmp.set_defaults(run=_compare)
    exp = sub.add_parser("export", help="write a trace for Perfetto: Chrome JSON (.json) or protobuf (.pftrace)")
    exp.add_argument(
        "trace", help="a trace directory written by tracer.Tracer (with or without rank=R sub-directories)"
    )
    exp.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="OUT.json (Chrome JSON), OUT.json.gz (the same, gzip-compressed), OUT.pftrace (Perfetto "
        "protobuf) or - (Chrome JSON to stdout)",
    )
    exp.set_defaults(run=_export)
    pln = sub.add_parser("plan", help="will a traced rank fit on a GPU, and how fast will a step go")
    pln.add_argument("trace", help="a trace of one rank (real, meta or fake; any world size)")
    pln.add_argument(
        "--gpu",
        required=True,
        metavar="NAME",
        help=f"the target, a device of the catalogue (tracer.devices): {', '.join(GPU_CHOICES[:-1])}; or "
        "a name only one of them has (H100); or cpu (the CPU the trace ran on)",
    )
    pln.add_argument("--gpus-per-node", type=_top, default=8, help="GPUs per node (default: 8)")
    pln.add_argument("--micro-batch", type=_top, help="sequences per rank to plan (default: the traced batch)")
    pln.add_argument("--batch", type=_top, help="sequences per rank in the trace (default: found in the trace)")
    pln.add_argument(
        "--overlap",
        choices=("prefetch", "none"),
        default="prefetch",
        help="how collectives overlap compute (default: prefetch, FSDP2's)",
    )
    pln.add_argument(
        "--assume",
        type=_assumption,
        action="append",
        metavar="NAME=VALUE",
        help="override an assumption (e.g. matmul_efficiency=0.7); repeatable",
    )
    pln.add_argument("--json", action="store_true", help="print one JSON object")
    pln.add_argument(
        "--assumptions", action="store_true", help="also list every assumption with its source, and the model's basis"
    )
    pln.add_argument("--anyway", action="store_true", help="print the step time of a plan that does not fit")
    pln.set_defaults(run=_plan)
    return parser


def _interrupted(exc):
    """Whether `exc` is DuckDB's word for a Ctrl-C during a query: its own SIGINT check takes the KeyboardInterrupt
    and raises InterruptException, or RuntimeError('Query interrupted') from a fetch."""
    return (
        type(exc).__name__ == "InterruptException" or isinstance(exc, RuntimeError) and str(exc) == "Query interrupted"
    )


def main(argv=None):
    args = _parser().parse_args(argv)
    from reports.loading.columns import lean_memory

    lean_memory()
    if args.command == "compare" and args.save_baseline and len(args.traces) != 1:
        print(f"optrace compare: error: --save-baseline takes one trace, got {len(args.traces)}", file=sys.stderr)
        return 2
    if args.command == "compare" and not args.save_baseline and len(args.traces) < 2:
        print(f"optrace compare: error: expected at least two traces, got one: {args.traces[0]}", file=sys.stderr)
        return 2
    code = 0  # a command's exit status: compare's gate returns 1 on a breach
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with checked_stdout():  # an OSError writing stdout: StdoutError, one line (reports/output/stdout.py)
                code = args.run(args)
        except ReportError as exc:  # one prefix: a message that starts with the command's name loses it
            message = printable(exc).removeprefix(f"{args.command}: ")
            print(f"optrace {args.command}: error: {message}", file=sys.stderr)
            return 2
        except (
            BrokenPipeError
        ):  # `optrace report T | head`: the reader has what it wanted (checked_stdout dropped the rest)
            return 0
        except KeyboardInterrupt:  # Ctrl-C: the shell's status for SIGINT, one line, no traceback
            print(f"optrace {args.command}: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            if _interrupted(exc):
                print(f"optrace {args.command}: interrupted", file=sys.stderr)
                return 130
            if not merged_away(exc):
                raise
            print(
                f"optrace {args.command}: error: {printable(one_line(exc))} (the tracer of a live trace merged that part "
                "away while it was read: read the trace again)",
                file=sys.stderr,
            )
            return 2
    for w in caught:
        print(f"optrace {args.command}: note: {printable(w.message)}", file=sys.stderr)
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
