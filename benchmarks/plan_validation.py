"""`optrace plan` against published training runs: for each, its model at the published config traced as
rank 0 on this CPU (FakeTensorMode, torch's fake process group: examples/simulate.py), planned on the
published GPU, beside the published tokens/s per GPU.

    .venv/bin/python benchmarks/plan_validation.py                 # every run, about 5-8 min on 2 cores
    .venv/bin/python benchmarks/plan_validation.py --only mpt-125m-a100
    .venv/bin/python benchmarks/plan_validation.py --write docs/planning.md   # the table of the docs page

Each run is traced at its published model, sequence length, world size and activation checkpointing,
at micro-batch 1, and planned at the published micro-batch (reports.plan's linear extrapolation: FLOPs
and activation bytes grow with it, parameters and collectives stay). Every published figure cites
where it is published (RUNS: source, table). Runs the plan cannot express yet (tensor or pipeline
parallelism) are listed with status "pending", never planned with another configuration.

Per run it prints the published figure, the plan's, the error (plan / published - 1) and, past 10%,
the term responsible: the largest term of the planned step (time bound by matmuls, attention,
vector ops, memory, kernel launches, or exposed communication) and what the published step implies
for it (for matmuls: the efficiency that would close the gap). That is an attribution to the largest
term, not a measurement of which term is wrong.
"""

import argparse
import datetime
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
    """What is traced: a family ("mpt": examples/gpt.py's GPT as MPT; "llama": examples/plan_llama.py's Llama),
    its fields, the world size and the activation checkpointing ("none", "full": every block, "every-2nd")."""

    family: str
    fields: tuple
    world: int
    checkpoint: str = "none"
    replicate: int = 1  # HSDP: sharded over world / replicate ranks, replicated over `replicate` groups

    @property
    def key(self):
        f = dict(self.fields)
        return f"{self.family}-d{f.get('d_model', f.get('dim'))}-l{f.get('n_layer', f.get('n_layers'))}" + (
            f"-s{f['seq_len']}-w{self.world}-{self.checkpoint}" + (f"-r{self.replicate}" if self.replicate > 1 else "")
        )


@dataclass(frozen=True)
class Run:
    name: str
    source: str
    gpu: str  # the catalogue's name of the published GPU (tracer.devices)
    model: Model
    micro_batch: int
    published: float  # tokens/s per GPU, as published
    published_mfu: float | None = None  # percent, as published (its own convention)
    note: str = ""
    status: str = ""  # "" or "pending: <what the plan lacks>"
    extra: dict = field(default_factory=dict, compare=False)


def mpt(d, heads, layers, seq, world, checkpoint="none"):
    # MPT yamls (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): vocab 50,368, expansion 4, no biases,
    # tied embeddings; the benchmark's parameter counts grow with the sequence by seq x d: learned positions
    fields = dict(vocab_size=50368, seq_len=seq, n_layer=layers, n_head=heads, d_model=d)
    return Model("mpt", tuple(sorted(fields.items())), world, checkpoint)


def llama(dim, layers, heads, kv, ffn, vocab, seq, world, checkpoint="none", replicate=1):
    fields = dict(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv, ffn_dim=ffn, vocab_size=vocab, seq_len=seq)
    return Model("llama", tuple(sorted(fields.items())), world, checkpoint, replicate)


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
        "H100 SXM",
        LLAMA31_8B_SEL_W8,
        2,
        5762,
        note="its H100s: 96 GB HBM2e, 2.4 TB/s, 500 W power limit (the catalogue's H100 SXM: 80 GB HBM3, 3.35 TB/s, "
        "700 W); selective AC traced as every 2nd block checkpointed",
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
        "H100 SXM",
        llama(16384, 126, 128, 8, 53248, 128256, 8192, 128, "full"),
        2,
        109,
        29.0,
        note="its H100s have 94 GB (the catalogue's H100 SXM has 80)",
        status="pending: needs --tp (tensor parallelism's tokens per GPU and streams, branch h-overlap)",
    ),
    Run(
        "megatron-1t-a100-tp-pp",
        MEGATRON + "(SC21, arXiv:2104.04473), abstract and Table 1: 1T parameters on 3,072 A100 at 502 PFLOP/s, "
        "163 TFLOP/s per GPU (52% of peak), tensor and pipeline parallel",
        "A100 80GB SXM",
        llama(25600, 128, 160, 160, 102400, 51200, 2048, 3072),
        1,
        math.nan,
        52.0,
        status="pending: needs --pp (pipeline stages and schedule, branch h-pipeline)",
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
    if model.family == "mpt":
        from gpt import GPT, GPTConfig

        cfg = GPTConfig(**f, bias=False, tie_weights=True, attention="sdpa")
        build, blocks = GPT, "blocks"
    else:
        from plan_llama import Llama, LlamaConfig

        cfg = LlamaConfig(**{k: v for k, v in f.items()})
        build, blocks = Llama, "layers"
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


def trace(model, path):
    """Trace one AdamW step of rank 0 of `model` at micro-batch 1 into `path`; returns the seconds it took."""
    from simulate import simulate

    build, cfg, blocks = _build(model)
    start = time.perf_counter()
    if model.replicate > 1:
        _hsdp(str(path), model, cfg, build, blocks)
    else:
        simulate(str(path), model.world, cfg, 1, model.checkpoint == "full", build=build, blocks=blocks)
    return time.perf_counter() - start


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
    frame = reports.plan(df, run.gpu, gpus_per_node=8, micro_batch=mb, assumptions=assumptions)
    row = frame.iloc[0]
    (detail,) = frame.attrs["plan"].values()
    listed = {a["name"]: a["value"] for a in detail["assumptions"]}
    terms = {_CLASS_WORDS[c["bound"]]: c["seconds_per_step"] for c in detail["classes"]}
    terms["memory-bound"] = float(row["memory_bound_s"])  # without launches, as the classes' compute terms
    terms["launches"] = float(row["launch_s"])
    terms["exposed communication"] = float(row["exposed_comm_s"])
    step = float(row["step_time_s"])
    planned = float(row["tokens_per_s_per_gpu"])
    error = 100.0 * (planned / run.published - 1.0)
    out = {
        "matmul_s": terms["matmul-bound"],
        "published_step_s": float(row["tokens_per_step"]) / run.published,
        "planned": planned,
        "error_pct": error,
        "step_s": step,
        "mfu_pct": 100.0
        * (float(row["mfu"]) + float(row["causal_masked_flops_per_step"]) / step / row["peak_flops_per_s"]),
        "fits": bool(row["fits"]),
        "required_gib": float(row["required_bytes"]) / 2**30,
        "matmul_efficiency": listed["matmul_efficiency"],
        "term": "",
    }
    if abs(error) > 10:
        name, seconds = max(terms.items(), key=lambda kv: kv[1])
        published_step = float(row["tokens_per_step"]) / run.published
        needed = seconds + published_step - step
        term = (
            f"{name} {seconds:.3g} s of the {step:.3g} s step; the published step ({published_step:.3g} s) "
            f"puts it at {needed:.3g} s"
        )
        if name == "matmul-bound" and needed > 0:
            term += f" (matmul efficiency {listed['matmul_efficiency']:.2f} -> {listed['matmul_efficiency'] * seconds / needed:.2f})"
        out["term"] = term
    return out


# the run per GPU generation whose published figure fits matmul_stack for the "calibrated" column; it is left
# out of that column's median (it matches by construction)
CALIBRATION = {"hopper": "mpt-7b-h100", "ampere": "mpt-7b-a100"}


def _generation(run):
    from reports.plan.devices import resolve_gpu
    from reports.plan.efficiency import generation

    return generation(resolve_gpu(run.gpu)["peak_key"])


def fit_stack(run, df, first):
    """The matmul_stack at which the plan of `run` matches its published tokens/s: the matmul-bound time is the
    only term scaled, s <- s x T / (T + step - published step), twice from the plan at 1 (`first`)."""
    stack, r = 1.0, first
    for _ in range(2):
        needed = r["matmul_s"] + r["published_step_s"] - r["step_s"]
        stack = min(max(stack * r["matmul_s"] / needed, 0.01), 2.0) if needed > 0 else 2.0
        r = plan_run(run, df, {"matmul_stack": stack})
    return stack


def validate(runs, workdir, log=print):
    """{run name: result dict} for `runs`, tracing each distinct model once under `workdir`; each result has the
    plan at the default assumptions and, under "calibrated", at the matmul_stack fitted on its generation's
    CALIBRATION run (when that run is among `runs`)."""
    results = _validate(runs, workdir, log)
    stacks = {}
    for gen, name in CALIBRATION.items():
        run = next((r for r in runs if r.name == name), None)
        if run is not None:
            stacks[gen] = fit_stack(run, results[name]["df"], results[name])
            log(f"  matmul_stack fitted on {name}: {stacks[gen]:.3f}")
    for run in runs:
        r = results[run.name]
        gen = _generation(run)
        if "status" not in r and gen in stacks:
            r["calibrated"] = plan_run(run, r["df"], {"matmul_stack": stacks[gen]})
            r["calibrated"]["stack"] = stacks[gen]
            r["calibrated"]["fitted_here"] = CALIBRATION[gen] == run.name
    for r in results.values():
        r.pop("df", None)
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
        log(f"  {run.name}: published {run.published:,.0f}, plan {results[run.name]['planned']:,.0f}")
    return results


def _figure(v):
    return "" if v is None or v != v else f"{v:,.0f}"


def _median(values):
    values = sorted(values)
    n = len(values)
    return (values[(n - 1) // 2] + values[n // 2]) / 2 if n else math.nan


def table(runs, results):
    """The markdown table of `runs` and their `results`, and the summary lines with the median |error|s."""
    lines = [
        "| run | GPU | published tokens/s/GPU (MFU) | plan (MFU) | error | plan, stack fitted | error | fits (GiB) "
        "| term past 10% (default plan) | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    errors, fitted, stacks = [], [], {}
    for run in runs:
        r = results[run.name]
        mfu = f" ({run.published_mfu:g}%)" if run.published_mfu else ""
        published = (_figure(run.published) or "-") + mfu
        source = run.source + (f"; {run.note}" if run.note else "")
        if "status" in r:
            lines.append(f"| {run.name} | {run.gpu} | {published} | {r['status']} | | | | | | {source} |")
            continue
        errors.append(abs(r["error_pct"]))
        c = r.get("calibrated")
        if c is None:
            cal = cal_error = "-"
        else:
            stacks[_generation(run)] = c["stack"]
            cal = f"{c['planned']:,.0f}"
            cal_error = "fitted here" if c["fitted_here"] else f"{c['error_pct']:+.1f}%"
            if not c["fitted_here"]:
                fitted.append(abs(c["error_pct"]))
        fits = f"{'yes' if r['fits'] else 'NO'} ({r['required_gib']:.1f})"
        lines.append(
            f"| {run.name} | {run.gpu} | {published} | {r['planned']:,.0f} ({r['mfu_pct']:.1f}%) | "
            f"{r['error_pct']:+.1f}% | {cal} | {cal_error} | {fits} | {r['term']} | {source} |"
        )
    n = len(errors)
    lines += [
        "",
        f"{n} runs planned, {len(runs) - n} pending. Default assumptions (matmul_stack 1: the GEMM sweep as "
        f"published): median |error| {_median(errors):.1f}%, {sum(e <= 10 for e in errors)} within 10%, "
        f"{sum(e > 25 for e in errors)} over 25%.",
    ]
    if fitted:
        fit_text = ", ".join(f"{g} {v:.3f} (on {CALIBRATION[g]})" for g, v in sorted(stacks.items()))
        lines.append(
            f"matmul_stack fitted on one published run per generation ({fit_text}), the other "
            f"{len(fitted)} runs: median |error| {_median(fitted):.1f}%, {sum(e <= 10 for e in fitted)} within 10%, "
            f"{sum(e > 25 for e in fitted)} over 25%."
        )
    return "\n".join(lines), _median(errors)


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
    if args.only and len(runs) != len(set(args.only)):
        parser.error(f"unknown run in --only; expected some of {', '.join(r.name for r in RUNS)}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = validate(runs, args.traces or tmp, log=lambda s: print(s, file=sys.stderr))
    text, median = table(runs, results)
    print(text)
    print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    if args.write:
        write(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
