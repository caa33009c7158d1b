"""Shared test set-up: import `tracer` from this checkout and the example scripts by name."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's tracer/ and reports/, even when not pip-installed
if str(EXAMPLES) not in sys.path:
    sys.path.append(str(EXAMPLES))  # `import gpt`, `import linear`, `import tensors`


# The first line of a child program that takes a Ctrl-C: Python's own SIGINT handler, whatever the suite inherited.
# A suite started with SIGINT ignored (`make test &` from a script, `nohup ... &`, an ignoring parent) passes that
# on to every child: Python then installs no handler, so `os.kill(pid, SIGINT)`, `signal.raise_signal` and
# `_thread.interrupt_main` do nothing, and no KeyboardInterrupt comes.
DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


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


def copy_rank(source, target, rank):
    """A copy of trace directory `source` at `target` as rank `rank` of the same job: every part's metadata and the
    marker name that rank and a trace id of its own (a plain copy is refused by the reports: two directories of
    one trace)."""
    import json
    import shutil

    import pyarrow.parquet as pq

    from reports.loading.integrity import read_marker
    from tracer.store.directory import write_facts
    from tracer.schema import METADATA_KEY, part_paths, read_part

    shutil.copytree(source, target)
    for part in part_paths(target):
        table = read_part(part)
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        trace_id = f"{meta.get('trace_id')}-rank{rank}"
        meta.update(rank=rank, trace_id=trace_id, world_size=max(int(meta.get("world_size") or 1), rank + 1))
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, METADATA_KEY: json.dumps(meta).encode()}),
                       part)
    marker = read_marker(target)
    if marker.get("trace_id") is not None:
        write_facts(target, {**marker, "trace_id": f"{marker['trace_id']}-rank{rank}"})
    return target
