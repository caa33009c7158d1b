"""`optrace report` and `optrace compare` on a big trace, against a bare pandas read.

    .venv/bin/python benchmarks/report_speed.py [--trace runs/long.parquet]

Make the trace first with benchmarks/long_run.py (1,000,000 ops). Each timing is
the median of --repeats runs in this process; the ratio is against
`pandas.read_parquet` of the same trace, measured in the same run.
Target: the full report within 5x the bare read.
"""

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from reports.cli import main as optrace  # noqa: E402


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def quietly(argv):
    def run():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert optrace(argv) == 0
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(ROOT / "runs" / "long.parquet"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = len(pd.read_parquet(args.trace, columns=["seq"]))
    bare = timed(lambda: pd.read_parquet(args.trace), args.repeats)
    print(f"{rows:,} rows; pandas.read_parquet: {bare:.2f} s")
    for label, argv_ in (
        ("optrace report", ["report", args.trace]),
        ("optrace report --json", ["report", args.trace, "--json"]),
        ("optrace compare (trace vs itself)", ["compare", args.trace, args.trace]),
    ):
        t = timed(quietly(argv_), args.repeats)
        print(f"{label:<36} {t:6.2f} s  {t / bare:5.2f} x the bare read (target <= 5)")


if __name__ == "__main__":
    main()
