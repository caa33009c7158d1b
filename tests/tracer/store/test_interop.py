"""A trace is readable without optrace: the run metadata under the plain Parquet footer key `optrace`, which
DuckDB's parquet_kv_metadata and polars' read_parquet_metadata see, and the rows through a glob of the parts or
the trace directory itself (its marker is a zero-row Parquet file every engine skips or reads as no rows).

Linear(8, 4, bias=False), 3 tokens: forward mm 2 * 3 * 8 * 4 = 192 FLOPs, backward dW mm 192 (x needs no gradient).
11 rows: randn; forward t, mm, sum, ones_like; backward expand, t, mm, t, t, detach (3 parts of at most 4 rows)."""

import os

import duckdb
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

from tracer import Tracer
from tracer.schema import MARKER_NAME
from tracer.store.directory import LOCK_NAME


def _trace(path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4, bias=False)
    with Tracer(path, model=model, tokens=3, flush_rows=4):
        model(torch.randn(3, 8)).sum().backward()
    return str(path)


def _two_ranks(path, monkeypatch):
    """A trace of two ranks (path/rank=0, path/rank=1), each rank's Tracer told its rank by torchrun's variables."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        _trace(path)
    return str(path)


ENGINES = {  # each reads the trace directory itself, as a user would, into pandas
    "pandas": lambda d: pd.read_parquet(d),
    "pyarrow": lambda d: pq.read_table(d).to_pandas(),
    "duckdb": lambda d: duckdb.sql(f"select * from read_parquet('{d}/**/*.parquet', hive_partitioning=true)").df(),
    "polars": lambda d: pl.read_parquet(d).to_pandas(),
    "polars_hive": lambda d: pl.scan_parquet(d, hive_partitioning=True).collect().to_pandas(),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_reads_a_trace_directory(tmp_path, engine):
    path = _trace(tmp_path / "t")
    open(os.path.join(path, LOCK_NAME), "w").close()  # the empty lock file a killed writer leaves
    assert sorted(os.listdir(path)) == [
        LOCK_NAME,
        MARKER_NAME,
        "part-000000.parquet",
        "part-000001.parquet",
        "part-000002.parquet",
    ]
    df = ENGINES[engine](path)
    assert len(df) == 11  # the 11 rows of the module docstring: the marker adds none
    assert df.loc[df["op"] == "aten.mm.default", "flops"].tolist() == [192, 192]  # 2 * 3 * 8 * 4 each


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_reads_a_two_rank_trace_directory_with_its_rank_column(tmp_path, monkeypatch, engine):
    path = _two_ranks(tmp_path / "t", monkeypatch)
    assert sorted(os.listdir(path)) == ["rank=0", "rank=1"]
    df = ENGINES[engine](path)
    assert len(df) == 22  # 2 ranks * 11 rows
    assert df.groupby(df["rank"].astype(int))["flops"].sum().to_dict() == {
        0: 396,
        1: 396,
    }  # 192 + 192 + 12 (sum) a rank
