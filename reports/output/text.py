"""Formatting for people, in one place: numbers with SI prefixes, bytes in binary units, percentages,
JSON-ready numbers, a table's column formatters, and names from a trace made safe for a terminal.

The `optrace` command and every section it prints use these; no analysis module does."""

import math
import re

__all__ = ["column_formatters", "human", "human_bytes", "human_seconds", "json_number", "percent", "printable"]


def human(value, unit=""):
    """1234567 -> '1.23 M'; None -> 'N/A'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "N/A"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def human_bytes(value):
    if value is None:
        return "N/A"
    for factor, prefix in ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{int(value)} B"


def human_seconds(value):
    """0.01234 -> '12.3 ms'; 2.5 -> '2.5 s'; None or NaN -> 'N/A'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "N/A"
    if value == 0:
        return "0 s"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def json_number(value):
    """A JSON-ready number: numpy scalars to Python, NaN to None."""
    if value is None:
        return None
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
    return value


def percent(value):
    value = json_number(value)
    return "N/A" if value is None else f"{100 * value:.1f}%"


def column_formatters(frame):
    """{column: formatter} of a table's columns by their names (and, for names, their type): `frame` a pyarrow Table
    or a DataFrame."""
    found = {}
    for column in frame.column_names if hasattr(frame, "column_names") else frame.columns:
        if column.endswith("_ratio") or column == "ratio":
            found[column] = lambda v: "" if v is None or v != v else f"{v:.3f}"
        elif column == "ops" or column.startswith("ops_"):  # counts: 506, 1.2 k, never '506.0'
            found[column] = lambda v: "N/A" if v is None or v != v else human(v)
        elif column.startswith("time_") and not column.endswith("_pct"):  # seconds
            found[column] = human_seconds
        elif column.startswith("traced_us"):  # microseconds
            found[column] = lambda v: human_seconds(None if v is None or v != v else v * 1e-6)
        elif column.endswith("_pct"):
            found[column] = lambda v: "N/A" if v is None or v != v else f"{v:.1f}%"
        elif "flops" in column:
            found[column] = lambda v: human(v)
        elif "bytes" in column:
            found[column] = lambda v: "N/A" if v is None or v != v else human_bytes(v)
        elif not _numeric(frame, column):
            found[column] = printable  # names from the trace: control characters escaped
    return found


def _numeric(frame, column):
    """Whether a column holds numbers or bools (pandas' is_numeric_dtype, for a DataFrame's or an Arrow type)."""
    if hasattr(frame, "schema"):
        import pyarrow as pa

        typ = frame.schema.field(column).type
        return (
            pa.types.is_integer(typ)
            or pa.types.is_floating(typ)
            or pa.types.is_boolean(typ)
            or pa.types.is_decimal(typ)
        )
    import pandas as pd

    return pd.api.types.is_numeric_dtype(frame[column].dtype) or pd.api.types.is_bool_dtype(frame[column].dtype)


# C0 and C1 controls, DEL, and the Unicode line separators and bidirectional overrides: a name holding one
# could move the terminal's cursor, recolour it, reorder the line or start a forged line of the report.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text):
    """`text` (a name from a trace: op, module, run, device, path) with its control characters escaped
    as Python writes them ('\\n', '\\x1b', '\\u202e'), for text meant for a terminal."""
    text = str(text)
    return (
        _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
        if _CONTROL.search(text)
        else text
    )
