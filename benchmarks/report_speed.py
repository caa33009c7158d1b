"""`optrace report` and `optrace compare` on a big trace: seconds and peak RSS, against an Arrow aggregate.

    .venv/bin/python benchmarks/report_speed.py [--trace runs/long.parquet] [--repeats 5] [--check]

Make the trace first with benchmarks/long_run.py (1,000,076 ops). Every command runs
in a fresh subprocess (imports included, as a user runs it); its wall time is
measured around the process and its peak RSS and CPU time come from os.wait4. Each
figure is the median of --repeats runs, with the range beside it.

Baseline, measured in the same run on the same files: DuckDB (a dependency), and
pyarrow, computing per-phase FLOPs, op counts and steps and the peak live bytes (the
figures a report starts from); each optrace command's median wall time is also given
as a multiple of the DuckDB aggregate's. Targets: `optrace report` and `report --json`
<= 4x the DuckDB aggregate and <= 300 MB (issue 37); `compare` <= 2 s and <= 500 MB.

--check also runs the reference path (reports.load with every list cell as a numpy
array, then the same tables) and says whether its text and JSON are identical to the
CLI's; it takes tens of seconds and GBs on a million rows.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S, TARGET_MB = 2.0, 500  # compare's
TARGET_RATIO, REPORT_MB = 4.0, 300  # report's: wall time over the DuckDB aggregate's, peak RSS

_PYARROW = """
import sys, pyarrow.compute as pc, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1], columns=["phase", "step", "flops", "live_bytes"])
t = t.set_column(0, "phase", t["phase"].cast("string"))
g = t.group_by("phase").aggregate([("flops", "sum"), ("flops", "count"), ("step", "count_distinct")])
print(g.to_pylist(), pc.max(t["live_bytes"]).as_py())
"""

_DUCKDB = """
import sys, duckdb
files = sys.argv[1] + "/part-*.parquet"
print(duckdb.sql(f"SELECT phase, sum(flops), count(*), count(DISTINCT step) FROM read_parquet('{files}') GROUP BY phase").fetchall(),
      duckdb.sql(f"SELECT max(live_bytes) FROM read_parquet('{files}')").fetchall())
"""

# The reference path: every list cell a numpy array (reports.load's default), then the views over those rows.
_REFERENCE = """
import json, sys
from reports.loading.load import load, ranks_present
from reports.output.cli import _parser, summary
from reports.output.headline import assemble
from reports.output.report_json import strict
from reports.output.report_text import print_report
from reports.output.source import Source
from reports.sql.frame import memory_trace
path, which = sys.argv[1], sys.argv[2]
df = load(path)
trace = memory_trace(df, "report", [], list(df.columns), grains=True)  # the views over the loaded rows
args, present = _parser().parse_args(["report", path]), ranks_present(path)
if which == "json":  # as reports.output.cli's report prints them (one run: no rank sections)
    found = summary(trace, args.peak_tflops, args.step_time, present, args.top, args.depth)
    print(json.dumps(strict(found), indent=2, allow_nan=False))
else:
    src = Source(trace)
    report = assemble(src, args.step_time, args.peak_tflops, args.depth, args.top, explain=False, present=present)
    print_report(src, report, args, sys.stdout, None, present)
"""


def run(argv):
    """(wall seconds, peak RSS in MB, CPU seconds, stdout) of one subprocess."""
    # as a user's installed optrace runs: from its modules' cached bytecode (PYTHONDONTWRITEBYTECODE, set in some
    # shells and sandboxes, had every run compile the reports package again: about 0.16 s of CPU a command)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, argv))}: exit status {proc.returncode}")
    return wall, usage.ru_maxrss / 1024 * 1.048576, usage.ru_utime + usage.ru_stime, out.decode()


def measure(label, argv, repeats, baseline=None, ratio=None, mb=TARGET_MB):
    """(stdout of the first run, (median wall, median CPU seconds)); `baseline`: the DuckDB aggregate's, to give this
    one's as multiples of them (wall, the target's, judged against `ratio`, None: against TARGET_S; and CPU, steadier
    on a loaded machine), and `mb`."""
    runs = [run(argv) for _ in range(repeats)]
    wall, rss, cpu = ([r[i] for r in runs] for i in range(3))
    med = statistics.median
    times = med(wall) / baseline[0] if baseline else None
    fast = med(wall) <= TARGET_S if ratio is None else times <= ratio
    ok = "ok" if fast and max(rss) <= mb else "over target"
    print(
        f"{label:<34} {med(wall):6.2f} s ({min(wall):.2f}-{max(wall):.2f})  cpu {med(cpu):5.2f} s  "
        f"peak RSS {med(rss):5.0f} MB ({min(rss):.0f}-{max(rss):.0f})"
        + (f"  {times:4.1f}x DuckDB ({med(cpu) / baseline[1]:.1f}x CPU)" if times else "")
        + f"  {ok}"
    )
    return runs[0][3], (med(wall), med(cpu))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(ROOT / "runs" / "long.parquet"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="also run the reference path and compare the output")
    args = parser.parse_args(argv)
    py = sys.executable
    import pyarrow.parquet as pq

    rows = pq.ParquetDataset(args.trace).read(columns=["seq"]).num_rows
    print(
        f"{rows:,} rows in {args.trace}; {args.repeats} runs each, median (range); targets: report <= "
        f"{TARGET_RATIO:g}x the DuckDB aggregate and <= {REPORT_MB} MB, compare <= {TARGET_S} s and <= {TARGET_MB} MB"
    )
    _, duckdb = measure("baseline: DuckDB aggregate", [py, "-c", _DUCKDB, args.trace], args.repeats)
    measure("baseline: pyarrow aggregate", [py, "-c", _PYARROW, args.trace], args.repeats, duckdb)
    cli = [py, "-m", "reports.output.cli"]
    report = {"baseline": duckdb, "ratio": TARGET_RATIO, "mb": REPORT_MB}
    text, _ = measure("optrace report", [*cli, "report", args.trace], args.repeats, **report)
    as_json, _ = measure("optrace report --json", [*cli, "report", args.trace, "--json"], args.repeats, **report)
    measure("optrace compare (trace vs itself)", [*cli, "compare", args.trace, args.trace], args.repeats, duckdb)
    if args.check:
        for which, got in (("text", text), ("json", as_json)):
            ref, _ = measure(f"reference path ({which})", [py, "-c", _REFERENCE, args.trace, which], 1)
            print(f"  {which}: optrace output {'IDENTICAL to' if ref == got else 'DIFFERS from'} the reference path")


if __name__ == "__main__":
    main()
