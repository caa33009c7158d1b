"""The lecture's linear model y = x @ w, traced: why its backward costs 2BDK, not 4BDK.

    python examples/linear.py

x is data [B, D] (no gradient), w a weight [D, K]. The forward is one matmul of
2 * B * D * K FLOPs (one multiply and one add per (i, j, k) triple). The backward
of y = x @ w can compute two matmuls of the same size:

    dL/dw = x^T @ dL/dy    [D, B] @ [B, K] -> [D, K]   2 * B * D * K FLOPs
    dL/dx = dL/dy @ w^T    [B, K] @ [K, D] -> [B, D]   2 * B * D * K FLOPs

The "backward = 4 x tokens x parameters" heuristic counts both, because in a deep
network every layer's input is the previous layer's output and needs its gradient.
Here x is the data, autograd skips dL/dx, and the trace shows one backward matmul.
The second trace gives x a gradient (as a hidden layer's input has) and shows 4BDK.
"""

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

try:
    import tracer  # noqa: F401  (installed with `pip install -e .`)
except ImportError:  # run from a checkout: `python examples/linear.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

B, D, K = 1024, 256, 64  # the lecture's CPU sizes: points, input dimension, outputs


class Linear(nn.Module):
    """y = x @ w, with w [D, K] the only parameter; forward returns the loss y.sum()."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, k))

    def forward(self, x):
        return (x @ self.w).sum()


def trace_linear(path, x_requires_grad=False):
    """Trace forward + backward of the linear model into `path`; return the trace as a DataFrame."""
    import pandas as pd

    from tracer import Tracer

    torch.manual_seed(0)
    model = Linear(D, K)
    x = torch.ones(B, D, requires_grad=x_requires_grad)
    with Tracer(path, model=model, tokens=B, run_name="linear"):
        model(x).backward()
    return pd.read_parquet(path)


def matmuls(df):
    """The matmul rows as (phase, op, "a @ b -> c" shapes, FLOPs)."""
    rows = df[df["flop_kind"] == "matmul"]

    def shapes(r):
        a, b = ([int(n) for n in s] for s in r.input_shapes)
        return f"{a} @ {b} -> {[int(n) for n in r.output_shapes[0]]}"

    return [(r.phase, r.op, shapes(r), int(r.flops)) for r in rows.itertuples()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/linear.parquet", help="trace directory (default: %(default)s)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    xgrad_out = out.with_name(out.stem + "_xgrad" + out.suffix)

    print(f"y = x @ w with B={B}, D={D}, K={K}; 2*B*D*K = {2 * B * D * K:,}")
    for path, x_grad in ((out, False), (xgrad_out, True)):
        df = trace_linear(path, x_requires_grad=x_grad)
        print(f"\nx.requires_grad={x_grad}: matmuls in {path}")
        for phase, op, shapes, flops in matmuls(df):
            print(f"  {phase:<9} {op:<16} {shapes:<40} {flops:>12,} FLOPs")
        by_phase = df[df["flop_kind"] == "matmul"].groupby("phase", observed=True)["flops"].sum()
        fwd, bwd = int(by_phase.get("forward", 0)), int(by_phase.get("backward", 0))
        print(f"  forward  matmul FLOPs {fwd:>12,} = {fwd / (B * D * K):.0f} * B*D*K")
        print(f"  backward matmul FLOPs {bwd:>12,} = {bwd / (B * D * K):.0f} * B*D*K")
    print(
        "\nx needs no gradient, so autograd computes only dL/dw = x^T @ dL/dy: the backward is"
        "\n2*B*D*K, not the 4*B*D*K of the heuristic, which assumes dL/dx is needed too."
    )


if __name__ == "__main__":
    main()
