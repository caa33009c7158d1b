"""The SQL engine's tables (reports/sql) and, with --reports, `optrace report` with `--engine sql` (the default) and
with `--engine pandas` (the reference), each against a DuckDB aggregate of the same files, each command in a fresh process (seconds, peak RSS).

    .venv/bin/python benchmarks/report_engines.py TRACE [TRACE ...] [--repeats 3] [--ranks 2,4,8] [--code DIR]
                                                  [--reports]

For each trace:
  baseline        DuckDB: per-phase FLOPs, ops and steps and the peak live bytes over the literal part files
  SQL tables      reports.sql.engine.Trace (every check) and every table of reports/sql (by_phase, by_op, by_dtype,
                  by_step, by_module, uncounted, top ops, roofline and split, peak, views, per-step FLOPs): what a
                  report costs once no section needs the rows in Python
  SQL tables (--code)  the same from DIR, a checkout of other code (`git archive COMMIT | tar -x -C DIR`)
  --reports: report --engine sql (every section from SQL, no frame of the rows: `optrace report` as shipped)
             and report --engine pandas (the rows loaded, the pandas functions); with --code also the
             `optrace report` of DIR (report sql (--code))

--ranks R,...: a synthetic distributed trace of R ranks made of hard links to the first TRACE's parts
(R times its rows, no disk used), with its SQL tables over every rank. Each figure is the median of --repeats
runs (the variants interleaved, so a drifting load slows them alike), the range beside it; the load average
(1 minute) is printed before and after each trace's runs.
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

# DuckDB alone over every part of a trace (flat or rank=R directories): the baseline the reports are measured against
DUCKDB_BASELINE = """
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
import reports
from reports.time.roofline import roofline_with_split
trace = Trace(sys.argv[1])
for f in (tables.by_phase, tables.by_op, tables.by_dtype, tables.by_step, reports.by_module, tables.uncounted,
          lambda t: tables.top_ops(t, 8), roofline_with_split, tables.peak, tables.views, tables.phase_flops,
          tables.bounds):
    f(trace)
print(len(trace.runs), "runs")
"""


def run(argv, code=ROOT):
    """(wall seconds, peak RSS in MB, CPU seconds) of one subprocess, run with `code`'s packages."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=code)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(map(str, argv))}: {err.decode()[-500:]}")
    return wall, usage.ru_maxrss / 1024 * 1.048576, usage.ru_utime + usage.ru_stime


def measure(variants, repeats):
    """Run every (label, argv) `repeats` times, the variants interleaved round by round (a machine whose load
    drifts slows them alike), and print each one's median and range, and its ratio to the first's median."""
    found = {label: [] for label, *_ in variants}
    print(f"  load average {os.getloadavg()[0]:.1f} before", flush=True)
    for _ in range(repeats):
        for label, argv, *code in variants:
            found[label].append(run(argv, *code))
    print(f"  load average {os.getloadavg()[0]:.1f} after", flush=True)
    base = None
    for label, runs in found.items():
        wall, rss, cpu = [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]
        med = statistics.median(wall)
        ratio = f"  {med / base[0]:5.1f}x baseline (cpu {statistics.median(cpu) / base[1]:4.1f}x)" if base else ""
        base = base or (med, statistics.median(cpu))
        print(
            f"  {label:<20} {med:6.2f} s ({min(wall):.2f}-{max(wall):.2f})  cpu {statistics.median(cpu):5.2f} s "
            f"({min(cpu):.2f}-{max(cpu):.2f})  peak RSS {statistics.median(rss):5.0f} MB ({min(rss):.0f}-{max(rss):.0f})"
            f"{ratio}",
            flush=True,
        )


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
    parser.add_argument(
        "--code", help="also run the SQL tables (and with --reports the SQL report) from this checkout of other code"
    )
    parser.add_argument("--reports", action="store_true", help="also run `optrace report` with either engine")
    args = parser.parse_args(argv)
    py = sys.executable
    import pyarrow.parquet as pq

    def sql(path):
        out = [("SQL tables", [py, "-c", _SQL_TABLES, os.path.abspath(path)])]
        if args.code:
            out.append(
                ("SQL tables (--code)", [py, "-c", _SQL_TABLES, os.path.abspath(path)], os.path.abspath(args.code))
            )
        return out

    for trace in args.traces:
        parts = sum(len(fs) for _, _, fs in os.walk(trace))
        rows = sum(
            pq.read_metadata(os.path.join(d, f)).num_rows
            for d, _, fs in os.walk(trace)
            for f in fs
            if f.endswith(".parquet")
        )
        print(f"{trace}: {rows:,} rows in {parts:,} files; {args.repeats} runs each, median (range)")
        report = [py, "-m", "reports.output.cli", "report", os.path.abspath(trace), "--engine"]
        reports = (
            [("report --engine sql", [*report, "sql"]), ("report (pandas)", [*report, "pandas"])]
            if args.reports
            else []
        )
        if args.reports and args.code:  # the default report of the other checkout, interleaved with this one's
            reports.insert(1, ("report sql (--code)", [*report, "sql"], os.path.abspath(args.code)))
        measure([("baseline DuckDB", [py, "-c", DUCKDB_BASELINE, trace]), *sql(trace), *reports], args.repeats)
    if args.ranks:
        where = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(args.traces[0])))
        try:
            for ranks in [int(r) for r in args.ranks.split(",")]:
                path = ranks_trace(args.traces[0], ranks, where)
                print(f"{ranks} ranks, each a link to {args.traces[0]}:")
                measure([("baseline DuckDB", [py, "-c", DUCKDB_BASELINE, path]), *sql(path)], args.repeats)
        finally:
            shutil.rmtree(where)


if __name__ == "__main__":
    main()
