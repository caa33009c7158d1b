"""The lecture's storage facts, read from a trace: bytes per element, views, copies.

    python examples/tensors.py

Each line of the lecture runs as its own tiny module, so the trace's `module`
column names the line. What the trace shows:

  * torch.zeros(4, 8) allocates numel * element_size bytes: 4 * 8 * 4 = 128 in
    float32, 64 in float16 and bfloat16, 32 in either fp8 (float8_e4m3fn, float8_e5m2).
  * x[0], x[:, 1], x.view(3, 2) and x.t() are views: the output's storage id is the
    input's, and they allocate 0 bytes.
  * x.t().contiguous() copies: a new storage of 2 * 3 * 4 = 24 bytes.
  * elementwise ops (x.pow(2), x.sqrt(), x + x, x.triu()) each allocate a new 24-byte tensor.
"""

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

try:
    import tracer  # noqa: F401  (installed with `pip install -e .`)
except ImportError:  # run from a checkout: `python examples/tensors.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Line(nn.Module):
    """One line of the lecture, as a module so that the trace's module column names it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# name -> the line; the lines that take an argument get x = [[1, 2, 3], [4, 5, 6]] (float32).
LINES = {
    "zeros_float32": lambda: torch.zeros(4, 8),
    "zeros_float16": lambda: torch.zeros(4, 8, dtype=torch.float16),
    "zeros_bfloat16": lambda: torch.zeros(4, 8, dtype=torch.bfloat16),
    "zeros_float8_e4m3fn": lambda: torch.zeros(4, 8, dtype=torch.float8_e4m3fn),
    "zeros_float8_e5m2": lambda: torch.zeros(4, 8, dtype=torch.float8_e5m2),
    "row": lambda x: x[0],
    "column": lambda x: x[:, 1],
    "view": lambda x: x.view(3, 2),
    "transpose": lambda x: x.t(),
    "contiguous": lambda x: x.t().contiguous(),
    "pow": lambda x: x.pow(2),
    "sqrt": lambda x: x.sqrt(),
    "add": lambda x: x + x,
    "triu": lambda x: x.triu(),
}


def trace_tensors(path):
    """Run every line of LINES under a Tracer writing to `path`; return the trace as a DataFrame."""
    import pandas as pd

    from tracer import Tracer

    lines = nn.ModuleDict({name: Line(fn) for name, fn in LINES.items()})
    x = torch.tensor([[1.0, 2, 3], [4, 5, 6]])  # made before the trace: its storage is the input
    keep = []  # keep every output alive, so no storage is freed and reused mid-trace
    with Tracer(path, model=lines, run_name="tensors"):
        for name, line in lines.items():
            keep.append(line() if name.startswith("zeros") else line(x))
    return pd.read_parquet(path)


def table(df):
    """One row per op: which line ran it, whether it is a view, storage ids and bytes allocated."""
    out = df[["module", "op", "output_shapes", "output_dtypes", "is_view"]].copy()
    out["in_storage"] = [list(ids) for ids in df["input_storage_ids"]]
    out["out_storage"] = [list(ids) for ids in df["output_storage_ids"]]
    out["output_shapes"] = [[list(s) for s in shapes] for shapes in df["output_shapes"]]
    out["output_dtypes"] = [list(d) for d in df["output_dtypes"]]
    out["bytes_allocated"] = df["bytes_allocated"]
    return out.rename(columns={"module": "line"})


def main(argv=None):
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/tensors.parquet", help="trace directory (default: %(default)s)")
    args = parser.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df = trace_tensors(args.out)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 40):
        print(table(df).to_string(index=False))
    print(
        "\nzeros(4, 8): 128 B in float32, 64 in float16/bfloat16, 32 in fp8."
        "\nViews share the input's storage id and allocate 0 B; contiguous() and elementwise ops allocate 24 B."
    )


if __name__ == "__main__":
    main()
