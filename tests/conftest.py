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


# The files of the longest tests (a child Python importing torch, torch.compile, Spark, tracemalloc over thousands of
# passes: 10-40 s each on the shared 2-core VM), first, longest first; every other file after them in pytest's order.
# With 2 workers (pytest-xdist) the suite's last minutes are then short tests on both workers, not one worker running
# a 40 s test while the other has finished.
SLOW_FIRST = (
    "tests/tracer/recording/test_compiled_eager.py",
    "tests/tracer/store/test_many_parts.py",
    "tests/tracer/recording/test_loops.py",
    "tests/tracer/store/test_bounded_memory.py",
    "tests/reports/sql/test_dialects.py",
    "tests/tracer/safety/test_fork_signals.py",
    "tests/tracer/recording/test_compiled_warning.py",
    "tests/tracer/safety/test_sigterm.py",
    "tests/tracer/recording/test_tracer.py",
    "tests/tracer/store/test_merges_during_run.py",
    "tests/tracer/store/test_trace_directory.py",
    "tests/tracer/metering/test_meter_distributed.py",
    "tests/tracer/distributed/test_distributed.py",
    "tests/reports/output/test_export.py",
    "tests/tracer/distributed/test_parallel_training.py",
    "tests/tracer/recording/test_lifecycle.py",
    "tests/tracer/metering/test_meter.py",
    "tests/tracer/test_devices.py",
)


def pytest_collection_modifyitems(config, items):
    """The files of SLOW_FIRST first, in its order; each file's tests, and the other files, keep pytest's order."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # a stable sort


def pytest_unconfigure(config):
    """The forking parents of tests.helpers.forked end with the test process, where it used them."""
    forked = sys.modules.get("tests.helpers.forked")
    if forked is not None:
        forked.close()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n 2` schedules by work stealing (pytest-xdist's `--dist worksteal`): each worker starts on one half of
    the tests, in order, and a worker that runs out takes half of the other's queue; a file's module fixtures are then
    made on one worker, where `--dist load` sent the last tests out 2 at a time, a file's tests to both. An explicit
    `--dist` is kept."""
    if config.getoption("dist") == "load" and not any(a.startswith("--dist") for a in config.invocation_params.args):
        from xdist.scheduler import WorkStealingScheduling

        return WorkStealingScheduling(config, log)
    return None
