"""Fixtures of the report tests: `loops`, traces of the usual training loop at 2 steps of batch 4 and 3 of batch 8; made
once per session (per worker process) and only read."""

import pytest
import torch
from torch import nn

from tracer import Tracer


def _loop(path, steps, batch):
    """The usual loop: the batch made at the top of each iteration (phase other, in the step before)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(path, model=model, tokens=batch):
        for _ in range(steps):
            model(torch.randn(batch, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.fixture(scope="session")
def loops(tmp_path_factory):
    root = tmp_path_factory.mktemp("loops")
    return [_loop(root / "s2.parquet", 2, 4), _loop(root / "s3.parquet", 3, 8)]
