"""Plan before you rent: trace rank 0 of an FSDP2 job of any world size on one CPU.

    python examples/simulate.py --world 64 --layers 4 --d-model 1024 --seq 2048 [--checkpoint]

torch's fake process group stands in for the other ranks (collectives move no data but
have the right shapes) and FakeTensorMode for the memory (no tensor is allocated), so a
model far larger than this machine traces in seconds. The trace is rank 0's: its FLOPs,
its shards' memory and the exact bytes of every all-gather and reduce-scatter it would
run; `optrace report` prints them per step (no times: nothing ran on a GPU).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from gpt import GPT, GPTConfig

from reports.output.cli import main as optrace
from tracer import Tracer


def simulate(path, world, cfg, batch, checkpoint=False, steps=1, dtype=torch.bfloat16, build=GPT, blocks="blocks"):
    """Trace `steps` AdamW steps of rank 0 of a `world`-rank FSDP2 job (one unit per block) of
    `build(cfg)`, a model whose attribute `blocks` lists its blocks and which takes (tokens, targets)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))  # made outside FakeTensorMode: the mesh reads real rank lists
        with FakeTensorMode():
            model = build(cfg)
            policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            for block in getattr(model, blocks):
                if checkpoint:
                    block.forward = _checkpointed(block.forward)
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
            g = torch.Generator().manual_seed(0)
            idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
            with Tracer(path, model=model, tokens=batch * cfg.seq_len):
                for _ in range(steps):
                    model(idx, idx).backward()
                    opt.step()
                    opt.zero_grad()
    finally:
        dist.destroy_process_group()
    return path


def _checkpointed(forward):
    from torch.utils.checkpoint import checkpoint

    return lambda *args: checkpoint(forward, *args, use_reentrant=False)


def default_out(parser, args):
    """runs/simulate.parquet, with each option not at its default in the name (runs/simulate-w8-l2-ck.parquet):
    two runs of different shapes do not write one directory."""
    short = {"world": "w", "layers": "l", "d_model": "d", "heads": "h", "seq": "s", "batch": "b", "vocab": "v"}
    parts = [
        f"{tag}{getattr(args, name)}" for name, tag in short.items() if getattr(args, name) != parser.get_default(name)
    ]
    return f"runs/{'-'.join(['simulate', *parts, *(['ck'] if args.checkpoint else [])])}.parquet"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=64, help="ranks of the simulated job")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank and step")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every block")
    parser.add_argument(
        "--out",
        help="trace directory (default: runs/simulate.parquet, with the options that differ "
        "from their defaults in the name: runs/simulate-w8-l2-ck.parquet)",
    )
    args = parser.parse_args(argv)
    args.out = args.out or default_out(parser, args)
    cfg = GPTConfig(
        vocab_size=args.vocab,
        seq_len=args.seq,
        n_layer=args.layers,
        n_head=args.heads,
        d_model=args.d_model,
        bias=False,
        attention="sdpa",
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    simulate(args.out, args.world, cfg, args.batch, args.checkpoint)
    return optrace(["report", args.out])


if __name__ == "__main__":
    sys.exit(main())
