"""Fixtures of the output tests: `traced`, a 2-step trace of a small Net in several parts (the exports' input), made
once per session (per worker process) and only read."""

import pytest
import torch

from tracer import Tracer


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.block(x)).square().mean()


@pytest.fixture(scope="session")
def traced(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "net.parquet"
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Tracer(path, model=model, run_name="net", flush_rows=16):  # several parts
        for _ in range(2):
            model(torch.ones(4, 8)).backward()
            opt.step()
            opt.zero_grad()
    return path
