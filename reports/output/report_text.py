"""The text of `optrace report`: the title, the headline (reports.output.headline), then the sections.

By default the text fits `width` columns (100, or the terminal's when it is wider: shutil.get_terminal_size) and
DEFAULT_LINES lines: prose is wrapped, a table's names are shortened with "…" to fit, and the sections are taken in
FIT_ORDER while they fit; the last line names the sections left out. `--full` prints every section (tables at their
own width), `--sections a,b` the named ones (SECTIONS), each in the order of SECTIONS."""

import io
import shutil
import textwrap

from reports.output.headline import headline_lines
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


def _table(frame, formatters=None, na_rep="NaN", width=None, name=None):
    """A table's lines (reports.output.table.render); with `width`, the `name` column shortened with "…" so that
    the table fits."""
    import pyarrow as pa

    from reports.output.table import render

    def text(f):
        return render(pa.Table.from_pandas(f, preserve_index=False), formatters, na_rep).split("\n")

    lines = text(frame)
    over = max(len(x) for x in lines) - width if width else 0
    if over > 0 and name is not None and len(frame):
        names = frame[name].astype(str)
        keep = max(12, int(names.str.len().max()) - over - 1)
        frame = frame.assign(**{name: [n if len(n) <= keep + 1 else n[:keep] + "…" for n in names]})
        lines = text(frame)
    return [Row(x) for x in lines]


def _flops(report, src, args, fit):
    lines = ["FLOPs per step against 2/4/6 x N x T"]
    table = report.breakdown
    if table is None:
        return [*lines, f"  N/A: {report.breakdown_error}"]
    split = ["weight_matmul_flops", "attention_flops", "other_flops"]
    if "external_weight_flops" in table and table["external_weight_flops"].fillna(0).any():
        split.insert(2, "external_weight_flops")  # a frozen teacher's matmuls: outside ratio and N
    shown = table[["phase", "flops", "expected_flops", "ratio", *split]]
    lines += [Row(x) for x in shown.to_string(index=False, formatters=column_formatters(shown), na_rep="").split("\n")]
    active = table["n_active"].iloc[0]
    # N_active is of the N this rank multiplies: its shards under tensor parallelism, of which a token uses all
    routed = f", N_active = {active:,.0f} used per token" if active < table["n_rank"].iloc[0] - 0.5 else ""
    if table["n_rank"].iloc[0] != table["n_params"].iloc[0]:
        routed += f", this rank multiplies N = {table['n_rank'].iloc[0]:,} (its tensor-parallel shards)"
    from reports._util import tokens_text

    lines.append(
        f"N = {table['n_params'].iloc[0]:,} parameters ({table['n_kind'].iloc[0]}){routed}, "
        f"T = {tokens_text(table['tokens'].iloc[0])} tokens per step"
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
    head = f"Top {len(ops)} ops by FLOPs, per step ({src.steps_traced()} step(s) traced)"
    return [head, *_table(ops, column_formatters(ops), width=fit, name="op")]


def _modules(report, src, args, fit):
    mods = report.modules
    mods = mods.assign(module=mods["module"].replace("", "(outside modules)"))
    mods = mods[["module", "subtree_flops", "subtree_flops_pct"]].rename(
        columns={"subtree_flops": "subtree_flops_total"}
    )
    head = (
        f"Top modules by FLOPs, totals over all {src.steps_traced()} step(s) (children rolled up; depth <= "
        f"{report.depth})"
    )
    return [head, *_table(mods, column_formatters(mods), width=fit, name="module")]


def _uncounted(report, src, args, fit):
    from reports.flops.coverage import FIX

    table = src.uncounted()
    if not len(table):
        return []
    shown = table.assign(time_pct=table["time_pct"].map(lambda v: f"{v:.1f}%"))
    head = f"Ops without a FLOP formula (counted as 0 FLOPs; {FIX})"
    return [head, *_table(shown[["op", "ops", "time_pct"]], width=fit, name="op")]


def _roofline(report, src, args, fit):
    """The top op kinds by time against the roofline, and the step's time by what bounds it."""
    table, split = src.roofline_with_split()  # the rows prepared once for both tables
    table = table.head(args.top)
    if not table["bound"].ne("other").any():
        return ["Roofline: N/A (no roof: record Tracer.set_bandwidth(tracer.memory_bandwidth()) on a CPU)"]
    bw, peak = table["peak_bytes_per_s"].iloc[0], table["peak_flops_per_s"].max()
    lines = [
        f"Roofline, per step ({src.steps_traced()} step(s) traced; op time from busy_ns; bytes are algorithmic; "
        f"roofs {human(peak, 'FLOP/s')}, {human(bw, 'B/s')})"
    ]
    shown = table.assign(
        op=table["op"].str.removeprefix("aten."),
        intensity=table["arithmetic_intensity"].round(2),
        efficiency_pct=100 * table["efficiency"],
    )
    columns = ["op", "dtype", "ops_per_step", "flops_per_step", "bytes_per_step", "intensity", "time_s_per_step"]
    shown = shown[[*columns, "achieved_flops_per_s", "bound", "efficiency_pct"]]
    shown = shown.rename(columns={"time_s_per_step": "time_per_step"})
    formatters = {**column_formatters(shown), "bytes_per_step": human_bytes}
    above = shown["efficiency_pct"].astype("float64") > 100
    formatters["efficiency_pct"] = lambda v: "N/A" if v is None or v != v else f"{v:.1f}%" + ("*" if v > 100 else "")
    lines += _table(shown, formatters, "N/A", width=fit, name="op")
    if above.any():
        lines.append(
            f"  * {int(above.sum())} row(s) above 100% of the roof: outside the roofline's model (the bandwidth roof "
            "is a DRAM triad, and small tensors stay in cache, which is faster than DRAM)"
        )
    for row in split.itertuples():
        roof = "" if row.bound == "other" else f", {human_seconds(row.roof_time_s)} at the roof"
        label = "other ops" if row.bound == "other" else f"{row.bound}-bound"
        lines.append(f"  {label:<15} {human_seconds(row.time_s):>8} per step ({percent(row.time_pct / 100)}){roof}")
    return lines


def _memory(report, src, args, fit):
    top = src.peak().iloc[0]
    lines = [
        f"Memory: peak {human_bytes(top['peak_live_bytes'])} live at op {top['seq']} ({printable(top['op'])}, "
        f"{printable(top['phase'])}, module {printable(top['module'] or '-')})"
    ]
    for _, row in src.categories().iterrows():
        lines.append(f"  {row['category']:<22} {human_bytes(row['bytes'])}")
    return lines


def _views(report, src, args, fit):
    v = src.views()
    kinds = v.groupby("kind", sort=False)[["ops", "bytes_allocated"]].sum().reset_index()
    lines = [f"Views (no new memory) vs copies, totals over all {src.steps_traced()} step(s)"]
    lines += _table(kinds, column_formatters(kinds))
    made = v[v["kind"] == "copy"].head(args.top)
    if len(made):
        copies = ", ".join(f"{printable(r.op)} x{r.ops} ({human_bytes(r.bytes_allocated)})" for r in made.itertuples())
        lines.append(f"Copies: {copies}")
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
