"""Trace two DDP training steps on every rank, then report the ranks together.

    torchrun --nproc_per_node=2 examples/distributed.py

Each rank writes runs/ddp/rank=R/; rank 0 prints the tables once both are done.
Gloo on the CPU here; the same script runs on GPUs with backend "nccl".
"""

import os

import torch
import torch.distributed as dist

import reports
from tracer import Tracer

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
x = torch.randn(32, 256)  # 32 tokens per rank and step
os.makedirs("runs", exist_ok=True)
with Tracer("runs/ddp", model=ddp, tokens=32):  # the same path on every rank
    for _ in range(2):
        ddp(x).pow(2).mean().backward()  # DDP all-reduces the gradients in the backward
        opt.step()
        opt.zero_grad()
dist.barrier()  # both ranks' traces are complete
if dist.get_rank() == 0:
    df = reports.load("runs/ddp")
    table = reports.breakdown(df)
    print(table[table["phase"] == "forward"][["run", "flops", "expected_flops", "n_params", "tokens"]].to_string(index=False))
    comm = reports.collectives(df)
    print(comm[["rank", "collective", "calls", "comm_bytes", "duration_s", "busbw_bytes_per_s"]].to_string(index=False))
dist.destroy_process_group()
