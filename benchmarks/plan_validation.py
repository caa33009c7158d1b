"""`optrace plan` against published training runs: for each, its model at the published config traced as
rank 0 on this CPU (FakeTensorMode, torch's fake process group: examples/simulate.py), planned on the
published GPU, beside the published tokens/s per GPU.

    .venv/bin/python benchmarks/plan_validation.py                 # every run: about 35 min on a loaded 2-core machine
    .venv/bin/python benchmarks/plan_validation.py --only mpt-125m-a100
    .venv/bin/python benchmarks/plan_validation.py --write docs/planning.md   # the table of the docs page
    .venv/bin/python benchmarks/plan_validation.py --traces DIR    # keep the traces: planning again < 1 min

Each run is traced at its published model, sequence length, world size, tensor-parallel degree and
activation checkpointing, at micro-batch 1, and planned at the published micro-batch (reports.plan's
linear extrapolation: FLOPs and activation bytes grow with it, parameters and collectives stay) and
pipeline stages and micro-batches per step (reports.plan's pp). Every published figure cites where it
is published (RUNS: source, table). A run the plan cannot express is listed with status "pending",
never planned with another configuration.

The default matmul_stack of A100s and Hoppers (reports.plan.assumptions BY_GENERATION) is fitted on these
runs, so the default plan is in-sample; each run is also planned leave-one-out, at the median of the fits of
the other runs of its generation (and, in the summary, of its generation's other sources), the figure to judge.

MEMORY_RUNS are the memory rows: runs published as out of memory (and runs of the same sources that ran),
planned at their published configuration for the fit verdict alone, in a second table with the count of
verdicts that agree: every run published as running should fit, every run published as out of memory not.

Per run it prints the published figure, the plan's, the error (plan / published - 1) and, past 10%,
the term responsible: the largest term of the planned step (time bound by matmuls, attention,
vector ops, memory, kernel launches, or exposed communication) and what the published step implies
for it (for matmuls: the efficiency that would close the gap). That is an attribution to the largest
term, not a measurement of which term is wrong.
"""

import argparse
import datetime
import functools
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

LLM_FOUNDRY = (
    "MosaicML llm-foundry, scripts/train/benchmarking/README.md (github.com/mosaicml/llm-foundry), "
    "table {table}: MPT {size}, seq {seq}, {gpus} GPUs, micro-batch {mb}, {ac}"
)
TORCHTITAN = "torchtitan docs/performance.md (github.com/pytorch/torchtitan), {table}"
FMS = "IBM fms-fsdp README.md (github.com/foundation-model-stack/fms-fsdp), throughput table: {what}"
MEGATRON = "Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM' "


@dataclass(frozen=True)
class Model:
    """What is traced: a family ("mpt": examples/gpt.py's GPT as MPT; "gpt": the same GPT with biases, as
    Megatron-LM's; "llama": examples/plan_llama.py's Llama), its fields, the world size, the activation
    checkpointing ("none", "full": every block, "every-2nd", "selective-op": torchtitan's op-level policy,
    _selective_op) and the tensor-parallel degree (simulate's `tp`)."""

    family: str
    fields: tuple
    world: int
    checkpoint: str = "none"
    replicate: int = 1  # HSDP: sharded over world / replicate ranks, replicated over `replicate` groups
    tp: int = 1
    sequence_parallel: bool = True  # with tp > 1: simulate's sequence parallelism and vocabulary-parallel ends
    sharding: str = "fsdp"  # "fsdp": simulate's FSDP2; "none": one GPU, float32, no process group
    precision: str = "bf16"  # FSDP2's parameter dtype: "bf16" (MixedPrecisionPolicy) or "fp32" (none)

    @property
    def key(self):
        f = dict(self.fields)
        return (
            f"{self.family}-d{f.get('d_model', f.get('dim'))}-l{f.get('n_layer', f.get('n_layers'))}"
            + (
                f"-s{f['seq_len']}-w{self.world}-{self.checkpoint}"
                + (f"-r{self.replicate}" if self.replicate > 1 else "")
            )
            + (f"-tp{self.tp}" if self.tp > 1 else "")
            + ("-sp" if self.tp > 1 and self.sequence_parallel else "")
            + ("" if self.sharding == "fsdp" else "-unsharded")
            + ("-fp32" if self.sharding == "fsdp" and self.precision == "fp32" else "")
        )


@dataclass(frozen=True)
class Run:
    name: str
    source: str
    gpu: str  # the catalogue's name of the published GPU (tracer.devices)
    model: Model
    micro_batch: int
    published: float | None  # tokens/s per GPU, as published; None for a run published as out of memory
    published_mfu: float | None = None  # percent, as published (its own convention)
    note: str = ""
    status: str = ""  # "" or "pending: <what the plan lacks>"
    pp: int = 1  # pipeline stages planned (reports.plan's pp), with `micro_batches` per step and `schedule`
    micro_batches: int = 1
    schedule: str = "1f1b"
    extra: dict = field(default_factory=dict, compare=False)
    oom: bool = False  # published as out of memory: a memory row, planned for its verdict only


def mpt(d, heads, layers, seq, world, checkpoint="none"):
    # MPT yamls (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): vocab 50,368, expansion 4, no biases,
    # tied embeddings; the benchmark's parameter counts grow with the sequence by seq x d: learned positions
    fields = dict(vocab_size=50368, seq_len=seq, n_layer=layers, n_head=heads, d_model=d)
    return Model("mpt", tuple(sorted(fields.items())), world, checkpoint)


def llama(dim, layers, heads, kv, ffn, vocab, seq, world, checkpoint="none", replicate=1, tp=1):
    fields = dict(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv, ffn_dim=ffn, vocab_size=vocab, seq_len=seq)
    return Model("llama", tuple(sorted(fields.items())), world, checkpoint, replicate, tp)


def megatron_gpt(d, heads, layers, world, tp):
    # Narayanan et al. 2021, section 5.1: GPT models, vocabulary 51,200, sequence 2,048; Megatron-LM's GPT has
    # biases, learned positions, MLP 4 d and the word embedding shared with the output layer; the paper's FLOP
    # count (its equation 3) assumes activation recomputation: every block checkpointed
    fields = dict(vocab_size=51200, seq_len=2048, n_layer=layers, n_head=heads, d_model=d)
    return Model("gpt", tuple(sorted(fields.items())), world, "full", tp=tp)


def megatron_tokens(tflops, d, layers, seq=2048, vocab=51200):
    """Tokens/s per GPU of a published per-GPU TFLOP/s of Narayanan et al. 2021 (its equation 3: an iteration of
    B sequences does 96 B s l h^2 (1 + s / 6h + V / 16lh) FLOPs, recomputation counted)."""
    return tflops * 1e12 / (96 * layers * d**2 * (1 + seq / (6 * d) + vocab / (16 * layers * d)))


def _foundry(size, model, mb, gpu, published, mfu, table, ac="no activation checkpointing"):
    f = dict(model.fields)
    return Run(
        f"mpt-{size}-{'h100' if 'H100' in gpu else 'a100'}" + ("" if f["seq_len"] == 2048 else f"-s{f['seq_len']}"),
        LLM_FOUNDRY.format(table=table, size=size, seq=f["seq_len"], gpus=model.world, mb=mb, ac=ac),
        gpu,
        model,
        mb,
        published,
        mfu,
        note="FSDP FULL_SHARD, amp_bf16",
    )


H100_BF16, A100_80 = "'H100 80GB BF16'", "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'"
MPT_1B, MPT_3B_4K = mpt(2048, 16, 24, 2048, 8), mpt(2560, 20, 32, 4096, 8)
MPT_7B, MPT_13B = mpt(4096, 32, 32, 2048, 8), mpt(5120, 40, 40, 2048, 8)
MPT_125M = mpt(768, 12, 12, 2048, 8)
MPT_30B_AC = mpt(7168, 56, 48, 2048, 8, "full")
# Llama 3 (Meta's params.json: 8B d 4096, 32 layers, 32 heads, 8 KV heads, FFN 14,336; 70B d 8192, 80 layers,
# 64 heads, 8 KV heads, FFN 28,672; vocabulary 128,256); Llama 2 (its paper, Table 1 and the HF configs: 7B d 4096,
# 32 layers, 32 heads, FFN 11,008; 13B d 5120, 40 layers, 40 heads, FFN 13,824; 70B d 8192, 80 layers, 64 heads,
# 8 KV heads, FFN 28,672; vocabulary 32,000)
LLAMA3_8B_SEL = llama(4096, 32, 32, 8, 14336, 128256, 8192, 64, "every-2nd")
LLAMA31_8B_SEL_W8 = llama(4096, 32, 32, 8, 14336, 128256, 8192, 8, "every-2nd")
LLAMA3_70B_FULL = llama(8192, 80, 64, 8, 28672, 128256, 8192, 64, "full")
LLAMA2_7B = llama(4096, 32, 32, 32, 11008, 32000, 4096, 128, replicate=16)  # HSDP: 8 per node x 16 nodes
LLAMA2_13B = llama(5120, 40, 40, 40, 13824, 32000, 4096, 128, replicate=16)
LLAMA2_70B_FULL = llama(8192, 80, 64, 8, 28672, 32000, 4096, 128, "full")

RUNS = [
    _foundry("125m", MPT_125M, 40, "A100 80GB SXM", 142830, 44.79, A100_80),
    _foundry("1b", MPT_1B, 14, "H100 SXM", 45455, 41.82, H100_BF16),
    _foundry("1b", MPT_1B, 14, "A100 80GB SXM", 20513, 59.86, A100_80),
    _foundry("3b", MPT_3B_4K, 5, "H100 SXM", 20964, 42.31, H100_BF16),
    _foundry("3b", MPT_3B_4K, 5, "A100 80GB SXM", 9457, 60.53, A100_80),
    _foundry("7b", MPT_7B, 6, "H100 SXM", 10643, 46.44, H100_BF16),
    _foundry("7b", MPT_7B, 6, "A100 80GB SXM", 4641, 64.23, A100_80),
    _foundry("13b", MPT_13B, 2, "H100 SXM", 4792, 39.79, H100_BF16),
    _foundry("13b", MPT_13B, 2, "A100 80GB SXM", 2262, 59.57, A100_80),
    _foundry("30b", MPT_30B_AC, 3, "H100 SXM", 2002, 38.11, H100_BF16, "activation checkpointing"),
    _foundry("30b", MPT_30B_AC, 3, "A100 80GB SXM", 916, 55.3, A100_80, "activation checkpointing"),
    Run(
        "llama3-8b-a100",
        TORCHTITAN.format(table="'Llama 3 performance numbers' (64 A100 80GB, FSDP2): 8B, batch 1, selective layer AC")
        + " (2024 version)",
        "A100 80GB SXM",
        LLAMA3_8B_SEL,
        1,
        2904,
        56.8,
        note="selective layer AC traced as every 2nd block checkpointed (torchtitan's ac_freq 2)",
    ),
    Run(
        "llama3-70b-a100",
        TORCHTITAN.format(table="'Llama 3 performance numbers' (64 A100 80GB, FSDP2): 70B, batch 1, full AC")
        + " (2024 version)",
        "A100 80GB SXM",
        LLAMA3_70B_FULL,
        1,
        331,
        51.7,
    ),
    Run(
        "llama3.1-8b-h100-500w",
        TORCHTITAN.format(
            table="Table 1: 1D parallelism (FSDP), Llama 3.1 8B, 8 GPUs, local batch 2, selective AC, row FSDP"
        )
        + " (2025 version)",
        "H100 SXM 96GB",
        LLAMA31_8B_SEL_W8,
        2,
        5762,
        note="its H100s: 96 GB HBM2e, 2.4 TB/s, 500 W power limit (the catalogue's H100 SXM 96GB; peak unpublished, "
        "the SXM's assumed); selective AC traced as every 2nd block checkpointed",
    ),
    Run(
        "llama2-7b-a100",
        FMS.format(what="7b, 128 x A100, HSDP, no AC, batch 2 (seq 4,096: fms_fsdp/config/training.py)"),
        "A100 80GB SXM",
        LLAMA2_7B,
        2,
        3760,
        note="HSDP traced on a 16 x 8 mesh (sharded within a node, gradients all-reduced across 16); the README "
        "says A100 (80GB assumed) and no network (the catalogue's 200 Gb/s per GPU assumed)",
    ),
    Run(
        "llama2-13b-a100",
        FMS.format(what="13b, 128 x A100, HSDP, no AC, batch 1 (seq 4,096)"),
        "A100 80GB SXM",
        LLAMA2_13B,
        1,
        1700,
        note="HSDP as the 7b's",
    ),
    Run(
        "llama2-70b-a100",
        FMS.format(what="70b, 128 x A100, FSDP, AC, batch 6 (seq 4,096)"),
        "A100 80GB SXM",
        LLAMA2_70B_FULL,
        6,
        380,
        note="the README says A100, its 80GB variant assumed",
    ),
    Run(
        "llama3.1-405b-h100-tp8",
        TORCHTITAN.format(
            table="'Llama 3.1 performance numbers': 405B on 128 H100 (94GB), FSDP 16 x TP 8, batch 2, "
            "full AC, no Float8"
        )
        + " (2024 version)",
        "H100 SXM 96GB",
        llama(16384, 126, 128, 8, 53248, 128256, 8192, 128, "full", tp=8),
        2,
        109,
        29.0,
        note="its H100s have 94 GB; planned on the catalogue's H100 SXM 96GB (the 500 W HBM2e part of the page's "
        "2025 version, assumed the same hosts); TP traced with torchtitan's sequence parallelism and "
        "vocabulary-parallel ends (examples/plan_llama.py tensor_parallel, vocabulary_parallel): a rank keeps 1/8 "
        "of each checkpointed block's input, 2 x 8,192 x 16,384 x 2 bytes / 8 = 64 MiB x 126 blocks = 7.9 GiB "
        "(without sequence parallelism 63 GiB, and the plan said NO, 149.0 GiB)",
    ),
    Run(
        "megatron-1t-a100-tp-pp",
        MEGATRON + "(SC21, arXiv:2104.04473), abstract and Table 1: 1T parameters on 3,072 A100 at 502 PFLOP/s, "
        "163 TFLOP/s per GPU (52% of peak), tensor and pipeline parallel",
        "A100 80GB SXM",
        megatron_gpt(25600, 160, 128, 8, 8),
        1,
        megatron_tokens(163, 25600, 128),
        52.0,
        note="published as 163 TFLOP/s per GPU: 163e12 / (96 x 128 x 25,600^2 x (1 + 2,048 / 153,600 + 51,200 / "
        "(16 x 128 x 25,600))) = 20.0 tokens/s (its equation 3); TP 8 x PP 64 x DP 6, global batch 3,072 (Table 1): "
        "512 micro-batches of 1 per step, micro-batch 1 and the 1F1B schedule assumed (not in Table 1); traced as "
        "one TP group of 8 (DP 1: Megatron-LM's data parallelism is one gradient all-reduce per step, not planned); "
        "TP traced with sequence parallelism and the embedding and head split by vocabulary, as Megatron-LM's "
        "(examples/simulate.py tensor_parallel, vocabulary_parallel; without them the plan said NO, 92.8 GiB); "
        "the 52% counts the recomputation's FLOPs, the plan's MFU does not",
        pp=64,
        micro_batches=512,
    ),
]

HF_FSDP = (
    "Hugging Face blog 'Accelerate Large Model Training using PyTorch Fully Sharded Data Parallel' (2022-04-29, "
    "github.com/huggingface/blog pytorch-fsdp.md), {table}"
)


def gpt2_xl(seq, world=1):
    # GPT-2 XL (1.5B): d 1,600, 48 layers, 25 heads, vocabulary 50,257, biases, learned positions, tied head: the
    # "gpt" family; positions traced at `seq` (GPT-2's table has 1,024: 1,012 x 1,600 parameters fewer). One GPU:
    # unsharded float32; more: FSDP2 in float32 (the blog's mixed_precision 'no')
    fields = dict(vocab_size=50257, seq_len=seq, n_layer=48, n_head=25, d_model=1600)
    if world == 1:
        return Model("gpt", tuple(sorted(fields.items())), 1, sharding="none")
    return Model("gpt", tuple(sorted(fields.items())), world, precision="fp32")


# Memory rows: runs published as out of memory (oom=True), each planned at its published configuration for the
# verdict alone, and runs published as running beside them (the same trace at a micro-batch that ran). Their
# throughput is not in RUNS' table (an out-of-memory run has none) and no matmul_stack is fitted on them.
MEMORY_RUNS = [
    Run(
        "llama3.1-405b-h100-fsdp-oom",
        TORCHTITAN.format(
            table="'Llama 3.1 performance numbers': 405B on 128 H100 (94GB), 'We do see OOM for 1D parallelism "
            "(FSDP2), so we only tested 2D parallelism (FSDP2 + Tensor Parallel)'"
        )
        + " (2024 version)",
        "H100 SXM 96GB",
        llama(16384, 126, 128, 8, 53248, 128256, 8192, 128, "full"),
        2,
        None,
        oom=True,
        note="the page prints no configuration for the 1D attempt: the 2D table's local batch 2, full AC and "
        "sequence 8,192 assumed, FSDP2 over all 128 ranks; planned on the catalogue's H100 SXM 96GB as the 2D row",
    ),
    Run(
        "llama2-70b-a100-selective-op-b1",
        TORCHTITAN.format(table="'Llama 2 performance numbers' (64 A100 80GB, FSDP2): 70B, batch 1, selective op AC")
        + " (2024 version)",
        "A100 80GB SXM",
        llama(8192, 80, 64, 8, 28672, 32000, 4096, 64, "selective-op"),
        1,
        None,
        note="ran (355 WPS, 50.8% MFU; a memory row only: no matmul_stack fitted on it); Llama 2 70B at "
        "torchtitan's sequence 4,096; selective op AC traced with torchtitan's policy (_selective_op)",
    ),
    Run(
        "llama2-70b-a100-selective-op-b2-oom",
        TORCHTITAN.format(
            table="'Llama 2 performance numbers' (64 A100 80GB, FSDP2), footnote 1: 'the 70B training with local "
            "batch size 2 will cause an OOM error when selective activation checkpointing is used'"
        )
        + " (2024 version)",
        "A100 80GB SXM",
        llama(8192, 80, 64, 8, 28672, 32000, 4096, 64, "selective-op"),
        2,
        None,
        oom=True,
        note="the batch 1 row's trace planned at micro-batch 2; the footnote's selective AC read as the row's op "
        "option (the layer option is not named)",
    ),
    Run(
        "gpt2-xl-titan-rtx-1gpu-oom",
        HF_FSDP.format(
            table="Table 2: GPT-2 XL (1.5B), DDP, batch 1, 1 GPU: 'OOM Error RuntimeError: CUDA out of memory' "
            "(2 x 24GB Titan RTX, mixed_precision 'no', block_size 12)"
        ),
        "TITAN RTX",
        gpt2_xl(12),
        1,
        None,
        oom=True,
        note="DDP on one GPU traced as plain float32 training (AdamW) of one process; sequence 12 as the "
        "command's --block_size prints it",
    ),
    Run(
        "gpt2-xl-titan-rtx-fsdp-2gpu-b5",
        HF_FSDP.format(
            table="Table 2: GPT-2 XL (1.5B), 'FSDP with min_num_params = 2K', batch size max 5, 2 GPUs: ran "
            "(0.6 hours; 2 x 24GB Titan RTX, FULL_SHARD, mixed_precision 'no', block_size 12)"
        ),
        "TITAN RTX",
        gpt2_xl(12, world=2),
        5,
        None,
        note="FSDP (FULL_SHARD, a unit per module of 2K parameters or more) traced as FSDP2 with a unit per block, "
        "in float32; 'batch size max' is the largest that ran, by the blog's method (lower it until no OOM), "
        "which implies that 6 did not: not stated, so not a row; the plan fits up to 9 (a lower bound: 187 "
        "were the weight-sized gradient temporaries of the backward fixed, see reports.plan.fit)",
    ),
]

_CLASS_WORDS = {
    "matmul": "matmul-bound",
    "attention": "attention-bound",
    "vector": "vector-bound",
    "memory": "memory-bound",
}


def _build(model):
    """(build(cfg), cfg, blocks attribute) for simulate()."""
    f = dict(model.fields)
    if model.family in ("mpt", "gpt"):
        from gpt import GPT, GPTConfig

        cfg = GPTConfig(**f, bias=model.family == "gpt", tie_weights=True, attention="sdpa")
        build, blocks = GPT, "blocks"
    else:
        from plan_llama import Llama, LlamaConfig

        cfg = LlamaConfig(**{k: v for k, v in f.items()})
        build, blocks = Llama, "layers"
    if model.checkpoint == "selective-op":
        return _selective_op(build), cfg, blocks
    if model.checkpoint != "every-2nd":
        return build, cfg, blocks

    from torch.utils.checkpoint import checkpoint

    def every_second(c):
        m = build(c)
        for i, block in enumerate(getattr(m, blocks)):
            if i % 2 == 0:
                block.forward = (lambda fwd: lambda *a: checkpoint(fwd, *a, use_reentrant=False))(block.forward)
        return m

    return every_second, cfg, blocks


def _selective_op(build):
    """`build` with every block under torchtitan's selective op activation checkpointing (torchtitan
    torchtitan/parallelisms/parallelize_llama.py, 2024: `_apply_ac_to_transformer_block` with
    selective_ac_option "op"): each block's outputs of mm, the fused attention kernels and reduce-scatter are
    saved, except every second mm; everything else is recomputed in backward. On this CPU the fused attention
    runs as aten._scaled_dot_product_flash_attention_for_cpu, saved as the CUDA flash kernel would be."""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
    }

    def context():
        meta = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == aten.mm.default:
                meta[key] += 1
            keep = func in save and not (func == aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    def selective(c):
        m = build(c)
        for block in m.layers:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False, context_fn=context)
        return m

    return selective


def trace(model, path):
    """Trace one AdamW step of rank 0 of `model` at micro-batch 1 into `path`; returns the seconds it took."""
    from simulate import simulate

    build, cfg, blocks = _build(model)
    start = time.perf_counter()
    if model.sharding == "none":
        _one_gpu(str(path), cfg, build)
    elif model.replicate > 1:
        _hsdp(str(path), model, cfg, build, blocks)
    else:
        from plan_llama import tensor_parallel, vocabulary_parallel

        llama = model.family == "llama"  # else simulate's defaults, for GPT's blocks and ends
        import torch

        dtype = torch.float32 if model.precision == "fp32" else torch.bfloat16
        simulate(str(path), model.world, cfg, 1, model.checkpoint == "full", dtype=dtype, build=build,
                 blocks=blocks, tp=model.tp, parallelize=tensor_parallel if llama else None,
                 sequence_parallel=model.sequence_parallel,
                 parallelize_ends=vocabulary_parallel if llama else None)  # fmt: skip
    return time.perf_counter() - start


def _one_gpu(path, cfg, build):
    """One AdamW step of `build(cfg)` on one GPU in float32, no process group, under FakeTensorMode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tracer import Tracer

    with FakeTensorMode():
        m = build(cfg)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
        idx = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len), generator=torch.Generator().manual_seed(0))
        with Tracer(path, model=m, tokens=cfg.seq_len):
            m(idx, idx).backward()
            opt.step()
            opt.zero_grad()


def _hsdp(path, model, cfg, build, blocks):
    """examples/simulate.py's simulate on a 2-D mesh (replicate x shard): FSDP2's HSDP."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tracer import Tracer

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=model.world)
    try:
        shape = (model.replicate, model.world // model.replicate)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        with FakeTensorMode():
            m = build(cfg)
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in getattr(m, blocks):
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(m, mesh=mesh, mp_policy=policy)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
            idx = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len), generator=torch.Generator().manual_seed(0))
            with Tracer(path, model=m, tokens=cfg.seq_len):
                m(idx, idx).backward()
                opt.step()
                opt.zero_grad()
    finally:
        dist.destroy_process_group()


def plan_run(run, df, assumptions=None):
    """The plan of `run` from its trace `df` (with `assumptions` overridden): a dict of the figures the table prints."""
    import reports

    mb = run.micro_batch if run.micro_batch > 1 else None
    frame = reports.plan(
        df,
        run.gpu,
        gpus_per_node=8,
        micro_batch=mb,
        assumptions=assumptions,
        pp=run.pp,
        micro_batches=run.micro_batches,
        schedule=run.schedule,
    )
    row = frame.iloc[0]
    (detail,) = frame.attrs["plan"].values()
    listed = {a["name"]: a["value"] for a in detail["assumptions"]}
    terms = {_CLASS_WORDS[c["bound"]]: c["seconds_per_step"] for c in detail["classes"]}
    terms["memory-bound"] = float(row["memory_bound_s"])  # without launches, as the classes' compute terms
    terms["launches"] = float(row["launch_s"])
    terms["exposed communication"] = float(row["exposed_comm_s"])
    step = float(row["step_time_s"])
    planned = float(row["tokens_per_s_per_gpu"])
    gpus = int(row["tp"]) * run.pp  # the GPUs that share the record's tokens per step: a TP group per stage
    if run.published is None:  # a memory row: no published tokens/s to set the plan beside
        error = published_step = math.nan
    else:
        error = 100.0 * (planned / run.published - 1.0)
        published_step = float(row["tokens_per_step"]) / gpus / run.published
    masked = float(row["causal_masked_flops_per_step"]) / run.pp  # of the pipeline's, as the record's mfu
    out = {
        "matmul_s": terms["matmul-bound"],
        "published_step_s": published_step,
        "planned": planned,
        "error_pct": error,
        "step_s": step,
        "mfu_pct": 100.0 * (float(row["mfu"]) + masked / step / row["peak_flops_per_s"]),
        "fits": bool(row["fits"]),
        "required_gib": float(row["required_bytes"]) / 2**30,
        "available_gib": float(row["device_memory_bytes"]) / 2**30,
        "max_micro_batch": detail["memory"]["max_micro_batch"],
        "peak_phase": detail["memory"]["peak_phase"],
        "matmul_efficiency": listed["matmul_efficiency"],
        "term": "",
    }
    if abs(error) > 10 and run.pp > 1:
        out["term"] = _pipeline_term(detail["pipeline"], row, step, published_step)
    elif abs(error) > 10:
        name, seconds = max(terms.items(), key=lambda kv: kv[1])
        needed = seconds + published_step - step
        term = (
            f"{name} {seconds:.3g} s of the {step:.3g} s step; the published step ({published_step:.3g} s) "
            f"puts it at {needed:.3g} s"
        )
        if name == "matmul-bound" and needed > 0:
            term += f" (matmul efficiency {listed['matmul_efficiency']:.2f} -> {listed['matmul_efficiency'] * seconds / needed:.2f})"
        out["term"] = term
    return out


def _pipeline_term(pipeline, row, step, published_step):
    """The term past 10% of a pipeline: the slowest stage's time per micro-batch (the step is m of it plus the
    bubble), beside the others' and what the published step leaves it."""
    stages = pipeline["stages"]
    slowest = max(stages, key=lambda s: s["seconds_per_micro_batch"])
    others = sorted(s["seconds_per_micro_batch"] for s in stages if s is not slowest)
    m, bubble = int(row["micro_batches"]), float(row["pipeline_bubble_s"])
    blocks = ", ".join(c["blocks"] for c in slowest["chunks"])
    if slowest["rank"] == len(stages) - 1:
        blocks += " and what runs after the last block: the head, the loss"
    elif slowest["rank"] == 0:
        blocks += " and what runs before the first block: the embedding"
    needed = (published_step - bubble) / m
    return (
        f"slowest stage (rank {slowest['rank']}: blocks {blocks}) "
        f"{slowest['seconds_per_micro_batch']:.3g} s per micro-batch (the others' median {_median(others):.3g} s) "
        f"x {m} micro-batches + bubble {bubble:.3g} s = the {step:.3g} s step; the published step "
        f"({published_step:.3g} s) puts the stage at {needed:.3g} s"
    )


def _generation(run):
    from reports.plan.devices import resolve_gpu
    from reports.plan.efficiency import generation

    return generation(resolve_gpu(run.gpu)["peak_key"])


def source_of(run):
    """The publisher of `run`'s figure ("MosaicML llm-foundry", "torchtitan docs/performance.md", ...)."""
    return run.source.split(",")[0].split(" (")[0]


def fit_stack(run, df, first, rounds=3):
    """The matmul_stack at which the plan of `run` matches its published tokens/s: `rounds` steps of
    reports.plan.calibration.stack_step from the plan at matmul_stack 1 (`first`)."""
    from reports.plan.calibration import stack_step

    stack, r = 1.0, first
    for _ in range(rounds):
        stack = stack_step(stack, r["matmul_s"], r["step_s"], r["published_step_s"])
        r = plan_run(run, df, {"matmul_stack": stack})
    return stack, r["error_pct"]


# a fit that leaves more than this |error| (percent) found no matmul_stack in range that matches its run: the
# run's error is another term's, and its fit is not pooled into the defaults or any other run's stack
UNMATCHED_PCT = 1.0


def validate(runs, workdir, log=print):
    """{run name: result dict} for `runs`, tracing each distinct model once under `workdir`. Each result is the
    plan at the default assumptions (reports.plan.assumptions BY_GENERATION's matmul_stack on an A100 or a
    Hopper) with "fit" (the matmul_stack that matches this run alone, and the error it leaves), and when its
    generation has other runs among `runs`: "loo" (the plan at the median of the other runs' fits of its
    generation) and "loo_source" (of its generation's runs from other sources); under the key None, each
    generation's median of the fits (reports.plan.calibration: pooled, leave_one_out)."""
    from reports.plan.calibration import leave_one_out, pooled

    results = _validate(runs, workdir, log)
    fits, every = {}, {}
    for run in runs:
        r = results[run.name]
        if "status" in r or _generation(run) is None:
            continue
        stack, residual = fit_stack(run, r["df"], plan_run(run, r["df"], {"matmul_stack": 1.0}))
        r["fit"] = (stack, residual)
        every[run.name] = {"generation": _generation(run), "source": source_of(run), "stack": stack}
        if abs(residual) <= UNMATCHED_PCT:
            fits[run.name] = every[run.name]
        log(f"  {run.name}: matmul_stack {stack:.3f} fitted, leaving {residual:+.2f}%")
    for key, by in (("loo", "generation"), ("loo_source", "source")):
        for name, (stack, n) in leave_one_out(fits, by, every).items():
            if n:
                run = next(r for r in runs if r.name == name)
                results[name][key] = plan_run(run, results[name]["df"], {"matmul_stack": stack}) | {"stack": stack}
    for r in results.values():
        r.pop("df", None)
    results[None] = pooled(fits)
    return results


def _validate(runs, workdir, log):
    import reports

    traced, results = {}, {}
    for run in runs:
        if run.status:
            results[run.name] = {"status": run.status}
            continue
        key = run.model.key
        if key not in traced:
            path = Path(workdir) / key
            seconds = trace(run.model, path) if not path.exists() else 0.0
            traced[key] = reports.load(path)
            log(f"  traced {key} in {seconds:.1f} s")
        results[run.name] = plan_run(run, traced[key]) | {"df": traced[key]}
        r = results[run.name]
        if run.published is None:
            log(
                f"  {run.name}: published {'out of memory' if run.oom else 'ran'}, plan {'fits' if r['fits'] else 'NO'}"
            )
        else:
            log(f"  {run.name}: published {run.published:,.0f}, plan {r['planned']:,.0f}")
    return results


def _figure(v):
    return "" if v is None or v != v else f"{v:,.0f}"


def _median(values):
    values = sorted(values)
    n = len(values)
    return (values[(n - 1) // 2] + values[n // 2]) / 2 if n else math.nan


def _summary(errors):
    return (
        f"median |error| {_median(errors):.2f}%, {sum(e > 10 for e in errors)} over 10%, "
        f"{sum(e > 25 for e in errors)} over 25% (of {len(errors)})"
    )


def table(runs, results):
    """The markdown table of `runs` and their `results` (validate's), and the summary lines with the median
    |error|s: the default plan (in-sample: the defaults are fitted on these runs), leave-one-out and
    leave-one-source-out."""
    from reports.plan.assumptions import BY_GENERATION

    lines = [
        "| run | GPU | published tokens/s/GPU (MFU) | plan (MFU) | error | plan, leave-one-out (matmul_stack) "
        "| error | fits (GiB) | term past 10% (leave-one-out plan) | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    errors, loo, loo_source = [], [], []
    for run in runs:
        r = results[run.name]
        mfu = f" ({run.published_mfu:g}%)" if run.published_mfu else ""
        published = (_figure(run.published) or "-") + mfu
        source = run.source + (f"; {run.note}" if run.note else "")
        if "status" in r:
            lines.append(f"| {run.name} | {run.gpu} | {published} | {r['status']} | | | | | | {source} |")
            continue
        errors.append(abs(r["error_pct"]))
        term = r["term"]
        c = r.get("loo")
        if c is None:
            cal = cal_error = "-"
        else:
            loo.append(abs(c["error_pct"]))
            cal, cal_error = f"{c['planned']:,.0f} ({c['stack']:.3f})", f"{c['error_pct']:+.1f}%"
            term = c["term"] or (f"default plan: {r['term']}" if r["term"] else "")
        if r.get("loo_source") is not None:
            loo_source.append(abs(r["loo_source"]["error_pct"]))
        fits = f"{'yes' if r['fits'] else 'NO'} ({r['required_gib']:.1f})"
        lines.append(
            f"| {run.name} | {run.gpu} | {published} | {r['planned']:,.0f} ({r['mfu_pct']:.1f}%) | "
            f"{r['error_pct']:+.1f}% | {cal} | {cal_error} | {fits} | {term} | {source} |"
        )
    n = len(errors)
    pooled = results.get(None) or {}
    assumed = {g: v for g, (v, _) in BY_GENERATION["matmul_stack"].items()}
    stale = [g for g, v in pooled.items() if g in assumed and abs(v - assumed[g]) > 5e-4]
    lines += [
        "",
        f"{n} runs planned, {len(runs) - n} pending. Default assumptions (matmul_stack per generation, "
        "reports.plan.assumptions BY_GENERATION: "
        + ", ".join(f"{g} {v:g}" for g, v in sorted(assumed.items()))
        + f"; in-sample, fitted on these runs): {_summary(errors)}.",
    ]
    if pooled:
        lines.append(
            "The medians of the runs' fits here: "
            + ", ".join(f"{g} {v:.3f}" for g, v in sorted(pooled.items()))
            + (f" (BY_GENERATION differs for {', '.join(stale)}: update it)." if stale else " (BY_GENERATION's).")
        )
    fitted = [(run, results[run.name]["fit"]) for run in runs if "fit" in results[run.name]]
    for gen in sorted({_generation(run) for run, _ in fitted}):
        lines.append(
            f"Fits on {gen}: "
            + ", ".join(
                f"{run.name} {stack:.3f}" + (f" (leaves {left:+.1f}%: not pooled)" if abs(left) > UNMATCHED_PCT else "")
                for run, (stack, left) in fitted
                if _generation(run) == gen
            )
            + "."
        )
    if loo:
        lines.append(
            "Leave-one-out, each run at the median of the other runs' fits of its generation: " + _summary(loo) + "."
        )
    if loo_source:
        lines.append(
            "Leave-one-source-out, each run at the median of the fits of its generation's runs from other sources: "
            + _summary(loo_source)
            + "."
        )
    return "\n".join(lines), _median(errors)


def memory_table(runs, results, memory_runs, memory_results):
    """The markdown table of `memory_runs` (each published as running or out of memory) and their plans' verdicts,
    and the summary of every verdict: `runs` (all published as running) and `memory_runs`. A plan whose verdict is
    not the published one stays in the table, marked, with the largest term of its memory."""
    lines = [
        "| run | GPU | published | micro-batch | plan: fits (required of available GiB) | largest micro-batch that fits "
        "| agrees | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in memory_runs:
        r = memory_results[run.name]
        published = "out of memory" if run.oom else "ran"
        plan = f"{'yes' if r['fits'] else 'NO'} ({r['required_gib']:.1f} of {r['available_gib']:.1f})"
        agrees = "yes" if r["fits"] != run.oom else f"NO: {r['disagreement']}"
        source = run.source + (f"; {run.note}" if run.note else "")
        lines.append(
            f"| {run.name} | {run.gpu} | {published} | {run.micro_batch} | {plan} | {r['max_micro_batch']} "
            f"| {agrees} | {source} |"
        )
    ran = [results[r.name]["fits"] for r in runs if "status" not in results[r.name]]
    ran += [memory_results[r.name]["fits"] for r in memory_runs if not r.oom]
    oom = [not memory_results[r.name]["fits"] for r in memory_runs if r.oom]
    lines += [
        "",
        f"Memory verdicts: {sum(ran)} of {len(ran)} runs published as running planned as fitting (the "
        f"throughput table's and the rows above that ran); {sum(oom)} of {len(oom)} runs published as out of "
        "memory planned as not fitting.",
    ]
    return "\n".join(lines)


def validate_memory(memory_runs, workdir, log=print):
    """{run name: plan_run's result} of `memory_runs`, each with "disagreement": what the plan says against the
    published verdict (its peak's phase and what it needs), "" where they agree."""
    results = _validate(memory_runs, workdir, log)
    for run in memory_runs:
        r = results[run.name]
        r.pop("df", None)
        r["disagreement"] = ""
        if r["fits"] == run.oom:
            r["disagreement"] = (
                f"the plan {'fits' if r['fits'] else 'does not fit'}: required {r['required_gib']:.1f} GiB "
                f"of {r['available_gib']:.1f}, peak in the {r['peak_phase']}"
            )
    return results


_START, _END = "<!-- plan_validation: start -->", "<!-- plan_validation: end -->"


def _commit():
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(page, text):
    """Replace the generated block of `page` (between _START and _END) with `text`, stamped."""
    stamp = (
        f"Generated by `benchmarks/plan_validation.py --write {os.path.relpath(page, ROOT)}` on "
        f"{datetime.date.today().isoformat()} at commit {_commit()}."
    )
    body = Path(page).read_text()
    head, _, rest = body.partition(_START)
    _, _, tail = rest.partition(_END)
    Path(page).write_text(f"{head}{_START}\n{stamp}\n\n{text}\n{_END}{tail}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a run's name (repeatable); default every run")
    parser.add_argument("--traces", help="keep the traces in this directory (reused when there)")
    parser.add_argument("--write", metavar="PAGE", help="write the table into PAGE between its markers")
    args = parser.parse_args(argv)
    runs = [r for r in RUNS if not args.only or r.name in args.only]
    memory_runs = [r for r in MEMORY_RUNS if not args.only or r.name in args.only]
    if args.only and len(runs) + len(memory_runs) != len(set(args.only)):
        names = ", ".join(r.name for r in RUNS + MEMORY_RUNS)
        parser.error(f"unknown run in --only; expected some of {names}")
    start = time.perf_counter()
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        results = validate(runs, args.traces or tmp, log=log)
        memory_results = validate_memory(memory_runs, args.traces or tmp, log=log)
    text, median = table(runs, results)
    text += "\n\n" + memory_table(runs, results, memory_runs, memory_results)
    print(text)
    print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    if args.write:
        write(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
