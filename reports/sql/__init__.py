"""Reports on DuckDB, embedded: the report tables as SQL views over a trace's Parquet parts (views.sql),
run by engine.py and shaped like the pandas tables by tables.py."""
