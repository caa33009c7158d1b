"""Bytes on disk: each part stores the run metadata once, and stays self-describing."""

import base64
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import reports
from tracer import Tracer, read_metadata
from tracer.schema import METADATA_KEY, SCHEMA_VERSION, part_paths
from tracer.store.writer import ARROW_SCHEMA_KEY


def _trace(path):
    model = torch.nn.Linear(8, 4)
    with Tracer(path, model=model, flush_rows=2):
        model(torch.ones(3, 8)).sum().backward()
    return model


def test_each_part_stores_the_run_metadata_once(tmp_path):
    path = tmp_path / "t"
    _trace(path)
    parts = part_paths(path)
    assert len(parts) > 1  # flush_rows=2: several parts, each self-describing
    for part in parts:
        footer = pq.ParquetFile(part).metadata.metadata
        assert sorted(footer) == sorted([ARROW_SCHEMA_KEY, METADATA_KEY])  # the plain key every reader sees
        stored = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(footer[ARROW_SCHEMA_KEY])))
        assert stored.metadata is None  # not a second copy inside the Arrow schema
        meta = json.loads(footer[METADATA_KEY])
        assert meta["schema_version"] == SCHEMA_VERSION == 4 and meta["parameters"]["weight"]["shape"] == [4, 8]
        raw = open(part, "rb").read()
        assert raw.count(b'"trace_id"') == 1  # stored once, as plain JSON
    assert read_metadata(path)["complete"] is True


def test_dictionary_columns_round_trip(tmp_path):
    path = tmp_path / "t"
    _trace(path)
    table = pq.read_table(path)
    assert pa.types.is_dictionary(table.schema.field("op").type)
    assert pa.types.is_dictionary(table.schema.field("input_dtypes").type.value_type)
    df = pd.read_parquet(path)
    assert isinstance(df["op"].dtype, pd.CategoricalDtype) and "aten.mm.default" in set(df["op"])
    loaded = reports.load(path)
    mm = loaded[loaded["op"] == "aten.addmm.default"].iloc[0]
    assert len(loaded) == len(df) and list(mm["input_dtypes"]) == ["float32"] * 3


def test_parts_of_4096_rows_or_more_are_zstd_and_smaller_ones_snappy(tmp_path):
    """tracer.store.writer ZSTD_ROWS: zstd's per-column contexts cost a small part more time than its bytes are worth.
    4,096 adds of one tensor (one row each) make a zstd part; 4,095 a snappy one; the reports read both alike."""
    x = torch.ones(3)
    codecs, rows = {}, {}
    for n in (4095, 4096):
        with Tracer(tmp_path / f"t{n}", flush_rows=8192):
            for _ in range(n):
                x.add(1)
        (part,) = part_paths(tmp_path / f"t{n}")
        meta = pq.ParquetFile(part).metadata
        codecs[n] = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
        rows[n] = len(reports.load(tmp_path / f"t{n}"))
    assert codecs == {4095: {"SNAPPY"}, 4096: {"ZSTD"}}
    assert rows == {4095: 4095, 4096: 4096}
