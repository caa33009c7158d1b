"""Loading and validation: Parquet parts in, one checked DataFrame out (imports only the base modules and tracer.schema)."""
