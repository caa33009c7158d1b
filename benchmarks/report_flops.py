"""The FLOP sections of `optrace report` (breakdown, explain, MFU, the step count) from the SQL engine and from
pandas, each in a fresh process (seconds, peak RSS), beside the SQL engine opening the trace alone.

    .venv/bin/python benchmarks/report_flops.py TRACE [TRACE ...] [--repeats 3]

  Trace alone     reports.sql.engine.Trace(TRACE): the checks and the tables every SQL report computes once
  sections (sql)  the same, then the FLOP sections through reports/output/source.py Source(None, trace):
                  reports/sql/flops.py's small frame, the roles analysis, breakdown, explain, MFU
  sections (pandas)  reports.load of the columns `optrace report` loads (lists="arrow"), then the same
                  sections through Source(df)

The variants run interleaved, `--repeats` times each; medians, the range beside them: wall seconds, CPU seconds
(user + system, which a machine shared with other jobs disturbs less) and peak RSS.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_OPEN = """
import sys, warnings
warnings.simplefilter("ignore")
from reports.loading.columns import lean_memory
lean_memory()
from reports.sql.engine import Trace
Trace(sys.argv[1])
"""

_SECTIONS = """
import sys, warnings
warnings.simplefilter("ignore")
from reports.loading.columns import lean_memory
lean_memory()
from reports.output.source import Source
if sys.argv[2] == "sql":
    from reports.sql.engine import Trace
    src = Source(None, Trace(sys.argv[1]))
else:
    from reports.loading.load import load
    from reports.output.trace_reads import _REPORT_UNUSED, _RANKS_ONLY, _JOB_COLUMNS
    from tracer.schema import COLUMN_NAMES
    unused = _REPORT_UNUSED + tuple(c for c in _RANKS_ONLY if c not in _JOB_COLUMNS)
    src = Source(load(sys.argv[1], columns=[c for c in COLUMN_NAMES if c not in unused], lists="arrow"))
accounts = src.accounts()
table = src.breakdown(accounts)
lines = src.explain(accounts)
rate = src.mfu()
print(table.to_string(), *lines, rate, src.count_steps(), sep="\\n")
"""


def run(argv):
    """(wall seconds, CPU seconds, peak RSS in MB) of one subprocess."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(map(str, argv))}: {err.decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024 * 1.048576


def measure(variants, repeats):
    found = {label: [] for label, _ in variants}
    for _ in range(repeats):
        for label, argv in variants:
            found[label].append(run(argv))
    for label, runs in found.items():
        cells = []
        for i, unit in enumerate(("s wall", "s CPU", "MB peak RSS")):
            values = [r[i] for r in runs]
            cells.append(
                f"{statistics.median(values):6.2f} {unit} ({min(values):.2f}-{max(values):.2f})"
                if i < 2
                else f"{statistics.median(values):5.0f} {unit} ({min(values):.0f}-{max(values):.0f})"
            )
        print(f"  {label:<18} " + "  ".join(cells), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    py = sys.executable
    for trace in args.traces:
        print(f"{trace}: {args.repeats} runs each, median (range)")
        measure(
            [
                ("Trace alone", [py, "-c", _OPEN, trace]),
                ("sections (sql)", [py, "-c", _SECTIONS, trace, "sql"]),
                ("sections (pandas)", [py, "-c", _SECTIONS, trace, "pandas"]),
            ],
            args.repeats,
        )


if __name__ == "__main__":
    main()
