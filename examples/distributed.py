"""Trace two DDP training steps on every rank, then report the ranks together.

    torchrun --nproc_per_node=2 examples/distributed.py

Each rank writes runs/ddp/rank=R/; rank 0 prints the tables once both are done.
Gloo on the CPU here; the same script runs on GPUs with backend "nccl".
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

try:
    import tracer  # noqa: F401
except ImportError:  # run from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reports  # noqa: E402
from tracer import Tracer  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="run it under torchrun (--nproc_per_node=2 for the README's tables)"
    )
    parser.add_argument(
        "--out", default="runs/ddp", help="trace directory, one rank=R directory in it per rank (default: %(default)s)"
    )
    parser.add_argument("--steps", type=int, default=2, help="training steps to trace (default: %(default)s)")
    parser.add_argument("--backend", default="gloo", help="process group backend (default: %(default)s; GPUs: nccl)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error(
            "no process group to join (RANK is not set): run it under torchrun, e.g. "
            "torchrun --nproc_per_node=2 examples/distributed.py"
        )
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    x = torch.randn(32, 256)  # 32 tokens per rank and step
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with Tracer(args.out, model=ddp, tokens=32):  # the same path on every rank
        for _ in range(args.steps):
            ddp(x).pow(2).mean().backward()  # DDP all-reduces the gradients in the backward
            opt.step()
            opt.zero_grad()
    dist.barrier()  # both ranks' traces are complete
    if dist.get_rank() == 0:
        df = reports.load(args.out)
        table = reports.breakdown(df)
        print(
            table[table["phase"] == "forward"][["run", "flops", "expected_flops", "n_params", "tokens"]].to_string(
                index=False
            )
        )
        comm = reports.collectives(df)
        print(
            comm[["rank", "collective", "calls", "comm_bytes", "duration_s", "busbw_bytes_per_s"]].to_string(
                index=False
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
