"""Plan Llama-3-shaped training runs before renting GPUs: trace rank 0 of an FSDP2 job on this CPU, then plan it.

    python examples/plan_llama.py --model 8b --world 8 --gpu H100            # Llama-3-8B on 8 H100s
    python examples/plan_llama.py --model 70b --world 64 --gpu H100 --checkpoint
    python examples/plan_llama.py --model tiny --world 8 --gpu H100 --json   # seconds: the tests run this

The model is a small Llama-like module written here (RMSNorm, rotary embeddings, grouped-query
attention through one fused scaled_dot_product_attention with K and V repeated to the query
heads, a SwiGLU MLP, an untied output head) at Llama 3's published shapes. One AdamW step of
rank 0 is traced as examples/simulate.py does: torch's fake process group stands in for the
other ranks, FakeTensorMode for the memory; FSDP2 shards each block (bf16 parameters for the
compute, fp32 master weights and gradient reduction, as torchtitan runs it). `--checkpoint`
checkpoints every block (torchtitan's "full" activation checkpointing).
"""

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # simulate.py beside this file

from simulate import simulate  # noqa: E402

from reports.output.cli import main as optrace  # noqa: E402


@dataclass
class LlamaConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int = 128256
    seq_len: int = 8192


# Llama 3 shapes (Meta's model cards and params.json: 8B d 4096, 32 layers, 32 heads, 8 KV heads,
# FFN 14336; 70B d 8192, 80 layers, 64 heads, 8 KV heads, FFN 28672; vocabulary 128,256)
MODELS = {
    "8b": LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336),
    "70b": LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672),
    "tiny": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256, seq_len=32),
}


class RMSNorm(nn.Module):
    """F.rms_norm, as torchtitan's nn.RMSNorm: one fused kernel on CUDA, keeping rstd where the same math written
    out keeps an [N, D] product per norm; the trace runs it as that kernel (tracer.recording.meta_fused)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotary(x, cos, sin):
    """Rotate pairs of x [b, s, h, hd] by the position's angles (cos, sin [s, hd])."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = rotary(self.wq(x).view(b, s, self.heads, self.head_dim), cos, sin)
        k = rotary(self.wk(x).view(b, s, self.kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim)
        repeat = self.heads // self.kv_heads  # K and V repeated to the query heads, as torchtitan's repeat_kv
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(cfg.dim), Attention(cfg)
        self.ffn_norm, self.feed_forward = RMSNorm(cfg.dim), FeedForward(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        head_dim = cfg.dim // cfg.n_heads
        angles = torch.outer(
            torch.arange(cfg.seq_len).float(), 500000.0 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
        )  # rope theta 500,000
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((angles.sin(), angles.sin()), -1), persistent=False)

    def forward(self, tokens, targets):
        h = self.tok_embeddings(tokens)
        cos, sin = self.cos.to(h.dtype), self.sin.to(h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def trace(path, cfg, world, batch, checkpoint=False):
    """Trace one AdamW step of rank 0 of a `world`-rank FSDP2 job of `cfg` with `batch` sequences per rank
    (examples/simulate.py, with this file's Llama)."""
    return simulate(path, world, cfg, batch, checkpoint, build=Llama, blocks="layers")


def tensor_parallel(block, mesh, sequence_parallel=False):
    """Megatron-LM's tensor parallelism of a Block over `mesh` (torchtitan's layout): wq, wk, wv and w1, w3 split
    by columns, wo and w2 by rows, each rank with n_heads / T query heads and n_kv_heads / T key-value heads;
    with `sequence_parallel` the norms and the residual stream split by sequence (simulate.sequence_styles)."""
    from simulate import sequence_styles
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    attn, t = block.attention, mesh.size()
    if attn.heads % t or attn.kv_heads % t:
        raise ValueError(f"tensor_parallel: tp {t} must divide the {attn.heads} heads and {attn.kv_heads} KV heads")
    styles = {f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")} | {"attention.wo": RowwiseParallel()}
    styles |= {"feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel()}
    styles |= {"feed_forward.w2": RowwiseParallel()}
    if sequence_parallel:
        norms, inputs = ("attention_norm", "ffn_norm"), {"attention": 2, "feed_forward": 0}
        styles |= sequence_styles(norms, inputs, ("attention.wo", "feed_forward.w2"))
    parallelize_module(block, mesh, styles)
    attn.heads, attn.kv_heads = attn.heads // t, attn.kv_heads // t


def vocabulary_parallel(model, mesh):
    """torchtitan's ends of a Llama under sequence parallelism over `mesh`: the token embedding split by
    vocabulary, its output reduce-scattered by sequence; the final norm sequence-parallel; the output head split
    by vocabulary with its logits left split for loss_parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    styles = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    parallelize_module(model, mesh, styles)


def default_out(args):
    """The trace directory of a run without --out: every option that changes the trace is in its name, so that two
    runs of different shapes do not write one directory (--gpu and --gpus-per-node change only the plan)."""
    seq = f"-s{args.seq}" if args.seq else ""
    return f"runs/llama-{args.model}-w{args.world}-b{args.batch}{seq}{'-ck' if args.checkpoint else ''}.parquet"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="8b")
    parser.add_argument("--world", type=int, default=8, help="ranks of the FSDP2 job")
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank")
    parser.add_argument("--seq", type=int, help="tokens per sequence (default: 8,192; tiny: 32)")
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint every block")
    parser.add_argument("--gpu", default="H100 SXM")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--out",
        default=None,
        help="trace directory (default: runs/llama-<model>-w<world>-b<batch>[-s<seq>][-ck].parquet)",
    )
    args = parser.parse_args(argv)
    cfg = MODELS[args.model]
    if args.seq:
        cfg = LlamaConfig(**{**cfg.__dict__, "seq_len": args.seq})
    out = args.out or default_out(args)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    trace(out, cfg, args.world, args.batch, args.checkpoint)
    plan = ["plan", out, "--gpu", args.gpu, "--gpus-per-node", str(args.gpus_per_node)]
    return optrace(plan + (["--json"] if args.json else []))


if __name__ == "__main__":
    sys.exit(main())
