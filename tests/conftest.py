"""Shared test set-up: import `tracer` from this checkout and the example scripts by name; fixtures every test may use.

The test folders mirror the packages (tests/tracer/<concern>/, tests/reports/<subpackage>/), real third-party loops
are in tests/integration/; how test modules import what they share is in `tests.helpers`."""

import sys

import pytest

from tests.helpers import EXAMPLES, ROOT

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's tracer/ and reports/, even when not pip-installed
if str(EXAMPLES) not in sys.path:
    sys.path.append(str(EXAMPLES))  # `import gpt`, `import linear`, `import tensors`


@pytest.fixture(scope="session")
def examples_dir():
    """The examples/ directory, for running the example scripts as subprocesses."""
    return EXAMPLES


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, whatever ran before it."""
    import random

    import torch

    random.seed(0)
    torch.manual_seed(0)
