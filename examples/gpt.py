"""A small GPT-2-style decoder, and a traced training step of it.

    python examples/gpt.py                       # 3 AdamW steps -> runs/gpt.parquet
    python examples/gpt.py --attention sdpa --dtype bf16 --steps 1   # -> runs/gpt-sdpa-bf16-s1.parquet

The model is written so that the trace reads like the arithmetic of lecture 2:
every weight enters exactly one matmul per token (the Linear layers and the
output head), and with attention="matmul" the attention is two explicit
activation x activation matmuls (q @ k^T and att @ v). Per training step of
T = batch * seq_len tokens, with N the parameters that enter a matmul:

    forward weight matmuls   2 N T     (one multiply-add per weight per token)
    backward weight matmuls  4 N T     (dL/dx = dL/dy @ W and dL/dW = x^T @ dL/dy)
    attention matmuls       12 L d S T (forward 4 L d S T, backward twice that)

`optrace report` compares the traced FLOPs with these; tests/tracer/flops/test_gpt.py asserts
them exactly on a tiny configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import nn

try:
    import tracer  # noqa: F401  (installed with `pip install -e .`)
except ImportError:  # run from a checkout: `python examples/gpt.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ATTENTION = ("matmul", "sdpa")
DTYPES = {"fp32": None, "bf16": torch.bfloat16}


@dataclass
class GPTConfig:
    """Sizes of the model. The defaults trace a step in well under 2 s on a 2-core CPU."""

    vocab_size: int = 512
    seq_len: int = 64
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    bias: bool = True  # biases of the Linear and LayerNorm layers (the output head never has one)
    tie_weights: bool = False  # share the token embedding with the output head
    attention: str = "matmul"  # "matmul": q @ k^T, mask, softmax, @ v; "sdpa": one fused kernel

    def __post_init__(self):
        for field in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{field} must be a positive int, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"GPTConfig.d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")
        if self.attention not in ATTENTION:
            raise ValueError(f"GPTConfig.attention must be one of {ATTENTION}, got {self.attention!r}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.attention = cfg.attention
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        if cfg.attention == "matmul":  # the fused kernel masks by itself (is_causal): no [s, s] buffer to keep
            # True above the diagonal: the future positions a query must not see.
            future = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
            self.register_buffer("future", future, persistent=False)

    def forward(self, x):
        s = x.shape[1]
        q, k, v = rearrange(self.qkv(x), "b s (three h e) -> three b h s e", three=3, h=self.n_head)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # [b, h, s, e] @ [b, h, e, s] -> [b, h, s, s]: 2 * b * h * s * s * e = 2 * b * s * s * d FLOPs
            scores = einsum(q, k, "b h s1 e, b h s2 e -> b h s1 s2") * q.shape[-1] ** -0.5
            scores = scores.masked_fill(self.future[:s, :s], float("-inf"))
            # [b, h, s, s] @ [b, h, s, e] -> [b, h, s, e]: the same 2 * b * s * s * d FLOPs
            y = einsum(scores.softmax(dim=-1), v, "b h s1 s2, b h s2 e -> b h s1 e")
        return self.proj(rearrange(y, "b h s e -> b s (h e)"))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, n_layer pre-norm blocks, final LayerNorm, output head.

    `model(idx)` returns logits [batch, seq, vocab]; `model(idx, targets)` the mean
    cross-entropy loss.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(_init_weights)

    def forward(self, idx, targets=None):
        s = idx.shape[1]
        if s > self.cfg.seq_len:
            raise ValueError(f"sequence of {s} tokens is longer than GPTConfig.seq_len={self.cfg.seq_len}")
        x = self.wte(idx) + self.wpe(torch.arange(s, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(rearrange(logits, "b s v -> (b s) v"), rearrange(targets, "b s -> (b s)"))


def _init_weights(module):
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def make_batch(cfg: GPTConfig, batch: int, seed: int = 0):
    """Random token ids `idx` [batch, seq_len] and next-token `targets` (idx shifted by one)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def train_step(model, opt, idx, targets, dtype=None):
    """One step: forward (under autocast when `dtype` is given), backward, optimizer step.

    Returns the loss tensor (call `.item()` outside a trace: it is one more op).
    """
    autocast = torch.autocast(idx.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with autocast:
        loss = model(idx, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def make_optimizer(model):
    """AdamW with the foreach kernels (CPU defaults to a per-parameter loop)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)


def matmul_params(df, meta):
    """Parameters that enter a matmul as a multiplied operand: the weight matrices.

    Biases are left out (addmm adds them: no FLOPs in its formula), and so are the
    embeddings (lookups). Under autocast a matmul reads a cast copy of the weight
    (`aten._to_copy` of the parameter's storage), which counts as the weight.
    """
    params = {p["storage_id"]: name for name, p in meta["parameters"].items() if len(p["shape"]) >= 2}
    copies = df[df["op"] == "aten._to_copy.default"]
    for ins, outs in zip(copies["input_storage_ids"], copies["output_storage_ids"]):
        if len(ins) > 0 and int(ins[0]) in params:
            params.setdefault(int(outs[0]), params[int(ins[0])])
    seen = set()
    for ids in df.loc[df["flop_kind"] == "matmul", "input_storage_ids"]:
        seen.update(int(i) for i in ids)
    names = {name for sid, name in params.items() if sid in seen}
    return {name: p for name, p in meta["parameters"].items() if name in names}


def default_out(parser, args):
    """runs/gpt.parquet, with each option that changes the trace and is not at its default in the name
    (runs/gpt-sdpa-bf16-b2.parquet): two runs of different options do not write one directory."""
    parts = [
        f"{value}" if name in ("attention", "dtype") else f"{name[0]}{value}"
        for name in ("attention", "dtype", "batch", "steps")
        if (value := getattr(args, name)) != parser.get_default(name)
    ]
    return f"runs/{'-'.join(['gpt', *parts])}.parquet"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        help="trace directory (default: runs/gpt.parquet, with the options that differ "
        "from their defaults in the name: runs/gpt-sdpa-bf16.parquet)",
    )
    parser.add_argument("--steps", type=int, default=3, help="training steps to trace (default: %(default)s)")
    parser.add_argument("--attention", choices=ATTENTION, default="matmul")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32", help="bf16: CPU autocast")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--export", metavar="OUT.json", help="also write the trace for Perfetto (optrace export)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1:
        parser.error(f"--steps and --batch must be at least 1, got {args.steps} and {args.batch}")
    args.out = args.out or default_out(parser, args)

    from reports.output.cli import main as optrace
    from tracer import Tracer, matmul_ceiling, memory_bandwidth, time_step

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = GPTConfig(attention=args.attention)
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, args.batch)
    run_name = f"gpt-{args.attention}-{args.dtype}-b{args.batch}"
    with Tracer(args.out, model=model, tokens=args.batch * cfg.seq_len, run_name=run_name) as tr:
        losses = [train_step(model, opt, idx, targets, DTYPES[args.dtype]) for _ in range(args.steps)]
    print(f"loss per step: {', '.join(f'{loss.item():.4f}' for loss in losses)}")
    # MFU needs the untraced step time and, on a CPU, the matmul ceiling of this machine
    tr.set_step_time(time_step(lambda: train_step(model, opt, idx, targets, DTYPES[args.dtype]), warmup=2, repeats=5))
    tr.set_ceiling(matmul_ceiling("cpu", DTYPES[args.dtype] or torch.float32, n=1024))
    tr.set_bandwidth(memory_bandwidth("cpu"))  # the roofline's memory roof on a CPU
    optrace(["report", args.out, "--full"])  # every section: explain's terms and the roofline are this example's point
    if args.export:
        optrace(["export", args.out, "-o", args.export])


if __name__ == "__main__":
    main()
