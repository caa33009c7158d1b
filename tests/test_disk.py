"""Bytes on disk: each part stores the run metadata once, and stays self-describing."""

import base64
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import reports
from tracer import Tracer, read_metadata
from tracer.schema import METADATA_KEY, part_paths
from tracer.writer import ARROW_SCHEMA_KEY


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
        assert meta["schema_version"] == 3 and meta["parameters"]["weight"]["shape"] == [4, 8]
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
