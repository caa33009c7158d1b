"""Pandas implementations of the report tables the SQL views replaced, kept as test oracles."""
