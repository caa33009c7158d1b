"""Fixtures of the SQL engine's tests: `template` (a 2-layer MLP, 2 AdamW steps, one part), `parts` (its forward and
backward twice in 3 parts), `traces` (the example GPT, a cut one, a 2-rank job, a damaged copy). Each is made once
per session (per worker process) and only read: a test that damages one damages a copy."""

import os
import shutil

import pytest
import torch

from tests.helpers import copy_rank
from tests.reports.sql.test_sql import _gpt
from tracer import Tracer
from tracer.schema import part_paths


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    """A 2-layer MLP, 2 AdamW steps, written as one part (160 rows)."""
    path = tmp_path_factory.mktemp("review") / "t"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 8)
    with Tracer(path, model=model, tokens=4, run_name="mlp"):
        for _ in range(2):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.fixture(scope="session")
def parts(tmp_path_factory):
    """The template's MLP forward and backward twice, in parts of 32 rows (3 parts)."""
    path = tmp_path_factory.mktemp("parts") / "p"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with Tracer(path, model=model, tokens=4, run_name="p", flush_rows=32):
        for _ in range(2):
            model(torch.randn(4, 8)).pow(2).mean().backward()
    assert len(part_paths(path)) == 3
    return path


@pytest.fixture(scope="session")
def traces(tmp_path_factory):
    from tests.tracer.distributed.test_job import simulate

    root = tmp_path_factory.mktemp("sql")
    gpt = _gpt(root / "gpt", 3)
    cut = _gpt(root / "cut", 2, cut=True)
    job = root / "job"
    simulate(job, 4)  # under a process group the tracer writes job/rank=0
    copy_rank(job / "rank=0", job / "rank=1", 1)
    damaged = root / "damaged"
    shutil.copytree(gpt, damaged)
    os.remove(part_paths(damaged)[1])  # a part deleted: the report names the missing rows and parts
    return {"gpt": gpt, "cut": cut, "job": job, "damaged": damaged}
