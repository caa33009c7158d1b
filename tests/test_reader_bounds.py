"""Every reader bounded: what a part's footer and metadata say is checked before it sizes any allocation.

Each case writes the damage into a copy of a small trace (45 ops of `a + 1` in 9 parts of 5 rows, plus the
empty closing part) and runs `optrace report`, `plan` and `export` in a child process whose address space is
capped (RLIMIT_AS, CAP bytes): a reader that decodes the bomb, or allocates from the count, fails there fast
with a MemoryError traceback instead of swapping, and the test sees it.
"""

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

import reports
from reports.errors import ReportError
from reports.loading.widths import ITEMS_SLACK, MAX_ITEMS_PER_ROW, items_bound
from tracer import Tracer
from tracer.schema import read_part
from tracer.writer import write_table

ROOT = Path(__file__).resolve().parents[1]
CAP = 3 * 2**30  # the child's address space: `optrace report` of a small trace needs about 1.2 GB of it (torch, DuckDB)
BOMB = 50_000_000  # list items in one cell: 400 MB as int64, 14 KB on disk


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("bounds") / "t"
    with Tracer(path, flush_rows=5):
        a = torch.zeros(1)
        for _ in range(44):
            a = a + 1
    return path


def capped(*argv):
    """`optrace ARGV` in a child limited to CAP bytes of address space: (status, stdout, stderr)."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    done = subprocess.run([sys.executable, "-m", "reports.output.cli", *map(str, argv)], cwd=ROOT, preexec_fn=cap,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


# ------------------------------------------------------------------ a Parquet list bomb
@pytest.fixture(scope="module")
def bomb(template, tmp_path_factory):
    """The template with row 3 of part-000000's input_storage_ids holding BOMB zeros (valid storage ids),
    written as the tracer writes a part (tracer.writer.write_table: dictionary-encoded, snappy)."""
    path = shutil.copytree(template, tmp_path_factory.mktemp("bomb") / "t")
    part = path / "part-000000.parquet"
    table = read_part(part)
    lengths = pc.list_value_length(table.column("input_storage_ids")).to_numpy().copy()
    lengths[3] = BOMB
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    cells = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(int(offsets[-1]), np.int64)))
    table = table.set_column(table.schema.get_field_index("input_storage_ids"), "input_storage_ids", cells)
    os.remove(part)
    write_table(table, part)
    return path


def test_the_bomb_is_small_on_disk(bomb):
    assert os.path.getsize(bomb / "part-000000.parquet") < 16_384  # 50,000,000 int64 items: 400,000,000 bytes decoded


@pytest.mark.parametrize("argv", [("report", "TRACE"), ("plan", "TRACE", "--gpu", "H100"), ("export", "TRACE", "-o", "OUT")],
                         ids=["report", "plan", "export"])  # fmt: skip
def test_a_list_bomb_is_refused_from_the_footer_in_bounded_memory(bomb, tmp_path, argv):
    """The part was read: `report` and `plan` peaked at 1.4-1.5 GB (RSS) and called the trace fine; now every
    reader refuses it from its footer, in one line, before a row of it is decoded."""
    rc, out, err = capped(*(bomb if a == "TRACE" else tmp_path / "out.json" if a == "OUT" else a for a in argv))
    # part 0's 5 rows: zeros (no tensor input: its empty list counts 1 value in the footer), then 4 adds of 1
    # input each, the one at row 3 replaced by BOMB: 1 + 1 + 1 + 50,000,000 + 1 = 50,000,004
    items = 1 + 1 + 1 + BOMB + 1
    bound = ITEMS_SLACK + 5 * MAX_ITEMS_PER_ROW  # 16,777,216 + 5 x 65,536 = 17,104,896
    assert (bound, items) == (17_104_896, 50_000_004)
    assert (rc, out) == (2, ""), err
    assert err == (f"optrace {argv[0]}: error: {bomb}: column 'input_storage_ids' of part-000000.parquet holds "
                   "50,000,004 list items in 5 row(s); expected at most 17,104,896 (16,777,216 + 65,536 per row): "
                   "a damaged or hand-made part, not read\n")  # fmt: skip


def test_reports_load_refuses_the_bomb(bomb):
    with pytest.raises(ReportError, match="holds 50,000,004 list items in 5 row"):
        reports.load(bomb)


def test_the_bound_has_an_absolute_cap():
    # 16,777,216 + 65,536 x 1,048,576 rows (pyarrow's largest row group) = 68,736,253,952 > 2^28 = 268,435,456
    assert items_bound(1_048_576) == 268_435_456
    assert items_bound(0) == 16_777_216 and items_bound(1) == 16_842_752


def test_one_wide_row_alone_in_a_part_is_read(tmp_path):
    """The widest rows the tracer writes are ops over many tensors; one over 70,000 tensors, alone in its part
    (flush_rows=1), passes the per-row average (65,536) and is read: the slack covers it."""
    pieces = [torch.zeros(1) for _ in range(70_000)]
    with Tracer(tmp_path / "t", flush_rows=1):
        torch.cat(pieces)
    df = reports.load(tmp_path / "t")
    assert df["op"].tolist() == ["aten.cat.default"]
    assert len(df["input_storage_ids"].iloc[0]) == 70_000  # 70,000 items in a part of 1 row: over 65,536
