"""`optrace`'s command line: its parser, each option's type (a bad value: one line naming it and what was
expected) and help; reports.output.cli runs the commands."""

import argparse
import math

from reports.output.report_text import SECTIONS
from reports.plan.devices import CHOICES as GPU_CHOICES

__all__ = ["parser"]


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


def _depth(text):
    """An argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def _sections(text):
    """An argparse type: section names of `optrace report` (reports.output.report_text.SECTIONS), comma-separated."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if name not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(map(repr, bad)) or repr(text)}; the sections are {', '.join(SECTIONS)}"
        )
    return [name for name in SECTIONS if name in names]


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


def parser(commands):
    """`optrace`'s argument parser: `commands` {report, compare, export, plan: the function that runs it}."""
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
    rep.add_argument("--depth", type=_depth, default=2, help="top modules down to this depth (0: the root; default 2)")
    shown = rep.add_mutually_exclusive_group()
    shown.add_argument(
        "--full", action="store_true", help="every section, with no limit of lines (default: what fits 60 lines)"
    )
    shown.add_argument(
        "--sections",
        type=_sections,
        metavar="A,B",
        help="print these sections after the headline: " + ", ".join(SECTIONS),
    )
    rep.add_argument(
        "--engine",
        choices=("sql", "pandas"),
        default="sql",
        help="how the rows reach the views: DuckDB over the files, holding only the results (sql, default), "
        "or the rows loaded with reports.load and the views run over them (pandas); the output is the same",
    )
    rep.set_defaults(run=commands["report"])
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
    cmp.set_defaults(run=commands["compare"])
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
    exp.set_defaults(run=commands["export"])
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
    pln.add_argument("--pp", type=_top, default=1, help="pipeline-parallel stages (default: 1)")
    pln.add_argument("--micro-batches", type=_top, default=1, help="micro-batches per step of a pipeline (default: 1)")
    pln.add_argument(
        "--schedule",
        choices=("1f1b", "interleaved"),
        default="1f1b",
        help="the pipeline's schedule (default: 1f1b; interleaved with --virtual-stages)",
    )
    pln.add_argument("--virtual-stages", type=_top, default=1, help="model chunks per rank, interleaved (default: 1)")
    pln.add_argument("--cp", type=_top, default=1, help="context-parallel degree: ring attention (default: 1)")
    pln.add_argument(
        "--assume",
        type=_assumption,
        action="append",
        metavar="NAME=VALUE",
        help="override an assumption (e.g. matmul_efficiency=0.7); repeatable",
    )
    pln.add_argument(
        "--calibrate",
        metavar="MEASURED",
        help="fit the efficiencies from MEASURED, a trace timed on the target GPU, and print what changed",
    )
    pln.add_argument("--json", action="store_true", help="print one JSON object")
    pln.add_argument(
        "--assumptions", action="store_true", help="also list every assumption with its source, and the model's basis"
    )
    pln.add_argument("--anyway", action="store_true", help="print the step time of a plan that does not fit")
    pln.set_defaults(run=commands["plan"])
    return parser
