"""The fixed cost of opening and closing a report Trace (reports.sql.engine.Trace) on small traces.

    .venv/bin/python benchmarks/trace_open.py TRACE [TRACE ...] [--repeats 30]

Each trace is opened once to warm the imports and the file cache, then opened (its parts checked, the grains made,
run_totals read: what every report and library table starts from) and closed `--repeats` times in this process;
prints the median and range of the wall and CPU milliseconds per open. The test suite and the library API open a
Trace thousands of times on small traces, where this fixed cost is most of a report's time.

Baseline, in the same run on the same files: a bare DuckDB open, `duckdb.connect()`, a count of the rows of the
trace's part files and close (a fresh database each time, as a report process makes one).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb  # noqa: E402

from reports.loading.integrity import list_parts  # noqa: E402
from reports.loading.load import runs_with_ranks  # noqa: E402
from reports.sql.engine import Trace, file_literal  # noqa: E402


def bare(path):
    """The baseline's open of `path`: a DuckDB database, the rows of every part counted, closed."""
    files = [f for run, _ in runs_with_ranks([path]) for f in list_parts(run)]
    db = duckdb.connect()
    db.execute(f"SELECT count(*) FROM read_parquet([{', '.join(map(file_literal, files))}])").fetchall()
    db.close()


def opened(path):
    Trace(path).close()


def measure(open_, path, repeats):
    """([wall ms], [CPU ms]) of `repeats` calls of open_(path), after one to warm up."""
    open_(path)
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        open_(path)
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return walls, cpus


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    med = statistics.median
    for path in args.traces:
        for label, open_ in (("Trace open+close", opened), ("bare DuckDB", bare)):
            walls, cpus = measure(open_, path, args.repeats)
            print(
                f"{path}: {label} {med(walls):.1f} ms wall ({min(walls):.1f}-{max(walls):.1f}), "
                f"{med(cpus):.1f} ms CPU (median of {args.repeats})"
            )


if __name__ == "__main__":
    main()
