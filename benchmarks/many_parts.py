"""`optrace report` on a trace of many one-row parts: seconds and peak RSS.

    .venv/bin/python benchmarks/many_parts.py [--parts 10000] [--trace /tmp/many_parts] [--json]

Writes the trace with `Tracer(flush_rows=1)` (one `a + 1` per part; the trace's last
part is the empty closing part) unless it exists, then runs `optrace report` in a fresh
subprocess (imports included) and prints its wall time and peak RSS (os.wait4).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make(path, parts):
    import torch

    from tracer import Tracer

    with Tracer(path, flush_rows=1):
        a = torch.zeros(1)
        for _ in range(parts - 1):
            a = a + 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", type=int, default=10_000)
    parser.add_argument("--trace", default="/tmp/many_parts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not os.path.isdir(args.trace):
        make(args.trace, args.parts)
    cmd = [sys.executable, "-m", "reports.output.cli", "report", args.trace] + (["--json"] if args.json else [])
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode()
    print(f"{len(os.listdir(args.trace))} files: exit {os.waitstatus_to_exitcode(status)}, {wall:.2f} s, "
          f"peak RSS {usage.ru_maxrss / 1024:.0f} MB" + (f"\n{err}" if err else ""))


if __name__ == "__main__":
    main()
