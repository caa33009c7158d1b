"""Plan before you rent: trace rank 0 of an FSDP2 job of any world size on one CPU.

    python examples/simulate.py --world 64 --layers 4 --d-model 1024 --seq 2048 [--checkpoint] [--tp 8]

torch's fake process group stands in for the other ranks (collectives move no data but
have the right shapes) and FakeTensorMode for the memory (no tensor is allocated), so a
model far larger than this machine traces in seconds. The trace is rank 0's: its FLOPs,
its shards' memory and the exact bytes of every all-gather and reduce-scatter it would
run; `optrace report` prints them per step (no times: nothing ran on a GPU).

`--tp T` adds tensor parallelism: a 2-D mesh of world / T data-parallel by T tensor-parallel
ranks; in each block the attention's qkv and the MLP's fc are column-parallel and the two
output projections row-parallel (torch.distributed.tensor.parallel, Megatron-LM's layout: one
all-reduce of the activations after each row-parallel projection in the forward, one after
each column-parallel one in the backward), and FSDP2 shards over the data-parallel ranks.
With sequence parallelism (the default with --tp, as torchtitan and Megatron-LM run it;
`--no-sequence-parallel` leaves it out) the residual stream between the projections is split
by sequence over the TP ranks (SequenceParallel on the norms: each all-reduce becomes a
reduce-scatter and an all-gather), the token embedding is split by vocabulary and the output
head by vocabulary too, its loss computed on the split logits (torch's loss_parallel).
"""

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
from gpt import GPT, GPTConfig

from reports.output.cli import main as optrace
from tracer import Tracer


def simulate(
    path,
    world,
    cfg,
    batch,
    checkpoint=False,
    steps=1,
    dtype=torch.bfloat16,
    build=GPT,
    blocks="blocks",
    tp=1,
    parallelize=None,
    sequence_parallel=True,
    parallelize_ends=None,
):
    """Trace `steps` AdamW steps of rank 0 of a `world`-rank FSDP2 job (one unit per block) of
    `build(cfg)`, a model whose attribute `blocks` lists its blocks and which takes (tokens, targets).
    `tp` > 1: tensor parallelism of that degree, applied to each block by
    `parallelize(block, tp_mesh, sequence_parallel)` (default `tensor_parallel`, for examples/gpt.py's Block)
    and, with `sequence_parallel`, to the embedding, final norm and head by `parallelize_ends(model, tp_mesh)`
    (default `vocabulary_parallel`, for examples/gpt.py's GPT); the loss then runs under loss_parallel."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if tp < 1 or world % tp:
        raise ValueError(f"simulate: tp must divide the world size {world}, got {tp}")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        # made outside FakeTensorMode: the mesh reads real rank lists
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp")) if tp > 1 else None
        dp = mesh["dp"] if tp > 1 else init_device_mesh("cpu", (world,))
        split = tp > 1 and sequence_parallel
        with FakeTensorMode():
            model = build(cfg)
            policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            if split:
                (parallelize_ends or vocabulary_parallel)(model, mesh["tp"])
            for block in getattr(model, blocks):
                if tp > 1:
                    (parallelize or tensor_parallel)(block, mesh["tp"], sequence_parallel)
                if checkpoint:
                    block.forward = _checkpointed(block.forward)
                # FSDP2 joins the data- and tensor-parallel meshes of a DTensor parameter into one
                # (DeviceMesh._concatenate), whose rank tensor FakeTensorMode refuses as a real input:
                # sharding runs with the mode set aside (the parameters stay fake; no tensor is allocated)
                with unset_fake_temporarily() if tp > 1 else contextlib.nullcontext():
                    fully_shard(block, mesh=dp, mp_policy=policy)
            with unset_fake_temporarily() if split else contextlib.nullcontext():
                fully_shard(model, mesh=dp, mp_policy=policy)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
            g = torch.Generator().manual_seed(0)
            idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
            with Tracer(path, model=model, tokens=batch * cfg.seq_len):
                for _ in range(steps):
                    with _loss_parallel() if split else contextlib.nullcontext():
                        model(idx, idx).backward()
                    opt.step()
                    opt.zero_grad()
    finally:
        dist.destroy_process_group()
    return path


def _loss_parallel():
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def sequence_styles(norms, inputs, rows):
    """The sequence-parallel additions to a block's TP plan (torchtitan's layout): SequenceParallel on each of
    `norms`, each of `inputs` (a module taking the residual stream first, then `inputs[name]` other arguments)
    gathering it by sequence, each row-parallel projection of `rows` reduce-scattering by sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, RowwiseParallel, SequenceParallel

    styles = {name: SequenceParallel() for name in norms}
    for name, extra in inputs.items():
        styles[name] = PrepareModuleInput(
            input_layouts=(Shard(1),) + (None,) * extra, desired_input_layouts=(Replicate(),) + (None,) * extra
        )
    return styles | {name: RowwiseParallel(output_layouts=Shard(1)) for name in rows}


def tensor_parallel(block, mesh, sequence_parallel=False):
    """Megatron-LM's tensor parallelism of an examples/gpt.py Block over `mesh`: qkv and fc split by
    columns (output features), the projections by rows, each rank with n_head / T heads; with
    `sequence_parallel` the norms and the residual stream split by sequence (sequence_styles). NB: the fused
    qkv weight is split in T contiguous row ranges, not q, k and v each (a real run splits each): the
    shapes, FLOPs and bytes are the same."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel()}
    styles |= {"mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    if sequence_parallel:
        styles |= sequence_styles(("ln1", "ln2"), {"attn": 0, "mlp": 0}, ("attn.proj", "mlp.proj"))
    if block.attn.n_head % mesh.size():
        raise ValueError(f"simulate: tp {mesh.size()} must divide the {block.attn.n_head} heads")
    parallelize_module(block, mesh, styles)
    block.attn.n_head //= mesh.size()


def vocabulary_parallel(model, mesh):
    """Megatron-LM's ends of an examples/gpt.py GPT under sequence parallelism over `mesh`: the token embedding
    split by vocabulary (its output all-reduced, the positions' added, then each rank keeps its 1/T of the
    sequence: Megatron-LM's scatter to the sequence-parallel region), the final norm sequence-parallel, the
    head split by vocabulary with its logits left split for loss_parallel; a tied head shares the embedding's
    shard."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tied = model.lm_head.weight is model.wte.weight
    styles = {
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "blocks.0": PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
        ),
        "ln_f": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    parallelize_module(model, mesh, styles)
    if tied:
        model.lm_head.weight = model.wte.weight


def _checkpointed(forward):
    from torch.utils.checkpoint import checkpoint

    return lambda *args: checkpoint(forward, *args, use_reentrant=False)


def default_out(parser, args):
    """runs/simulate.parquet, with each option not at its default in the name (runs/simulate-w8-l2-ck.parquet):
    two runs of different shapes do not write one directory."""
    short = {"world": "w", "tp": "tp", "layers": "l", "d_model": "d", "heads": "h", "seq": "s", "batch": "b"}
    short["vocab"] = "v"
    parts = [
        f"{tag}{getattr(args, name)}" for name, tag in short.items() if getattr(args, name) != parser.get_default(name)
    ]
    parts += ["nosp"] if args.tp > 1 and not getattr(args, "sequence_parallel", True) else []
    return f"runs/{'-'.join(['simulate', *parts, *(['ck'] if args.checkpoint else [])])}.parquet"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=64, help="ranks of the simulated job")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (divides --world and --heads)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank and step")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every block")
    parser.add_argument(
        "--no-sequence-parallel",
        dest="sequence_parallel",
        action="store_false",
        help="with --tp: no sequence parallelism, the embedding and head replicated (default: split)",
    )
    parser.add_argument(
        "--out",
        help="trace directory (default: runs/simulate.parquet, with the options that differ "
        "from their defaults in the name: runs/simulate-w8-l2-ck.parquet)",
    )
    args = parser.parse_args(argv)
    if args.tp < 1 or args.world % args.tp or args.heads % args.tp:
        parser.error(f"--tp {args.tp} must divide --world {args.world} and --heads {args.heads}")
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
    simulate(
        args.out, args.world, cfg, args.batch, args.checkpoint, tp=args.tp, sequence_parallel=args.sequence_parallel
    )
    return optrace(["report", args.out])


if __name__ == "__main__":
    sys.exit(main())
