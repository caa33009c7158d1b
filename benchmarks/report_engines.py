"""`optrace report` with its tables from the SQL engine and from pandas, and the SQL engine alone, each against a
DuckDB aggregate of the same files, each command in a fresh process (seconds, peak RSS).

    .venv/bin/python benchmarks/report_engines.py TRACE [TRACE ...] [--repeats 3] [--ranks 2,4,8]

For each trace:
  baseline        DuckDB: per-phase FLOPs, ops and steps and the peak live bytes over the literal part files
  report --engine sql  the frame loaded for breakdown, explain, MFU, memory categories and the rank sections;
                  summary FLOPs, top ops and modules, uncounted ops, roofline, peak and views from SQL
                  (reports/output/source.py)
  report (pandas) `optrace report` as shipped: every table from the frame (the reference path)
  SQL tables      reports.sql.engine.Trace and every table of reports/sql (by_phase, by_op, by_dtype, by_step,
                  by_module, uncounted, top ops, roofline and split, peak, views, per-step FLOPs): what a report
                  costs once no section needs the rows in Python

--ranks R,...: a synthetic distributed trace of R ranks made of hard links to the first TRACE's parts
(R times its rows, no disk used), with its SQL tables over every rank; the figures extrapolate to the
128-rank, 50M-row target. Each figure is the median of --repeats runs (the variants interleaved), the range beside it.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BASELINE = """
import os, re, sys, duckdb
dirs = [sys.argv[1]] + sorted(os.path.join(sys.argv[1], d) for d in os.listdir(sys.argv[1]) if d.startswith("rank="))
files = [os.path.abspath(os.path.join(d, f)) for d in dirs for f in sorted(os.listdir(d)) if f.endswith(".parquet")]
files = ", ".join("'" + re.sub(r"([*?\\[])", r"[\\1]", f).replace("'", "''") + "'" for f in files)
rows = f"read_parquet([{files}], hive_partitioning = false)"
print(duckdb.sql(f"SELECT phase, sum(flops), count(*), count(DISTINCT step) FROM {rows} GROUP BY phase").fetchall(),
      duckdb.sql(f"SELECT max(live_bytes) FROM {rows}").fetchall())
"""


_SQL_TABLES = """
import sys, warnings
warnings.simplefilter("ignore")
from reports.sql.engine import Trace
from reports.sql import tables
from reports import sql_report
trace = Trace(sys.argv[1])
for f in (tables.by_phase, tables.by_op, tables.by_dtype, tables.by_step, sql_report.by_module, tables.uncounted,
          lambda t: tables.top_ops(t, 8), sql_report.roofline_with_split, tables.peak, tables.views, tables.phase_flops,
          tables.bounds):
    f(trace)
print(len(trace.runs), "runs")
"""


def run(argv):
    """(wall seconds, peak RSS in MB) of one subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(map(str, argv))}: {err.decode()[-500:]}")
    return wall, usage.ru_maxrss / 1024 * 1.048576


def measure(variants, repeats):
    """Run every (label, argv) `repeats` times, the variants interleaved round by round (a machine whose load
    drifts slows them alike), and print each one's median and range, and its ratio to the first's median."""
    found = {label: [] for label, _ in variants}
    for _ in range(repeats):
        for label, argv in variants:
            found[label].append(run(argv))
    base = None
    for label, runs in found.items():
        wall, rss = [r[0] for r in runs], [r[1] for r in runs]
        med = statistics.median(wall)
        ratio = f"  {med / base:5.1f}x baseline" if base else ""
        base = base or med
        print(f"  {label:<20} {med:6.2f} s ({min(wall):.2f}-{max(wall):.2f})  peak RSS {statistics.median(rss):5.0f} MB "
              f"({min(rss):.0f}-{max(rss):.0f}){ratio}", flush=True)  # fmt: skip


def ranks_trace(source, ranks, where):
    """A distributed trace of `ranks` rank directories, each hard links to `source`'s files."""
    path = os.path.join(where, f"ranks{ranks}")
    for r in range(ranks):
        d = os.path.join(path, f"rank={r}")
        os.makedirs(d)
        for name in os.listdir(source):
            os.link(os.path.join(source, name), os.path.join(d, name))
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", default="", help="comma-separated rank counts for the synthetic distributed trace")
    args = parser.parse_args(argv)
    py = sys.executable
    import pyarrow.parquet as pq

    for trace in args.traces:
        parts = sum(len(fs) for _, _, fs in os.walk(trace))
        rows = sum(pq.read_metadata(os.path.join(d, f)).num_rows for d, _, fs in os.walk(trace) for f in fs
                   if f.endswith(".parquet"))  # fmt: skip
        print(f"{trace}: {rows:,} rows in {parts:,} files; {args.repeats} runs each, median (range)")
        measure([("baseline DuckDB", [py, "-c", _BASELINE, trace]),
                 ("report --engine sql", [py, "-m", "reports.output.cli", "report", "--engine", "sql", trace]),
                 ("report (pandas)", [py, "-m", "reports.output.cli", "report", trace]),
                 ("SQL tables", [py, "-c", _SQL_TABLES, trace])], args.repeats)  # fmt: skip
    if args.ranks:
        where = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(args.traces[0])))
        try:
            for ranks in [int(r) for r in args.ranks.split(",")]:
                path = ranks_trace(args.traces[0], ranks, where)
                print(f"{ranks} ranks, each a link to {args.traces[0]}:")
                measure([("baseline DuckDB", [py, "-c", _BASELINE, path]), ("SQL tables", [py, "-c", _SQL_TABLES, path])],
                        args.repeats)  # fmt: skip
        finally:
            shutil.rmtree(where)


if __name__ == "__main__":
    main()
