"""The same GPT training step in float32 and under bf16 autocast, traced and compared.

    python examples/compare_precision.py        # -> runs/gpt_fp32.parquet, runs/gpt_bf16.parquet

Autocast runs the matmuls in bfloat16 (2 bytes per element instead of 4), so their
outputs take half the bytes; parameters, gradients and optimizer state stay float32.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import tracer  # noqa: F401
except ImportError:  # run from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step  # noqa: E402

import reports  # noqa: E402
from tracer import Tracer  # noqa: E402


def trace(path, dtype, batch=8):
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    opt = make_optimizer(model)
    idx, targets = make_batch(cfg, batch)
    name = "bf16" if dtype is not None else "fp32"
    with Tracer(path, model=model, tokens=batch * cfg.seq_len, run_name=name):
        train_step(model, opt, idx, targets, dtype)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        default="runs",
        help="directory of the two traces, gpt_fp32.parquet and gpt_bf16.parquet (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    fp32, bf16 = (str(Path(args.runs) / f"gpt_{name}.parquet") for name in ("fp32", "bf16"))
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    trace(fp32, None)
    trace(bf16, torch.bfloat16)
    df = reports.load([fp32, bf16])
    print("By phase (signed changes of bf16 against fp32, in %)")
    table = reports.compare(df, by="phase")
    columns = [
        "phase",
        "run",
        "flops_per_step",
        "bytes_allocated_per_step",
        "peak_live_bytes",
        "bytes_allocated_change_pct",
        "peak_live_bytes_change_pct",
    ]
    print(table[columns].to_string(index=False))
    print("\nBytes allocated by dtype")
    print(reports.memory_by_dtype(df).to_string(index=False))
    mm = df[df["op"].isin(["aten.mm.default", "aten.addmm.default", "aten.bmm.default"])]
    out = mm.groupby("run", observed=True)["bytes_allocated"].sum()
    print(f"\nmatmul output bytes: fp32 {out['fp32']:,}, bf16 {out['bf16']:,} (ratio {out['bf16'] / out['fp32']:.2f})")


if __name__ == "__main__":
    main()
