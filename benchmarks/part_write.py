"""What writing one part costs per row, by stage, against an uncompressed Arrow IPC file.

    .venv/bin/python benchmarks/part_write.py [--steps 10] [--repeats 15]

Traces `--steps` training steps of the example GPT (one part, as in overhead.py's rounds),
keeps the part's row buffer, then times each stage alone on it (the process's CPU time,
median and interquartile range over `--repeats`): building the Arrow table from the flat
buffers, encoding it as the tracer's Parquet part (zstd level 1), writing the same table as
an uncompressed Arrow IPC file (what a spill file during the run would cost) and the
metadata JSON. Read against overhead.py's per-op figures: it says how much of optrace's
cost a cheaper way of getting rows to disk could save.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead import example_gpt  # noqa: E402

from tracer import Tracer  # noqa: E402
from tracer.store import writer  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    step = example_gpt()
    step()  # AdamW's state
    kept = {}
    original = writer.PartWriter.write

    def keep(self, rows, metadata):
        kept.update(rows=rows, metadata=metadata, writer=self)
        return original(self, rows, metadata)

    with tempfile.TemporaryDirectory() as tmp:
        writer.PartWriter.write = keep
        try:
            with Tracer(Path(tmp) / "trace"):
                for _ in range(args.steps):
                    step()
        finally:
            writer.PartWriter.write = original
        rows, metadata, part = kept["rows"], kept["metadata"], kept["writer"]
        table = rows.table(part.names, part.itemsize, metadata)

        def ipc():
            with pa.OSFile(str(Path(tmp) / "spill.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
                out.write_table(table)

        stages = {
            "Arrow table from the buffers": lambda: rows.table(part.names, part.itemsize, metadata),
            "Parquet part, zstd": lambda: writer.write_table(table, Path(tmp) / "part.parquet"),
            "Arrow IPC file, uncompressed": ipc,
            "metadata JSON": lambda: json.dumps(metadata, default=str, separators=(",", ":")),
        }
        n = len(rows)
        print(
            f"one part of {n} rows ({args.steps} example GPT steps), CPU time per row, median (IQR) of {args.repeats}"
        )
        for name, run in stages.items():
            times = []
            for _ in range(args.repeats):
                start = time.process_time()
                run()
                times.append((time.process_time() - start) / n * 1e6)
            q = statistics.quantiles(times, n=4)
            print(f"{name:<32} {statistics.median(times):6.2f} us/row ({q[0]:.2f}-{q[2]:.2f})")


if __name__ == "__main__":
    main()
