"""`optrace report` on a trace of many one-row parts: seconds and peak RSS, against pyarrow reading the same files.

    .venv/bin/python benchmarks/many_parts.py [--parts 10000] [--trace /tmp/many_parts] [--killed | --no-merge]
                                              [--repeats 3] [--json] [--code DIR]

Writes the trace with `Tracer(flush_rows=1)` (`torch.zeros` and `a + 1` ops, one per part) unless it exists. By default
the run closes (the trace's last part is the empty closing part), timing the close, where the
tracer merges many small parts into one. `--killed`: the run ends with os._exit inside its `with`
block after the last op, leaving its parts as the tracer merged them during the run (64
neighbouring files at a time). `--no-merge`: the tracer merges nothing, during the run or at close
(10,000 one-row files, as a killed run left them before the merges during the run). Then,
`--repeats` rounds, each command in a fresh process (imports included; wall time and peak RSS from
os.wait4): the baseline (pyarrow's `pq.read_table` of the trace's listed part files, every
column) and `optrace report` (run from `--code`, a checkout of other code to compare with, when
given). Prints medians (range) and the report's ratio to the baseline.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = (
    "import sys, pyarrow.parquet as pq; from tracer.schema import part_paths; pq.read_table(part_paths(sys.argv[1]))"
)


def make(path, parts, how):
    """Trace `parts` one-row parts into `path`; `how`: "close", "killed" or "none" (see the module's text)."""
    import torch

    import tracer.store.writer
    from tracer import Tracer

    if how == "none":  # never reached: the parts stay as written
        tracer.store.writer.SmallParts.MIN_PARTS = tracer.store.writer.SmallParts.FANOUT = 2**62
    tr = Tracer(path, flush_rows=1)
    start = time.perf_counter()
    with tr:
        a = torch.zeros(1)
        for _ in range(parts - 1):
            a = a + 1
        closing = time.perf_counter()
        if how == "killed":
            print(f"traced {parts} parts in {closing - start:.1f} s, killed: {len(os.listdir(path))} files")
            sys.stdout.flush()
            os._exit(0)
    end = time.perf_counter()
    import resource

    print(
        f"traced {parts} parts in {closing - start:.1f} s, closed (merging: {how}) in {end - closing:.2f} s, "
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )


def run(cmd, cwd=ROOT):
    """(wall seconds, peak RSS MB) of `cmd` in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode()
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{cmd}: exit {os.waitstatus_to_exitcode(status)}\n{err}")
    return wall, usage.ru_maxrss / 1024


def spread(values, unit, digits):
    return f"{statistics.median(values):.{digits}f} {unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", type=int, default=10_000)
    parser.add_argument("--trace", default="/tmp/many_parts")
    ending = parser.add_mutually_exclusive_group()
    ending.add_argument("--killed", action="store_true", help="the run is killed after its last op")
    ending.add_argument("--no-merge", action="store_true", help="the tracer merges no part")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--code", help="run the report from this checkout (its reports/ and tracer/) as well")
    args = parser.parse_args()
    how = "killed" if args.killed else "none" if args.no_merge else "close"
    if not os.path.isdir(args.trace):  # a fresh process: the tracer's imports stay out of the report's RSS
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
                f"import many_parts; many_parts.make({args.trace!r}, {args.parts}, {how!r})",
            ],
            cwd=ROOT,
            check=True,
        )
    report = [sys.executable, "-m", "reports.output.cli", "report", args.trace] + (["--json"] if args.json else [])
    baseline = [sys.executable, "-c", BASELINE, args.trace]
    found = {"baseline": [], "report": []} | ({"--code": []} if args.code else {})
    for _ in range(args.repeats):  # interleaved, so all see the same load
        found["baseline"].append(run(baseline))
        found["report"].append(run(report))
        if args.code:  # `-m` finds the checkout's packages first (the current directory leads sys.path)
            found["--code"].append(run(report, os.path.abspath(args.code)))
    print(f"{args.trace}: {len(os.listdir(args.trace))} files; {args.repeats} runs each, median (range)")
    base = statistics.median(w for w, _ in found["baseline"])
    for name, runs in found.items():
        walls, rss = [w for w, _ in runs], [m for _, m in runs]
        ratio = "" if name == "baseline" else f"   {statistics.median(walls) / base:.1f}x baseline"
        print(f"  {name:<9} {spread(walls, 's', 2)}  peak RSS {spread(rss, 'MB', 0)}{ratio}")


if __name__ == "__main__":
    main()
