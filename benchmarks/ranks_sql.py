"""`optrace report --engine sql` on a synthetic 128-rank trace of 50M rows: seconds and peak RSS, each command
in a fresh process (`/usr/bin/time -f "%e %M"`), against a DuckDB aggregate of the same files.

    .venv/bin/python benchmarks/ranks_sql.py [--ranks 128] [--rows 50000000] [--dir /tmp] [--keep] [--trace PATH]

The trace: a rank of a simulated FSDP2 job (tests/tracer/distributed/test_job.py: world size --ranks, fake process group,
FakeTensorMode; 332 rows of 2 steps) is traced once; its rows are repeated, written with pyarrow into
--ranks `rank=R` directories of parts of 16,384 rows (the tracer's flush size), --rows in all. Each copy
of the rows has seq and step renumbered, so seq increases and the steps are distinct, and storage ids
other than the metadata's (parameters, gradients, optimizer state, FSDP2's unsharded parameters, which
live across steps) moved past the previous copy's, so each copy allocates and frees its own storages;
each part carries the source's metadata with its rank, a trace id per rank and its part and row counts,
so every check of the readers passes.

Measured, each in a fresh process:
  baseline DuckDB       per-phase FLOPs, ops and steps and the peak live bytes over every part file
  rank sections (SQL)   a reports.sql.engine.Trace of every rank (the checks of every part included) and the
                        sections that read every rank: ranks, imbalance, the lowest rank's collectives
                        (reports/distributed/sql_ranks.py through reports/output/source.py)
  memory categories     a Trace of rank 0 and its memory categories (reports/memory/sql_categories.py)
  report --engine sql   the whole report, text: every section from SQL, no frame of the rows
  report --json         the same, --json
Targets (issue 20): <= 60 s and <= 2 GB peak RSS.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from report_engines import DUCKDB_BASELINE  # this directory: the benchmarks run as scripts

ROOT = Path(__file__).resolve().parents[1]
PART_ROWS = 16384

_RANK_SECTIONS = """
import sys, warnings
warnings.simplefilter("ignore")
from reports.output.source import Source
from reports.sql.engine import Trace
src = Source(None, Trace(sys.argv[1]))
assert src.multi_rank()
print(len(src.ranks()), "ranks;", len(src.imbalance()), "phases;", len(src.lowest_rank_collectives()), "collectives")
"""

_MEMORY = """
import os, sys, warnings
warnings.simplefilter("ignore")
from reports.sql.engine import Trace
from reports.memory.sql_categories import by_category, memory_rows
trace = Trace(os.path.join(sys.argv[1], "rank=0"))
print(by_category(trace).to_pandas()[["category", "bytes"]].to_string(index=False), len(memory_rows(trace, 0)), "rows")
"""


def source_rank(where, world):
    """Trace rank 0 of a simulated FSDP2 job of `world` ranks (tests/tracer/distributed/test_job.py); its rank directory."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "examples")]
    from test_job import simulate

    path = os.path.join(where, "source")
    simulate(path, world)
    return os.path.join(path, "rank=0")


def write_ranks(source, path, ranks, rows):
    """The synthetic trace at `path` (see the module docstring); returns its rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tracer.schema import METADATA_KEY, part_paths

    table = pa.concat_tables([pq.read_table(p) for p in part_paths(source)])
    meta = json.loads(pq.read_metadata(part_paths(source)[0]).metadata[METADATA_KEY])
    roles = meta.get("storage_roles") or {}
    kept = {
        int(p["storage_id"]) for key in ("parameters", "unsharded_parameters") for p in (meta.get(key) or {}).values()
    }
    kept |= {int(s) for key in ("gradient", "optimizer_state", "external_parameter") for s in roles.get(key) or []}
    kept |= {int(s) for s, _ in roles.get("at_entry") or []}
    n = table.num_rows
    seq0 = table.column("seq").to_numpy() - table.column("seq")[0].as_py()
    step0 = table.column("step").to_numpy()
    step_span = int(step0.max()) + 1
    ids = {
        c: table.column(c).combine_chunks() for c in ("input_storage_ids", "output_storage_ids", "freed_storage_ids")
    }
    id_span = max(int(pc.max(a.flatten()).as_py() or 0) for a in ids.values()) + 1
    keep = {c: np.isin(a.flatten().to_numpy(), sorted(kept)) for c, a in ids.items()}
    per_rank = rows // ranks
    copies = -(-per_rank // n)
    pieces = []
    for k in range(copies):  # one rank's rows: the source's, `copies` times, renumbered
        t = table.set_column(table.schema.get_field_index("seq"), "seq", pa.array(seq0 + k * (int(seq0[-1]) + 1)))
        t = t.set_column(t.schema.get_field_index("step"), "step", pa.array(step0 + k * step_span))
        for c, a in ids.items():
            values = a.flatten().to_numpy()
            moved = pa.ListArray.from_arrays(a.offsets, np.where(keep[c], values, values + k * id_span))
            t = t.set_column(t.schema.get_field_index(c), c, moved)
        pieces.append(t)
    one = pa.concat_tables(pieces).slice(0, per_rank).combine_chunks()
    parts = -(-per_rank // PART_ROWS)
    for r in range(ranks):
        d = os.path.join(path, f"rank={r}")
        os.makedirs(d)
        trace_id = f"{r:032x}"
        for i in range(parts):
            piece = one.slice(i * PART_ROWS, PART_ROWS)
            facts = {
                **meta,
                "rank": r,
                "local_rank": r % 8,
                "trace_id": trace_id,
                "parts": i + 1,
                "rows": min((i + 1) * PART_ROWS, per_rank),
            }
            schema = piece.schema.with_metadata({METADATA_KEY: json.dumps(facts)})
            pq.write_table(piece.cast(schema), os.path.join(d, f"part-{i:06d}.parquet"), compression="zstd")
        print(f"\r  rank {r + 1}/{ranks} written", end="", flush=True)
    print()
    return per_rank * ranks


def timed(argv):
    """(seconds, peak RSS in MB) of `argv` in a fresh process, by /usr/bin/time -f "%e %M"."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.NamedTemporaryFile("r") as times:
        proc = subprocess.run(
            ["/usr/bin/time", "-o", times.name, "-f", "%e %M", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
        )
        if proc.returncode:
            raise SystemExit(f"{' '.join(argv)}: {proc.stderr.decode()[-800:]}")
        seconds, kb = times.read().split()[-2:]
    return float(seconds), int(kb) / 1024 * 1.048576, proc.stdout.decode()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--rows", type=int, default=50_000_000, help="rows in all, over every rank")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the trace is written (a few GB)")
    parser.add_argument("--keep", action="store_true", help="leave the trace in place and print its path")
    parser.add_argument("--trace", help="measure this trace (one --keep left) instead of writing one")
    args = parser.parse_args(argv)
    py = sys.executable
    where = os.path.dirname(args.trace) if args.trace else tempfile.mkdtemp(prefix="optrace-ranks-", dir=args.dir)
    try:
        path = args.trace or os.path.join(where, "ranks")
        if args.trace:
            import pyarrow.parquet as pq

            rows = sum(
                pq.read_metadata(os.path.join(d, f)).num_rows
                for d, _, fs in os.walk(path)
                for f in fs
                if f.endswith(".parquet")
            )
        else:
            rows = write_ranks(source_rank(where, args.ranks), path, args.ranks, args.rows)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        ranks = sum(1 for d in os.listdir(path) if d.startswith("rank="))
        print(f"{path}: {ranks} ranks, {rows:,} rows, {size / 2**30:.2f} GiB on disk; each command once, fresh process")
        for label, command in (
            ("baseline DuckDB", [py, "-c", DUCKDB_BASELINE, path]),
            ("rank sections (SQL)", [py, "-c", _RANK_SECTIONS, path]),
            ("memory categories", [py, "-c", _MEMORY, path]),
            ("report --engine sql", [py, "-m", "reports.output.cli", "report", "--engine", "sql", path]),
            ("report --json", [py, "-m", "reports.output.cli", "report", "--engine", "sql", "--json", path]),
        ):
            seconds, rss, out = timed(command)
            print(f"  {label:<20} {seconds:7.2f} s  peak RSS {rss:6.0f} MB", flush=True)
            if label == "rank sections (SQL)":
                print(f"    {out.strip().splitlines()[-1]}")  # DuckDB's progress bar may precede it
    finally:
        if args.keep or args.trace:
            print(f"kept: {where}")
        else:
            shutil.rmtree(where)


if __name__ == "__main__":
    main()
