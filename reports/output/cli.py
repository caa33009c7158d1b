"""The `optrace` command: `optrace report TRACE`, `optrace compare A B [C ...]`, `optrace export TRACE -o OUT.json`,
`optrace plan TRACE --gpu NAME`.

Bad input (a missing file, not Parquet, no optrace metadata, a newer schema)
prints one line naming the file and what is wrong, and exits with status 2; so does a
stdout that cannot be written (a full disk), while a closed pipe (`| head -1`) ends the
command quietly with status 0 (reports.output.stdout).
"""

import contextlib
import json
import sys
import warnings

from reports.errors import ReportError
from reports.loading.integrity import list_parts, merged_away, one_line, signal_of
from reports.output.arguments import parser
from reports.output.caveats import compiled_note
from reports.output.report_json import sections, strict
from reports.output.source import Source
from reports.output.stdout import checked_stdout
from reports.output.text import json_number, printable
from reports.output.trace_reads import compare_keep, first_rank_frame, frame_columns, loaded_trace, report_keep, sql_all


def summary(sql, peak_tflops=None, step_time_s=None, ranks_present=None, top=8, depth=2, every=None):
    """What `report --json` prints, as a dict: the headline and the caveats (reports.output.headline, the text
    report's), the summary figures, then every section of the text report (reports.output.report_json), from
    `sql`, a reports.sql.engine.Trace of the run (reports.output.source). `ranks_present`: rank directories in the
    trace (reports.loading.load.ranks_present), for its `distributed` object; default: the runs loaded. `mfu` is the
    headline's: a metered run's Meter median unless `step_time_s` is given (`mfu_source`); `mfu_details` is always
    the step time's. `every`: {run: metadata} of every rank (reports.output.headline.assemble)."""
    from reports.output.headline import assemble

    src = Source(sql)
    present = len(src.runs) if ranks_present is None else ranks_present
    run, meta = src.run()
    src.categories()  # first: the memory model's arrays are the report's largest, made before the FLOP rows are held
    try:
        accounts = src.accounts()  # one analysis of the rows for breakdown and explain
        table = {r["phase"]: r for r in src.breakdown(accounts).to_pylist()}  # {phase: its row}
    except ReportError:  # traced without model= or tokens=: no N or T, the rest still reports
        table = accounts = None
    first = next(iter(table.values())) if table else None
    rate = src.mfu(step_time_s, peak_tflops * 1e12 if peak_tflops is not None else None)
    report = assemble(
        src, step_time_s, peak_tflops, depth, top, accounts=accounts, explain=False, present=present, every=every
    )
    highest = src.peak()
    return {
        "headline": report.headline,  # what the text report's first lines say (reports.output.headline)
        "caveats": report.caveats,  # [{code, message}]: every note on the figures, the text's Caveats
        "run": run,
        "complete": bool(meta.get("complete")),
        "signal": signal_of(meta),  # the signal that stopped the run (tracer.recording.signals), or None
        "device": (meta.get("device") or {}).get("name"),
        "params": json_number(first["n_params"]) if table is not None else None,
        "n_rank": json_number(first["n_rank"]) if table is not None else None,  # the N this rank multiplies by
        "n_active": json_number(first["n_active"]) if table is not None else None,  # parameters a token uses
        "tokens": json_number(first["tokens"]) if table is not None else json_number(meta.get("tokens")),
        "steps": src.count_steps(),
        "flops": src.phase_flops(),  # per step; the phases add up to total
        "bound_flops": src.bounds(),  # of those, per step, upper bounds rather than counts
        "external_weight_flops": None if table is None else json_number(table["total"]["external_weight_flops"]),
        "expected": None
        if table is None
        else {phase: json_number(table[phase]["expected_flops"]) for phase in ("forward", "backward", "total")},
        "mfu": report.headline["mfu"]["value"],  # the headline's one MFU (mfu_source); mfu_details: the step time's
        "mfu_source": report.headline["mfu"]["source"],  # "meter", "step_time", or null when N/A
        "achieved_flops_per_s": json_number(rate["achieved_flops_per_s"]),
        "step_time_s": json_number(rate["step_time_s"]),
        "peak_flops_per_s": json_number(rate["peak_flops_per_s"]),
        "mfu_weighted": json_number(rate["mfu_weighted"]),  # each matmul at its own dtype's peak (reports.mfu)
        "weighted_peak_flops_per_s": json_number(rate["weighted_peak_flops_per_s"]),
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
        "distributed": src.job(present),
        "untraced_optimizer_steps": int(meta.get("untraced_optimizer_steps") or 0),  # compiled before the trace
        "cycles_without_step": int(meta.get("cycles_without_step") or 0),  # iterations no step boundary split
        "optimizer_state_found_late": int(meta.get("optimizer_state_found_late") or 0),  # bytes live_bytes missed
        "collector": meta.get("collector"),  # which path traced it (tracer.native.loader); null before it was recorded
        "meter": src.meter_summary(),  # a metered run's per-step figures (tracer.metering.meter); null without
        **sections(meta, accounts, peak_tflops, step_time_s, top, src, depth),
    }


def _coverage_json(src):
    """`uncounted_ops`: the ops no FLOP formula counted (op, ops, time_pct)."""
    return {
        "uncounted_ops": [
            {"op": r["op"], "ops": int(r["ops"]), "time_pct": json_number(r["time_pct"])}
            for r in src.uncounted().to_pylist()
        ]
    }


def _report(args):
    from reports.loading.load import ranks_present
    from reports.output.headline import assemble
    from reports.output.report_text import print_report

    list_parts(args.trace)  # a directory that cannot be listed: one line, before the ranks are looked for
    # every rank, checked and warned about as a load of the pandas engine's columns would be
    columns = frame_columns(args.trace, args.plot)
    everyone = sql_all(args.trace, columns, report_keep) if args.engine == "sql" else None
    if everyone is None:  # --engine pandas, or a trace the Trace does not read from its files (v1, v2): the views
        everyone = loaded_trace(args.trace, columns)  # over its rows loaded with reports.load (the reference loader)
    sql = everyone.first_run() if everyone.several else everyone  # rank 0's sections: no second open
    ranks_src = Source(everyone)
    ranks_src = ranks_src if ranks_src.multi_rank() else None
    src = Source(sql)
    if not src.ops():
        _no_ops(args.trace)
    if args.plot:
        from reports.output.plots import save_plots

        paths = save_plots(first_rank_frame(args.trace, everyone), args.plot)
    present = ranks_present(args.trace)
    if args.json:
        extra = ranks_src.rank_summary() if ranks_src is not None else {}
        found = summary(sql, args.peak_tflops, args.step_time, present, args.top, args.depth, everyone.runs)
        print(json.dumps(strict({**found, **extra}), indent=2, allow_nan=False))
    else:
        explain = args.full or "explain" in (args.sections or ())
        report = assemble(
            src,
            args.step_time,
            args.peak_tflops,
            args.depth,
            args.top,
            explain=explain,
            present=present,
            every=everyone.runs,
        )
        print_report(src, report, args, sys.stdout, ranks_src, present)
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


def _compare(args):
    from reports.baseline import is_baseline
    from reports.compare import baselines_of, columns, figures, of_sources, save_baseline, side_by_side_runs
    from reports.compare_words import changes
    from reports.gate import breaches, parse
    from reports.output.compare_text import compare_json, compare_text

    rules = [parse(e) for e in args.fail_if or ()]  # a bad expression: one line, before any work
    traces = [p for p in args.traces if not is_baseline(p)]
    trace = None
    if traces:
        trace = sql_all(traces, columns(args.by), compare_keep, every_run=True) if args.engine == "sql" else None
        if trace is None:  # --engine pandas, or a trace the Trace does not read from its files: over its loaded rows
            trace = loaded_trace(traces, columns(args.by))
    found = iter(figures(trace) if trace is not None else [])
    runs = of_sources(
        args.traces, found
    )  # every run of each trace (a distributed trace's ranks); a run of no ops refused
    if args.save_baseline:
        run = save_baseline(runs[0], args.save_baseline, args.traces[0])
        print(
            f"optrace compare: saved the baseline of {printable(run.name)} ({args.traces[0]}) to {args.save_baseline}"
        )
        return 0
    names, pairs = [r.name for r in runs], baselines_of(runs)  # a distributed baseline: each run against its rank
    table = side_by_side_runs(runs, args.by, None, args.depth)
    words = changes(runs)
    found_breaches = breaches(runs, rules)
    if args.json:
        print(
            json.dumps(
                compare_json(table, names, args.by, names[0], words, rules, found_breaches, pairs),
                indent=2,
                allow_nan=False,
            )
        )
    else:
        print(compare_text(table, names, names[0], args.by, words, args.top, rules, found_breaches, pairs))
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
    from reports.output.plan_text import plan_json, print_calibration, print_plan
    from reports.plan.options import Options
    from reports.plan.plan import plan_runs

    assumed = dict(args.assume or [])
    with _plan_runs(args.trace) as runs:
        fitted, changes = _calibration(args, assumed)
        options = Options(
            gpus_per_node=args.gpus_per_node,
            micro_batch=args.micro_batch,
            batch=args.batch,
            overlap=args.overlap,
            assumptions=assumed,
            pp=args.pp,
            micro_batches=args.micro_batches,
            schedule=args.schedule,
            virtual_stages=args.virtual_stages,
            cp=args.cp,
            calibrated=fitted,
        )
        found = plan_runs(runs, args.gpu, options)[0]
    if args.json:
        found = plan_json(found)
        if changes is not None:
            found["calibration"] = changes
        print(json.dumps(found, indent=2, allow_nan=False))
    else:
        if changes is not None:
            print_calibration(args.calibrate, changes, sys.stdout)
        print_plan(found, sys.stdout, assumptions=args.assumptions, anyway=args.anyway)


@contextlib.contextmanager
def _plan_runs(path):
    """[the first run of the trace at `path`] as a reports.plan.rows.Run, read through the Trace of its files
    (reports.sql.engine: checked and warned about as reports.load does); a trace the Trace does not read (v1, v2)
    through reports.load. A trace without ops is a ReportError."""
    from reports.plan.rows import frame_runs, trace_runs

    trace = sql_all(path, None)
    if trace is None:
        from reports.loading.load import load

        df = load(path)
        runs = frame_runs(df.loc[df["run"] == df["run"].iloc[0]]) if len(df) else []
    else:
        runs = trace_runs(trace, first=True)
    try:
        if not runs or not len(runs[0].rows):
            raise ReportError(f"{path}: the trace has no ops (nothing ran inside `with Tracer(...)`)")
        yield runs
    finally:
        if trace is not None:
            trace.close()


def _calibration(args, assumed):
    """({name: (value, source)}, changes) fitted from --calibrate's trace (reports.plan.calibration), or (None, None)."""
    if not args.calibrate:
        return None, None
    from reports.plan.calibration import fit

    with _plan_runs(args.calibrate) as runs:
        return fit(runs, args.gpu, assumed)


def _parser():
    """`optrace`'s argument parser (reports.output.arguments), each command run by its function here."""
    return parser({"report": _report, "compare": _compare, "export": _export, "plan": _plan})


def _interrupted(exc):
    """Whether `exc` is DuckDB's word for a Ctrl-C during a query: its own SIGINT check takes the KeyboardInterrupt
    and raises InterruptException, or RuntimeError('Query interrupted') from a fetch."""
    return (
        type(exc).__name__ == "InterruptException" or isinstance(exc, RuntimeError) and str(exc) == "Query interrupted"
    )


def main(argv=None):
    args = _parser().parse_args(argv)
    from reports._util import lean_memory

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
            with checked_stdout():  # an OSError writing stdout: StdoutError, one line (reports.output.stdout)
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
