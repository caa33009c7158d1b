"""Small helpers every report shares: an op's packet, the copy ops, a percentage, an empty typed frame."""

import sys

import numpy as np

__all__ = [
    "ASSEMBLY_OPS",
    "COPY_OPS",
    "ONE_TO_ONE_COPIES",
    "empty_frame",
    "ids",
    "is_copy",
    "lean_memory",
    "packet",
    "pct",
    "unique",
]

# Copies that move one tensor's data, unchanged or cast, into new memory or into another tensor. `to`, `type_as`
# and `contiguous` reach the tracer whole under inference_mode (a bf16 autocast cast of a weight is `aten.to.dtype`
# there, `_to_copy` elsewhere); when they return their input, the row is a view, and is_view says so first.
ONE_TO_ONE_COPIES = frozenset(
    {
        "aten.clone",
        "aten.copy_",
        "aten.copy",
        "aten._to_copy",
        "aten._to_dtype",
        "aten._copy_from",
        "aten._copy_from_and_resize",
        "aten.lift_fresh_copy",
        "aten.to",
        "aten.type_as",
        "aten.contiguous",
    }
)
# Copies that assemble a new tensor from several pieces or repetitions.
ASSEMBLY_OPS = frozenset({"aten.cat", "aten.stack", "aten.repeat"})
COPY_OPS = ONE_TO_ONE_COPIES | ASSEMBLY_OPS


def packet(op):
    """'aten.clone.default' -> 'aten.clone' (the overload packet)."""
    return ".".join(str(op).split(".")[:2])


def is_copy(op):
    """True for the ops that materialise a copy: COPY_OPS and aten.*_copy / aten.*_copy_ (view_copy, _foreach_copy_)."""
    name = packet(op)
    return name in COPY_OPS or name.rstrip("_").endswith("_copy")


def ids(values):
    """A list cell of storage ids (or None) as a list of ints."""
    return [int(i) for i in values] if values is not None else []


def tokens_text(t):
    """Tokens per step as printed: an int, or the mean over steps of different lengths to two decimals."""
    return f"{int(t):,}" if float(t).is_integer() else f"{t:,.2f}"


def pct(part, whole):
    """`part` as a percentage (0-100) of `whole`; 0 where `whole` is 0. Scalars, arrays or Series."""
    if np.ndim(whole) == 0:
        return part * 100.0 / whole if whole else part * 0.0
    whole = np.asarray(whole, dtype=np.float64)
    value = np.asarray(part, dtype=np.float64) * 100.0 / np.where(whole != 0, whole, 1.0)
    value = np.where(whole != 0, value, 0.0)
    pd = sys.modules.get("pandas")  # a Series keeps its index (no Series without pandas imported)
    return pd.Series(value, index=part.index) if pd is not None and isinstance(part, pd.Series) else value


def unique(values):
    """np.unique(values) of a 1-D array of integers, by a sort: numpy 2's np.unique goes through a hash table
    first, 5-8x slower on the hundreds of thousands of storage ids and row numbers the reports hold."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def empty_frame(dtypes):
    """An empty DataFrame with these {column: dtype}, so an empty report keeps its types."""
    import pandas as pd

    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in dtypes.items()})


def lean_memory():
    """Make Arrow hand freed memory back to the system at once, for this process (the CLI calls this).

    mimalloc, Arrow's default pool, and the C library's malloc both keep freed pages: a
    million-row trace read part by part left about its own size of RSS behind. jemalloc
    with no decay returns them; the C library's pool is the fallback."""
    import pyarrow as pa

    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(0)
    except (NotImplementedError, pa.ArrowNotImplementedError):  # a pyarrow built without jemalloc
        pa.set_memory_pool(pa.system_memory_pool())
