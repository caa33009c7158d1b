"""A table as `optrace` prints it, without pandas: the text `DataFrame.to_string(index=False, formatters=...,
na_rep=..., header=...)` gives for the same columns, byte for byte (tests/reports/output/test_table.py checks it on
the report's tables).

    print(render(pa.table({"op": ["aten.mm"], "ops": [3]}), formatters={"ops": human}))

pandas' rules, as pandas 2 and 3 apply them with index=False and the default display options:
  - a value with a formatter is formatter(value); a missing one (null, NaN) is `na_rep`; without one, an int is `{:d}`, a bool `True`/`False`, a text as it is (tab, CR and LF escaped), a
    float column fixed to 6 decimals with the zeros every value ends in trimmed (keeping one), or `{:.6e}` when
    a value is under 1e-6 or one over 1e6 makes a value longer than 12 characters;
  - the header is the column's name, a space before it for a number column without a formatter;
  - every cell right-aligned to its column's widest (header or value), columns joined by one space;
  - no rows: pandas' "Empty DataFrame" lines.
"""

import math
import re

import pyarrow as pa

__all__ = ["descending", "first_row", "render", "values"]

_DIGITS = 6  # pandas' display.precision
_DECIMAL = re.compile(r"^\s*[\+-]?[0-9]+\.[0-9]*$")


def render(table, formatters=None, na_rep="NaN", header=None):
    """The text of `table` (a pyarrow Table), each column through `formatters` ({name: callable}) where it has one."""
    formatters = formatters or {}
    names = table.column_names
    if header is not None and len(header) != len(names):
        raise ValueError(f"Writing {len(names)} cols but got {len(header)} aliases")
    if table.num_rows == 0:
        return f"Empty DataFrame\nColumns: [{', '.join(names)}]\nIndex: []"
    columns = []
    for i, name in enumerate(names):
        column = table.column(i)
        kind = _kind(column.type)
        formatter = formatters.get(name)
        cells = _cells(column.to_pylist(), kind, formatter, na_rep)
        label = (
            header[i]
            if header is not None
            else (" " + name if formatter is None and kind in ("int", "float") else name)
        )
        width = max(len(label), *(len(c) for c in cells))
        columns.append([label.rjust(width), *(c.rjust(width) for c in cells)])
    return "\n".join(" ".join(row) for row in zip(*columns))


def _kind(typ):
    if pa.types.is_integer(typ):
        return "int"
    if pa.types.is_floating(typ):
        return "float"
    if pa.types.is_boolean(typ):
        return "bool"
    return "object"


def _missing(value):
    return value is None or isinstance(value, float) and math.isnan(value)


def _cells(values, kind, formatter, na_rep):
    if kind == "float":
        if formatter is not None:
            return [na_rep if _missing(v) else formatter(v) for v in values]
        return _floats(values, na_rep)
    if kind in ("int", "bool") and not any(v is None for v in values):
        return [formatter(v) if formatter is not None else (f"{v:d}" if kind == "int" else str(v)) for v in values]
    out = []
    for v in values:  # text (and ints or bools with nulls, which pandas holds as objects)
        if _missing(v):  # a null (pandas' text columns hold it as NaN)
            out.append(na_rep)
        elif formatter is not None:
            out.append(str(formatter(v)))
        else:
            out.append(str(v).replace("\t", r"\t").replace("\r", r"\r").replace("\n", r"\n"))
    return out


def _floats(values, na_rep):
    """pandas' FloatArrayFormatter with a fixed width (no formatter)."""
    cells = _trimmed([na_rep if _missing(v) else f"{v:.{_DIGITS}f}" for v in values])
    present = [abs(v) for v in values if not _missing(v)]
    too_long = max(len(c) for c in cells) > _DIGITS + 6
    if any(0 < v < 10**-_DIGITS for v in present) or (too_long and any(v > 1e6 for v in present)):
        cells = _trimmed([na_rep if _missing(v) else f"{v:.{_DIGITS}e}" for v in values])
    return cells


def _trimmed(cells):
    """pandas' _trim_zeros_float: drop the last character of every decimal number while all of them end in 0."""

    def decimal(c):
        return _DECIMAL.match(c) is not None

    while True:
        numbers = [c for c in cells if decimal(c)]
        if not numbers or not all(c.endswith("0") for c in numbers):
            break
        cells = [c[:-1] if decimal(c) else c for c in cells]
    return [c + "0" if decimal(c) and c.endswith(".") else c for c in cells]


def values(table, name):
    """Column `name` of a pyarrow Table as a list of Python values."""
    return table.column(name).to_pylist()


def first_row(table):
    """The first row of a pyarrow Table as {column: value}; None when it has none."""
    return table.slice(0, 1).to_pylist()[0] if table.num_rows else None


def descending(numbers):
    """The order of `numbers` (an array) from the largest down, as pandas' Series.sort_values(ascending=False) gives
    it (its default quicksort: ties in the order that sort leaves them; NaN last)."""
    import numpy as np

    numbers = np.asarray(numbers)
    missing = np.isnan(numbers) if numbers.dtype.kind == "f" else np.zeros(len(numbers), dtype=bool)
    index = np.arange(len(numbers))
    present, at = numbers[~missing][::-1], index[~missing][::-1]
    return np.concatenate([at[present.argsort(kind="quicksort")][::-1], np.flatnonzero(missing)])
