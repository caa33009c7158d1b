"""Bytes on disk per op for a LLaMA-70B-shaped training step traced on the meta device.

    .venv/bin/python benchmarks/disk_bytes.py [--layers 80] [--steps 1]

The model: `--layers` decoder layers of LLaMA-2-70B's shape (d_model 8192, 64 query
heads and 8 key/value heads of 128, SwiGLU FFN 28672, RMSNorm, vocabulary 32000),
batch 1 x 4096 tokens, AdamW. On the meta device nothing is computed or allocated,
so the full 80 layers cost only the tracing. Prints the trace's parts, rows, bytes
on disk, bytes per op, and how much of each part is Parquet footer metadata (the
run metadata lives there).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tracer import Tracer  # noqa: E402
from tracer.schema import part_paths  # noqa: E402

D_MODEL, N_HEAD, N_KV_HEAD, HEAD_DIM, FFN, VOCAB = 8192, 64, 8, 128, 28672, 32000


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(D_MODEL, N_HEAD * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(D_MODEL, N_KV_HEAD * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(D_MODEL, N_KV_HEAD * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(N_HEAD * HEAD_DIM, D_MODEL, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, N_HEAD, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(b, t, N_KV_HEAD, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, t, N_KV_HEAD, HEAD_DIM).transpose(1, 2)
        rep = N_HEAD // N_KV_HEAD
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, N_HEAD * HEAD_DIM))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(D_MODEL, FFN, bias=False)
        self.up_proj = nn.Linear(D_MODEL, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, D_MODEL, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(D_MODEL)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(D_MODEL)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, D_MODEL)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.norm = RMSNorm(D_MODEL)
        self.lm_head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def trace(path, layers, steps, seq):
    with torch.device("meta"):
        model = Llama(layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.zeros(1, seq, dtype=torch.long, device="meta")
    start = time.perf_counter()
    with Tracer(path, model=model, tokens=seq):
        for _ in range(steps):
            model(idx, idx).backward()
            opt.step()
            opt.zero_grad()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4096)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama70b"
        seconds = trace(path, args.layers, args.steps, args.seq)
        parts = part_paths(path)
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
        total = sum(os.path.getsize(p) for p in parts)
        footer = 0
        for p in parts:
            kv = pq.ParquetFile(p).metadata.metadata or {}
            footer += sum(len(k) + len(v) for k, v in kv.items())
        print(
            f"LLaMA-70B shape, {args.layers} layers, {args.steps} step(s), seq {args.seq}, meta device, torch {torch.__version__}"
        )
        print(f"traced in {seconds:.1f} s: {rows:,} rows in {len(parts)} part(s)")
        print(f"on disk: {total:,} bytes, {total / rows:.1f} bytes per op")
        print(f"key-value metadata in the footers: {footer:,} bytes ({footer / total:.0%} of the trace)")
        for key, value in (pq.ParquetFile(parts[-1]).metadata.metadata or {}).items():
            print(f"  last part's {key.decode()}: {len(value):,} bytes")


if __name__ == "__main__":
    main()
