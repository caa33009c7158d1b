"""A trace is readable without optrace: the run metadata under the plain Parquet footer key `optrace`, which
DuckDB's parquet_kv_metadata and polars' read_parquet_metadata see, and the rows through a glob of the parts.

Linear(8, 4, bias=False), 3 tokens: forward mm 2 * 3 * 8 * 4 = 192 FLOPs, backward dW mm 192 (x needs no gradient)."""

import json

import duckdb
import polars as pl
import torch

from tracer import Tracer, read_metadata


def _trace(path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4, bias=False)
    with Tracer(path, model=model, tokens=3, flush_rows=4):
        model(torch.randn(3, 8)).sum().backward()
    return str(path)


def test_duckdb_reads_the_metadata_and_the_rows(tmp_path):
    path = _trace(tmp_path / "t")
    parts = f"{path}/part-*.parquet"
    metas = duckdb.sql(f"select decode(value) from parquet_kv_metadata('{parts}') where decode(key) = 'optrace'").fetchall()
    assert len(metas) == read_metadata(path)["parts"] > 1  # every part carries it, once
    newest = max((json.loads(m) for (m,) in metas), key=lambda m: m["parts"])
    assert newest["tokens"] == 3 and newest["parameters"]["weight"]["shape"] == [4, 8] and newest["schema_version"] == 3
    flops = dict(duckdb.sql(f"select phase, sum(flops) from read_parquet('{parts}') where op = 'aten.mm.default' "
                            "group by phase").fetchall())
    assert flops == {"forward": 192, "backward": 192}  # 2 * 3 * 8 * 4 each


def test_polars_reads_the_metadata_and_the_rows(tmp_path):
    path = _trace(tmp_path / "t")
    meta = json.loads(pl.read_parquet_metadata(f"{path}/part-000000.parquet")["optrace"])
    assert meta["trace_id"] == read_metadata(path)["trace_id"]
    df = pl.read_parquet(f"{path}/part-*.parquet")
    mm = df.filter(pl.col("op") == "aten.mm.default")
    assert mm["flops"].to_list() == [192, 192] and len(df) == read_metadata(path)["rows"]
