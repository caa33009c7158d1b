"""Every reader bounded: what a part's footer and metadata say is checked before it sizes any allocation.

Each case writes the damage into a copy of a small trace (45 ops of `a + 1` in 9 parts of 5 rows, plus the
empty closing part) and runs `optrace report`, `plan` and `export` in a child process whose address space is
capped (RLIMIT_AS, CAP bytes): a reader that decodes the bomb, or allocates from the count, fails there fast
with a MemoryError traceback instead of swapping, and the test sees it.
"""

import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

import reports
from reports.errors import ReportError
from reports.loading.widths import ITEMS_SLACK, MAX_ITEMS_PER_ROW, items_bound
from tests import helpers
from tracer import Tracer
from tracer.schema import METADATA_KEY, part_paths, read_part
from tracer.store.writer import write_table

ROOT = helpers.ROOT
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

    done = subprocess.run(
        [sys.executable, "-m", "reports.output.cli", *map(str, argv)],
        cwd=ROOT,
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


# ------------------------------------------------------------------ a Parquet list bomb
@pytest.fixture(scope="module")
def bomb(template, tmp_path_factory):
    """The template with row 3 of part-000000's input_storage_ids holding BOMB zeros (valid storage ids),
    written as the tracer writes a part (tracer.store.writer.write_table: dictionary-encoded, snappy)."""
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


@pytest.mark.parametrize(
    "argv",
    [("report", "TRACE"), ("plan", "TRACE", "--gpu", "H100"), ("export", "TRACE", "-o", "OUT")],
    ids=["report", "plan", "export"],
)
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
    assert err == (
        f"optrace {argv[0]}: error: {bomb}: column 'input_storage_ids' of part-000000.parquet holds "
        "50,000,004 list items in 5 row(s); expected at most 17,104,896 (16,777,216 + 65,536 per row): "
        "a damaged or hand-made part, not read\n"
    )


def test_reports_load_refuses_the_bomb(bomb):
    with pytest.raises(ReportError, match="holds 50,000,004 list items in 5 row"):
        reports.load(bomb)


@pytest.fixture(scope="module")
def long_name(template, tmp_path_factory):
    """The template with a module name of 100,000,000 bytes at row 3 of part-000000 (about 5 MB on disk)."""
    path = shutil.copytree(template, tmp_path_factory.mktemp("long") / "t")
    part = path / "part-000000.parquet"
    table = read_part(part)
    names = table.column("module").to_pylist()
    names[3] = "m" * 100_000_000
    at = table.schema.get_field_index("module")
    table = table.set_column(
        at, "module", pa.array(names, pa.string()).dictionary_encode().cast(table.schema.field(at).type)
    )
    os.remove(part)
    write_table(table, part)
    return path


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_string_bomb_is_refused_from_the_footer(long_name, tmp_path, command):
    """A 300,000,000-byte module name (14 MB on disk) took `optrace report` to 5.3 GB and `export` to 3.0 GB
    (RSS); a name of 100,000,000 bytes is refused from the footer's uncompressed size, unread."""
    rc, out, err = capped(command, long_name, *(["-o", tmp_path / "out.json"] if command == "export" else []))
    # the chunk: a dictionary page of "" and the name, each after its 4-byte length (4 + 4 + 100,000,000), the
    # page of indices and the pages' headers: 100,000,061 bytes uncompressed; the bound 16,777,216 + 5 x 4,096
    assert (rc, out) == (2, ""), err
    assert err == (
        f"optrace {command}: error: {long_name}: column 'module' of part-000000.parquet holds 100,000,061 "
        "bytes of strings in 5 row(s); expected at most 16,797,696 (16,777,216 + 4,096 per row): a damaged "
        "or hand-made part, not read\n"
    )
    from reports.loading.widths import string_bound

    assert string_bound(5) == 16_797_696


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


# ------------------------------------------------------------------ counts from the metadata never size an allocation
def set_metadata(part, **fields):
    """Rewrite `part` with its optrace metadata updated by `fields` (its rows as they are)."""
    table = read_part(part)
    meta = json.loads(table.schema.metadata[METADATA_KEY])
    meta.update(fields)
    os.remove(part)
    write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), part)


def set_cell(part, name, row, value):
    table = read_part(part)
    values = table.column(name).to_pylist()
    values[row] = value
    os.remove(part)
    write_table(
        table.set_column(table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type)),
        part,
    )


@pytest.fixture
def counted(template, tmp_path):
    """The template with record_errors = 10^15 in its newest part's metadata, and storage id 2^40 as the output of
    seq 3: the id limit, 2^20 + 16 x (45 rows + 10^15), lets 2^40 through, and the memory model's arrays by id
    asked for 2^40 + 1 int64 (8 TiB)."""
    path = shutil.copytree(template, tmp_path / "t")
    set_metadata(part_paths(path)[-1], record_errors=10**15)
    set_cell(path / "part-000000.parquet", "output_storage_ids", 3, [2**40])
    return path


DAMAGE = (
    "optrace {}: note: {}: trace is damaged: 1000000000000000 op(s) ran but were not recorded; {} the 45 rows it has\n"
)


@pytest.mark.parametrize("engine", ["sql", "pandas"])
def test_a_huge_record_errors_count_is_damage_not_an_allocation(counted, engine):
    """`optrace report` raised numpy's "Unable to allocate 8.00 TiB" (both engines); now it prints, the count named
    as damage, in an address space of CAP."""
    rc, out, err = capped("report", counted, "--engine", engine)
    assert (rc, err) == (0, DAMAGE.format("report", counted, "reporting")), err
    # the peak: 45 one-element float32 tensors (a = zeros(1), then a + 1 44 times), each freed after the next add
    # made its successor: 2 alive at once, 4 + 4 = 8 bytes
    assert "Memory: peak 8 B live" in out


def test_plan_and_export_of_the_huge_count(counted, tmp_path):
    rc, out, err = capped("plan", counted, "--gpu", "H100")
    assert (rc, err) == (0, DAMAGE.format("plan", counted, "reporting")), err
    rc, out, err = capped("export", counted, "-o", tmp_path / "out.json")
    assert (rc, err) == (
        0,
        DAMAGE.format("export", counted, "exporting").replace(" the 45 rows it has", " the rows it has"),
    ), err


def test_storage_ids_of_2_40_keep_their_ids_in_the_storages_table(counted):
    """The sparse ids are kept as positions inside the model (reports/memory/id_space.py) and given back as ids."""
    with pytest.warns(UserWarning, match="trace is damaged: 1000000000000000 op"):
        table = reports.storages(reports.load(counted))
    assert 2**40 in table["storage_id"].tolist()
    assert table.loc[table["storage_id"] == 2**40, "nbytes"].tolist() == [4]  # one float32 element


def test_the_positions_give_the_same_memory_figures_as_the_ids(template, monkeypatch, capsys):
    """Every run's storages taken by position (as for sparse ids) give the figures of the arrays by id, in both
    engines: the pandas model (reports.storages, by_category, timeline) and the SQL report's categories."""
    import reports.memory.frame_rows as frame_rows
    import reports.memory.id_space as id_space
    import reports.memory.row_scan as row_scan
    from reports.output.cli import main

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters())
    path = template.parent / "adamw"
    if not path.exists():
        with Tracer(path, model=model, tokens=4, flush_rows=64):
            for _ in range(2):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
    df = reports.load(path)
    dense = [reports.storages(df), reports.by_category(df, at="max"), reports.timeline(df)]
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    monkeypatch.setattr(frame_rows, "dense_enough", lambda top, count: False)
    monkeypatch.setattr(id_space, "dense_enough", lambda top, count: False)
    monkeypatch.setattr(row_scan, "SLACK", 0)
    monkeypatch.setattr(row_scan, "PER_ID", 0)  # every id from 0 up kept as it comes (the far ids of row_scan._Firsts)
    sparse = [reports.storages(df), reports.by_category(df, at="max"), reports.timeline(df)]
    for a, b in zip(dense, sparse):
        pd.testing.assert_frame_equal(a, b)
    assert set(dense[0]["category"]) >= {"parameters", "gradients", "optimizer_state"}
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out == text and "Memory: peak" in text


def test_a_process_groups_rank_sizes_no_array():
    """plan placed a group's ranks on nodes with np.bincount(ranks // gpus_per_node): a metadata rank of 10^15 asked
    for 125,000,000,000,001 int64 counts (909 TiB); the nodes are counted from the distinct ranks now."""
    from reports.plan.comm import placement

    # ranks 0 and 10^15 at 8 per node: nodes 0 and 125,000,000,000,000, one GPU of the group on each
    assert placement(2, 8, [0, 10**15]) == (2, 1)
    assert placement(16, 8, list(range(16))) == (2, 8)  # 2 nodes of 8


def test_a_process_groups_rank_beyond_the_world_is_one_line(template, tmp_path):
    path = shutil.copytree(template, tmp_path / "t")
    set_metadata(
        part_paths(path)[-1], world_size=2, rank=0, process_groups=[{"name": "0", "size": 2, "ranks": [0, 10**15]}]
    )
    with pytest.raises(ReportError) as raised:
        reports.load(path)
    assert str(raised.value) == (
        f'{path}: optrace metadata (part-000009.parquet) process group "0" has rank '
        "1000000000000000, expected a rank 0 to 1"
    )


def test_the_memory_scan_allocates_by_the_rows_it_is_fed_not_by_the_footers_count(template):
    """row_scan.Scan took its arrays' length from the footers' row count, a claim of the files: Scan(10^15) asked
    for 7.11 PiB at once. Its arrays grow as rows come now, and a count the rows do not reach is one line at the end."""
    from reports.memory.row_scan import Scan

    scan = Scan(10**15)
    table = reports.load(template, lists="arrow")
    batch = pa.Table.from_pandas(table[list(Scan.columns[:3]) + list(Scan.columns[4:10])], preserve_index=False)
    scan.feed(batch)
    assert scan.done == 45 and len(scan.arrays["seq"]) == 65_536  # _FIRST_ROWS, not 10^15
    with pytest.raises(ReportError, match=r"^T: 45 rows read where the trace held 1000000000000000 when opened"):
        scan.finish("T", ["forward"])
