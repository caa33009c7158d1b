"""reports.arrays: each conversion gives what the pyarrow call it stands in for gives (those calls import pandas;
this test process may), nulls, bools, slices and chunks included."""

import math

import numpy as np
import pyarrow as pa
import pytest

from reports.arrays import array_of, arrow_of, numpy_of, scalar, strings, values_of, whole

_CASES = [
    (pa.int64(), [1, None, 3]),
    (pa.int32(), [7, None]),
    (pa.uint8(), [1, None]),
    (pa.float32(), [1.5, None]),
    (pa.float64(), [1.0, float("nan")]),
    (pa.bool_(), [True, None, False]),
    (pa.bool_(), [True, False] * 9),  # past one byte of the bitmap
    (pa.string(), ["a", None]),
    (pa.int64(), []),
]


def _same(got, want):
    assert got.dtype == want.dtype and len(got) == len(want)
    for a, b in zip(got.tolist(), want.tolist()):
        assert a == b or a is b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("kind,items", _CASES)
def test_values_of_gives_what_to_numpy_gives(kind, items):
    """Integers with a null as float64 with NaN, bools and strings with a null as objects with None, of an Array,
    a slice of it (an offset into its buffers) and a ChunkedArray of both."""
    array = pa.array(items, kind)
    for data in (array, array.slice(1), pa.chunked_array([array, array.slice(1)], kind), pa.chunked_array([], kind)):
        want = data.to_numpy() if isinstance(data, pa.ChunkedArray) else data.to_numpy(zero_copy_only=False)
        _same(values_of(data), want)


def test_numpy_of_stands_a_value_for_a_null():
    assert numpy_of(pa.array([1, None, 3], pa.int32()), null=-1).tolist() == [1, -1, 3]
    assert numpy_of(pa.array([True, None, False]).slice(1), null=True).tolist() == [True, False]
    with pytest.raises(ValueError, match="1 null"):
        numpy_of(pa.array([1, None]))


@pytest.mark.parametrize(
    "values", [np.array([True, False, True] * 5), np.arange(5, dtype=np.int32), np.linspace(0, 1, 4)]
)
def test_arrow_of_makes_what_pyarrow_array_makes(values):
    mask = np.arange(len(values)) % 2 == 0  # items 0, 2, ... null
    assert arrow_of(values).equals(pa.array(values))
    assert arrow_of(values, mask).equals(pa.array(values, mask=mask))
    assert arrow_of(values[1:]).equals(pa.array(values[1:]))  # a view that starts past the buffer's start


def test_array_of_and_strings_make_what_pyarrow_array_makes():
    assert array_of([1, None, 2**40], pa.int64()).equals(pa.array([1, None, 2**40], pa.int64()))
    nan = array_of([1.5, None, float("nan")], pa.float64())
    assert nan.null_count == 1 and math.isnan(nan[2].as_py())  # a NaN stays a NaN, None is the null
    assert array_of([True, None], pa.bool_()).equals(pa.array([True, None], pa.bool_()))
    assert strings(["a", None, "bc"]).equals(pa.array(["a", None, "bc"], pa.string()))
    assert strings([]).equals(pa.array([], pa.string()))


@pytest.mark.parametrize(
    "value,kind", [(3, pa.int64()), (False, pa.bool_()), ("x", pa.string()), (2.0**63, pa.float64())]
)
def test_scalar_makes_what_pyarrow_scalar_makes(value, kind):
    assert scalar(value, kind).equals(pa.scalar(value, kind))


@pytest.mark.parametrize("kind,items", _CASES)
def test_whole_gives_what_combine_chunks_gives(kind, items):
    """Of no chunks (a query of no rows: combine_chunks builds its empty Array through pyarrow.array, importing
    pandas), one chunk and two, whatever the type (lists included)."""
    array = pa.array(items, kind)
    for data in (
        pa.chunked_array([], kind),
        pa.chunked_array([array]),
        pa.chunked_array([array, array.slice(1)]),
        pa.chunked_array([], pa.list_(kind)),
    ):
        got, want = whole(data), data.combine_chunks()
        assert isinstance(got, pa.Array) and got.type == want.type
        assert repr(got.to_pylist()) == repr(want.to_pylist())  # (a NaN equal to a NaN)


def test_list_lengths_values_and_nulls_give_what_the_compute_functions_give():
    """list_lengths, list_values and nulls_of read offsets and bitmaps: what pc.list_value_length, pc.list_flatten and
    is_null give, of a slice (offsets not from 0), a ChunkedArray, a large list and a list with a null cell."""
    import pyarrow.compute as pc

    from reports.arrays import list_lengths, list_values, nulls_of

    cells = pa.array([[1, 2], [], None, [3], [4, 5, 6]], pa.list_(pa.int64()))
    for data in (
        cells,
        cells.slice(3),  # [3], [4, 5, 6]: its offsets start at 3
        pa.chunked_array([cells, cells.slice(1, 2)]),
        pa.array([[7], [8, 9]], pa.large_list(pa.int64())),
    ):
        want = pc.list_value_length(data)
        assert list_lengths(data, null=0).tolist() == numpy_of(want, null=0).tolist()
        assert list_lengths(data, null=0).dtype == numpy_of(want, null=0).dtype  # int32; int64 for a large list
        assert list_values(data).tolist() == numpy_of(pc.list_flatten(data)).tolist()
        assert nulls_of(data).tolist() == numpy_of(data.is_null()).tolist()
    assert list_values(cells.slice(3)).tolist() == [3, 4, 5, 6]  # 2 + 0 + 0 items before the slice
    assert list_lengths(cells, null=-1).tolist() == [2, 0, -1, 1, 3]
    with pytest.raises(ValueError, match="1 null cell"):
        list_lengths(cells)
