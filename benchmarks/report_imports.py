"""The floor under `optrace report`: what importing its modules costs in a fresh process, against the report itself.

    .venv/bin/python benchmarks/report_imports.py TRACE [--repeats 5]

The report of TRACE runs once to learn which of optrace's modules it imports (every `reports.*` and `tracer.*` left in
sys.modules); then, each command in a fresh process and the three interleaved run by run, median (range) of wall
seconds, CPU seconds and peak RSS:
  python -c pass          the interpreter alone
  imports                 those modules, with pandas, pyarrow.parquet, DuckDB and numpy: nothing read
  optrace report          the report of TRACE, text
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_MODULES = """
import contextlib, io, json, sys
from reports.output.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    main(["report", sys.argv[1]])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("reports", "tracer"))))
"""


def run(argv):
    """(wall seconds, CPU seconds, peak RSS in MB) of one subprocess."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv)}: exit status {os.waitstatus_to_exitcode(status)}")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024 * 1.048576


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    py, trace = sys.executable, os.path.abspath(args.trace)
    found = subprocess.run([py, "-c", _MODULES, trace], capture_output=True, text=True, cwd=ROOT, check=True)
    modules = json.loads(found.stdout.strip().splitlines()[-1])
    variants = {
        "python -c pass": [py, "-c", "pass"],
        "imports": [py, "-c", f"import {', '.join(modules)}; import pandas, pyarrow.parquet, duckdb, numpy"],
        "optrace report": [py, "-m", "reports.output.cli", "report", trace],
    }
    print(f"{trace}: {len(modules)} optrace modules; load average {os.getloadavg()[0]:.1f} before", flush=True)
    runs = {label: [] for label in variants}
    for _ in range(args.repeats):
        for label, command in variants.items():
            runs[label].append(run(command))
    print(f"load average {os.getloadavg()[0]:.1f} after; {args.repeats} runs each, median (range)")
    for label, found in runs.items():
        wall, cpu, rss = zip(*found)
        print(
            f"  {label:<16} {statistics.median(wall):5.2f} s ({min(wall):.2f}-{max(wall):.2f})  cpu "
            f"{statistics.median(cpu):5.2f} s  peak RSS {statistics.median(rss):4.0f} MB ({min(rss):.0f}-{max(rss):.0f})"
        )


if __name__ == "__main__":
    main()
