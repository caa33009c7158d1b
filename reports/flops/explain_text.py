"""How the explanation (reports.flops.explain) writes its figures: FLOPs with thousands separators, a ratio to three
places, a percentage, and a string cell as pandas' astype(str) writes it."""

from reports._util import pct


def cell_text(value):
    """A string cell as pandas' astype(str) writes it: "nan" for a null."""
    return "nan" if value is None else str(value)


def figure(x):
    """A figure in whole units with thousands separators: 1,234,567."""
    return f"{x:,.0f}"


def times(part, whole):
    """`part / whole` to three places ("n/a" for a whole of 0): the x in "0.998 x 2·N·T"."""
    return f"{part / whole:.3f}" if whole else "n/a"


def percent(part, whole):
    """`part` as a percentage of `whole` to one place ("n/a" for a whole of 0)."""
    return f"{pct(part, whole):.1f}%" if whole else "n/a"
