"""reports.sql.per_step.floats: a view's summed column as float64, as numpy converts it (no pandas)."""

import math

import pyarrow as pa

from reports.sql.per_step import floats


def test_floats_rounds_an_int64_past_2_53_and_keeps_nulls():
    """A FLOP sum past 2**53 is rounded to the nearest float64, as numpy's astype rounds it (a safe Arrow cast
    raised on it); a null is NaN; a DECIMAL sum (DuckDB's HUGEINT) converts too."""
    got = floats(pa.array([2**60 + 1, None, 3], pa.int64()))
    assert got.dtype == "float64" and got[0] == 2.0**60 and math.isnan(got[1]) and got[2] == 3.0  # 2**60 + 1 -> 2**60
    assert floats(pa.array([12], pa.decimal128(38, 0))).tolist() == [12.0]
