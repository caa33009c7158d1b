"""The text of `optrace report`: the title, the headline (reports.output.headline), then the sections.

By default the text fits `width` columns (100, or the terminal's when it is wider: shutil.get_terminal_size) and
DEFAULT_LINES lines: prose is wrapped, a table's names are shortened with "…" to fit, and the sections are taken in
FIT_ORDER while they fit; the last line names the sections left out. `--full` prints every section (tables at their
own width), `--sections a,b` the named ones (SECTIONS), each in the order of SECTIONS."""

import io
import shutil
import textwrap

import numpy as np
import pyarrow as pa

from reports.arrays import array_of, arrow_of, strings
from reports.output.headline import headline_lines
from reports.output.table import first_row, render, values
from reports.output.text import column_formatters, human, human_bytes, human_seconds, percent, printable

__all__ = ["DEFAULT_LINES", "SECTIONS", "print_report", "report_width"]

# Every section, in the order they print, with what each holds (`optrace report --help` lists them).
SECTIONS = {
    "caveats": "what qualifies the figures: a bound, a missing step time, noise, a damaged trace",
    "flops": "FLOPs per step by phase against 2/4/6 x N x T",
    "explain": "the FLOPs against 6·N·T term by term, in words",
    "mfu": "MFU and HFU: step time, achieved and peak FLOP/s",
    "ops": "top ops by FLOPs, per step",
    "modules": "top modules by FLOPs (children rolled up; --depth)",
    "uncounted": "ops without a FLOP formula",
    "roofline": "op kinds against the roofline, and the step's time by bound",
    "memory": "peak live memory by category",
    "views": "views against copies",
    "meter": "a metered run's per-step figures",
    "distributed": "this rank's job and its collectives",
    "ranks": "every rank side by side, imbalance",
}
# The default text takes the sections in this order while they fit DEFAULT_LINES; explain and roofline only on
# demand (--sections, --full): long prose and a table wider than 100 columns.
FIT_ORDER = (
    "caveats",
    "flops",
    "mfu",
    "meter",
    "distributed",
    "ranks",
    "memory",
    "ops",
    "modules",
    "uncounted",
    "views",
)
DEFAULT_LINES = 60
WIDTH = 100


class Row(str):
    """A line of a table: shortened, never wrapped."""


def report_width():
    """100 columns, or the terminal's when it is wider."""
    return max(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)


def _wrap(line, width):
    if isinstance(line, Row) or len(line) <= width:
        return [line]
    body = line.lstrip(" ")
    lead = " " * (len(line) - len(body))
    more = lead + ("    " if body.startswith("- ") else "  ")
    return textwrap.wrap(
        body, width, initial_indent=lead, subsequent_indent=more, break_on_hyphens=False, break_long_words=True
    )


def _table(table, formatters=None, na_rep="NaN", width=None, name=None):
    """A table's lines (reports.output.table.render of a pyarrow Table); with `width`, the `name` column shortened
    with "…" so that the table fits."""

    def text(t):
        return render(t, formatters, na_rep).split("\n")

    lines = text(table)
    over = max(len(x) for x in lines) - width if width else 0
    if over > 0 and name is not None and table.num_rows:
        names = [str(n) for n in values(table, name)]
        keep = max(12, max(len(n) for n in names) - over - 1)
        short = strings([n if len(n) <= keep + 1 else n[:keep] + "…" for n in names])
        table = table.set_column(table.column_names.index(name), name, short)
        lines = text(table)
    return [Row(x) for x in lines]


def _flops(report, src, args, fit):
    lines = ["FLOPs per step against 2/4/6 x N x T"]
    table = report.breakdown
    if table is None:
        return [*lines, f"  N/A: {report.breakdown_error}"]
    split = ["weight_matmul_flops", "attention_flops", "other_flops"]
    if "external_weight_flops" in table.column_names and any(
        v and v == v for v in values(table, "external_weight_flops")
    ):
        split.insert(2, "external_weight_flops")  # a frozen teacher's matmuls: outside ratio and N
    shown = table.select(["phase", "flops", "expected_flops", "ratio", *split])
    lines += [Row(x) for x in render(shown, column_formatters(shown), na_rep="").split("\n")]
    row = first_row(table)
    active = row["n_active"]
    # N_active is of the N this rank multiplies: its shards under tensor parallelism, of which a token uses all
    routed = f", N_active = {active:,.0f} used per token" if active < row["n_rank"] - 0.5 else ""
    if row["n_rank"] != row["n_params"]:
        routed += f", this rank multiplies N = {row['n_rank']:,} (its tensor-parallel shards)"
    from reports._util import tokens_text

    lines.append(
        f"N = {row['n_params']:,} parameters ({row['n_kind']}){routed}, "
        f"T = {tokens_text(row['tokens'])} tokens per step"
    )
    return lines


def _explain(report, src, args, fit):
    if not report.explain:
        return []
    return ["FLOPs against 6·N·T, term by term", *(f"  - {printable(line)}" for line in report.explain)]


def _mfu(report, src, args, fit):
    rate, mfu = report.rate, report.headline["mfu"]
    lines = ["MFU (model FLOPs per second of untraced step time / promised FLOP/s)"]
    if mfu["source"] == "meter":
        lines.append(
            f"  from the Meter: median {percent(mfu['value'])} over {mfu['steps']:,} metered untraced steps "
            f"(section meter); HFU {percent(mfu['hfu'])}"
        )
    if rate["step_time_s"] is None or rate["step_time_s"] != rate["step_time_s"]:
        if mfu["source"] == "meter":
            return lines  # the Meter's step times, not one traced
        return [*lines, "  N/A: no untraced step time (Tracer.set_step_time(time_step(...)) or --step-time)"]
    lines.append(
        f"  step {rate['step_time_s'] * 1e3:.1f} ms, achieved {human(rate['achieved_flops_per_s'], 'FLOP/s')}, "
        f"peak {human(rate['peak_flops_per_s'], 'FLOP/s')} ({rate['peak_source']}): "
        f"MFU {percent(rate['mfu'])}, HFU {percent(rate['hfu'])}"
    )
    if rate.get("mfu_of_achievable") is not None and rate["mfu_of_achievable"] == rate["mfu_of_achievable"]:
        lines.append(f"  of the measured matmul ceiling: {percent(rate['mfu_of_achievable'])}")
    spread = report.spread
    if spread:
        lines.append(
            f"  step time: the median of {spread['count']} untraced steps "
            f"({spread['min'] * 1e3:.1f}-{spread['max'] * 1e3:.1f} ms)"
        )
    return lines


def _ops(report, src, args, fit):
    ops = src.top_ops(args.top)
    head = f"Top {ops.num_rows} ops by FLOPs, per step ({src.steps_traced()} step(s) traced)"
    return [head, *_table(ops, column_formatters(ops), width=fit, name="op")]


def _modules(report, src, args, fit):
    mods = report.modules
    mods = pa.table(
        {
            "module": strings([m if m != "" else "(outside modules)" for m in values(mods, "module")]),
            "subtree_flops_total": mods.column("subtree_flops"),
            "subtree_flops_pct": mods.column("subtree_flops_pct"),
        }
    )
    head = (
        f"Top modules by FLOPs, totals over all {src.steps_traced()} step(s) (children rolled up; depth <= "
        f"{report.depth})"
    )
    return [head, *_table(mods, column_formatters(mods), width=fit, name="module")]


def _uncounted(report, src, args, fit):
    from reports.flops.coverage import FIX

    table = src.uncounted()
    if not table.num_rows:
        return []
    shown = pa.table(
        {
            "op": table.column("op"),
            "ops": table.column("ops"),
            "time_pct": strings([f"{v:.1f}%" for v in values(table, "time_pct")]),
        }
    )
    head = f"Ops without a FLOP formula (counted as 0 FLOPs; {FIX})"
    return [head, *_table(shown, width=fit, name="op")]


def _roofline(report, src, args, fit):
    """The top op kinds by time against the roofline, and the step's time by what bounds it."""
    table, split = src.roofline_with_split()  # the rows prepared once for both tables
    table = table.slice(0, args.top)
    if not any(b != "other" for b in values(table, "bound")):
        return ["Roofline: N/A (no roof: record Tracer.set_bandwidth(tracer.memory_bandwidth()) on a CPU)"]
    bw = values(table, "peak_bytes_per_s")[0]
    peaks = [v for v in values(table, "peak_flops_per_s") if v is not None and v == v]
    peak = max(peaks) if peaks else float("nan")
    lines = [
        f"Roofline, per step ({src.steps_traced()} step(s) traced; op time from busy_ns; bytes are algorithmic; "
        f"roofs {human(peak, 'FLOP/s')}, {human(bw, 'B/s')})"
    ]
    efficiency = 100 * _floats(table, "efficiency")
    shown = pa.table(
        {
            "op": strings([o.removeprefix("aten.") for o in values(table, "op")]),
            **{c: table.column(c) for c in ("dtype", "ops_per_step", "flops_per_step", "bytes_per_step")},
            "intensity": arrow_of(np.round(_floats(table, "arithmetic_intensity"), 2)),
            "time_per_step": table.column("time_s_per_step"),
            "achieved_flops_per_s": table.column("achieved_flops_per_s"),
            "bound": table.column("bound"),
            "efficiency_pct": arrow_of(efficiency),
        }
    )
    formatters = {**column_formatters(shown), "bytes_per_step": human_bytes}
    above = efficiency > 100
    formatters["efficiency_pct"] = lambda v: "N/A" if v is None or v != v else f"{v:.1f}%" + ("*" if v > 100 else "")
    lines += _table(shown, formatters, "N/A", width=fit, name="op")
    if above.any():
        lines.append(
            f"  * {int(above.sum())} row(s) above 100% of the roof: outside the roofline's model (the bandwidth roof "
            "is a DRAM triad, and small tensors stay in cache, which is faster than DRAM)"
        )
    for row in split.to_pylist():
        roof = "" if row["bound"] == "other" else f", {human_seconds(row['roof_time_s'])} at the roof"
        label = "other ops" if row["bound"] == "other" else f"{row['bound']}-bound"
        lines.append(
            f"  {label:<15} {human_seconds(row['time_s']):>8} per step ({percent(row['time_pct'] / 100)}){roof}"
        )
    return lines


def _floats(table, name):
    """Column `name` as a float64 array, a null as NaN."""
    return np.array([np.nan if v is None else v for v in values(table, name)], dtype=np.float64)


def _memory(report, src, args, fit):
    top = src.peak()
    lines = [
        f"Memory: peak {human_bytes(top['peak_live_bytes'])} live at op {top['seq']} ({printable(top['op'])}, "
        f"{printable(top['phase'])}, module {printable(top['module'] or '-')})"
    ]
    for row in src.categories().to_pylist():
        lines.append(f"  {row['category']:<22} {human_bytes(row['bytes'])}")
    return lines


def kinds(table):
    """The views table summed per kind, in order of first appearance (the "Views vs copies" lines): kind, ops,
    bytes_allocated."""
    sums = {}
    for kind, ops, size in zip(values(table, "kind"), values(table, "ops"), values(table, "bytes_allocated")):
        found = sums.setdefault(kind, [0, 0])
        found[0], found[1] = found[0] + ops, found[1] + size
    return pa.table(
        {
            "kind": strings(list(sums)),
            "ops": array_of([s[0] for s in sums.values()], table.schema.field("ops").type),
            "bytes_allocated": array_of([s[1] for s in sums.values()], table.schema.field("bytes_allocated").type),
        }
    )


def copies(table, top):
    """The first `top` rows of the views table that are copies, as [{column: value}]."""
    return [r for r in table.to_pylist() if r["kind"] == "copy"][:top]


def _views(report, src, args, fit):
    v = src.views()
    summed = kinds(v)
    lines = [f"Views (no new memory) vs copies, totals over all {src.steps_traced()} step(s)"]
    lines += _table(summed, column_formatters(summed))
    made = copies(v, args.top)
    if made:
        shown = ", ".join(f"{printable(r['op'])} x{r['ops']} ({human_bytes(r['bytes_allocated'])})" for r in made)
        lines.append(f"Copies: {shown}")
    return lines


def _captured(print_section):
    """A section printed by a function of `out` (reports.output.meter, reports.output.distributed), as lines."""
    out = io.StringIO()
    print_section(out)
    return out.getvalue().strip("\n").split("\n") if out.getvalue().strip() else []


def _caveats(report, src, args, fit):
    if not report.caveats:
        return []
    return ["Caveats", *(f"  - {c['code']}: {c['message']}" for c in report.caveats)]


def _short_caveats(report, width):
    """The caveats in one line each, cut at `width` ("…"), for a default text that has no room for their words."""
    lines = ["Caveats (cut to one line each: --sections caveats for their words)"]
    for c in report.caveats:
        line = f"  - {c['code']}: {c['message']}"
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return lines


def print_report(src, report, args, out, ranks_src=None, present=1):
    """Print the report of `src` (a reports.output.source.Source of one run; `report` its
    reports.output.headline.Report) to `out`. `args`: the parsed `optrace report` options (top, full, sections);
    `ranks_src`: a Source over every rank of a job; `present`: rank directories in the trace."""
    from reports.output.distributed import print_job, print_ranks
    from reports.output.meter import print_meter

    width = getattr(args, "width", None) or report_width()
    full, chosen = getattr(args, "full", False), getattr(args, "sections", None)
    makers = {
        "caveats": _caveats,
        "flops": _flops,
        "explain": _explain,
        "mfu": _mfu,
        "ops": _ops,
        "modules": _modules,
        "uncounted": _uncounted,
        "roofline": _roofline,
        "memory": _memory,
        "views": _views,
        "meter": lambda *_: _captured(lambda o: print_meter(src, o, ranks_src)),
        "distributed": lambda *_: _captured(lambda o: print_job(src, present, o)),
        "ranks": lambda *_: _captured(lambda o: print_ranks(ranks_src, o)) if ranks_src is not None else [],
    }
    fit = None if full or chosen else width  # tables at their own width when asked for in full

    def section(name):
        return [x for line in makers[name](report, src, args, fit) for x in _wrap(line, width)]

    meta = report.meta
    device = (meta.get("device") or {}).get("name", "?")
    title = (
        f"optrace report: {printable(report.run)}  ({src.ops()} ops, {src.steps_traced()} step(s), "
        f"{printable(device)}, {report.state})"
    )
    lines = [*_wrap(title, width), *(x for line in headline_lines(report) for x in _wrap(line, width))]
    if full or chosen:
        for name in SECTIONS if full else chosen:
            body = section(name)
            if body:
                lines += ["", *body]
    else:
        lines += _fitted(report, section, width, len(lines))
    for line in lines:
        print(line if full or chosen or len(line) <= width else line[: width - 1] + "…", file=out)


def _fitted(report, section, width, used):
    """The default sections: those of FIT_ORDER that fit DEFAULT_LINES after the `used` lines, in the order of
    SECTIONS, and a last line naming what was left out."""
    budget = DEFAULT_LINES - used - 3  # the blank line and the (up to two) lines naming what was left out
    kept, left = {}, ["explain", "roofline"]
    for name in FIT_ORDER:
        body = section(name)
        if not body:
            continue
        if name == "caveats" and len(body) + 1 > budget:
            body = _short_caveats(report, width)
        if len(body) + 1 <= budget:
            kept[name] = body
            budget -= len(body) + 1
        else:
            left.append(name)
    lines = []
    for name in SECTIONS:
        if name in kept:
            lines += ["", *kept[name]]
    left = [name for name in SECTIONS if name in left]
    return [*lines, "", *_wrap(f"Not shown: {', '.join(left)} (--sections NAME,... or --full)", width)]
