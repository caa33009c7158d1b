"""Rank 0 of simulated FSDP2 jobs on one CPU: trace time, RSS, peak memory by category, collective bytes.

    .venv/bin/python benchmarks/simulated_jobs.py [--only 70b] [--checkpoint both|on|off]

Each configuration runs in a fresh process (examples/simulate.py's `simulate`: torch's fake
process group and FakeTensorMode, bf16 parameters, fp32 gradient reduction, one FSDP2 unit per
block, AdamW, one step) and prints: wall and CPU seconds of building and tracing, RSS before
and after, the rows, the peak live bytes with its categories, and per step the bytes rank 0's
all-gathers and reduce-scatters send (ring algorithm, reports.distributed.collectives.per_step_traffic).
The models are examples/gpt.py's GPT at Llama-3 sizes (its MLP is 4·d wide with GELU, not
SwiGLU, so N differs from Llama's by a few percent).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {  # name: (world size, GPTConfig fields)
    "70b": (64, dict(vocab_size=128256, seq_len=8192, n_layer=80, n_head=64, d_model=8192)),
    "405b": (256, dict(vocab_size=128256, seq_len=8192, n_layer=126, n_head=128, d_model=16384)),
}


def one(name, checkpoint, path):
    sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
    from gpt import GPTConfig
    from simulate import simulate

    import reports
    from reports.distributed.collectives import per_step_traffic

    world, fields = CONFIGS[name]
    cfg = GPTConfig(**fields, bias=False, attention="sdpa")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    wall, cpu = time.perf_counter(), time.process_time()
    simulate(path, world, cfg, batch=1, checkpoint=checkpoint)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    df = reports.load(path)
    top = reports.peak(df).iloc[0]
    categories = reports.by_category(df)
    traffic = per_step_traffic(df)
    return {
        "model": name,
        "world": world,
        "checkpoint": checkpoint,
        "rows": len(df),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "rss_mib": [round(rss0 / 1024), round(rss1 / 1024)],
        "peak_gib": round(int(top["peak_live_bytes"]) / 2**30, 2),
        "peak_phase": str(top["phase"]),
        "peak_module": str(top["module"]),
        "categories_gib": {r.category: round(int(r.bytes) / 2**30, 2) for r in categories.itertuples()},
        "sent_gib_per_step": {r.collective: round(r.sent_bytes_per_step / 2**30, 2) for r in traffic.itertuples()},
        "calls_per_step": {r.collective: int(r.calls_per_step) for r in traffic.itertuples()},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CONFIGS))
    parser.add_argument("--checkpoint", choices=("both", "on", "off"), default="both")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, checkpoint, path = args.child
        print(json.dumps(one(name, checkpoint == "on", path)))
        return
    names = [args.only] if args.only else list(CONFIGS)
    flags = {"both": ("off", "on"), "on": ("on",), "off": ("off",)}[args.checkpoint]
    for name in names:
        for flag in flags:
            path = f"/tmp/optrace_sim_{name}_{flag}"
            done = subprocess.run(
                [sys.executable, __file__, "--child", name, flag, path],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            print(done.stdout.strip() or done.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
