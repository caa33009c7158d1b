"""The hot-path shortcuts (tests/tracer/native/test_hot_path.py): each case where they could part from the
plain code, with both collectors where a trace is written.

- a row whose packed integers cannot be stored (a custom formula's count below the int64 range) is counted
  in `record_errors` and leaves the rows around it whole (`Tracer._record`: the packing can fail);
- the spliced marker (tracer/schema.py `marker_file`) is pyarrow's own for texts of unusual length and
  content, and reads back;
- the facts kept across traces (tracer.recording.dispatch `_op_info`) follow a custom op that is destroyed and
  defined again with another schema, and a formula registered while a trace runs (before the op's first
  call in it), as the per-trace facts of before did.
"""

import json
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import reports
from tracer import Tracer, read_metadata, register_flop_formula, schema
from tracer.flops.formulas import _registry
from tracer.native import loader as native

NS = "optrace_review"


@pytest.fixture(params=["python", "compiled"])
def collector(request, monkeypatch):
    """Each collector in turn (the compiled one where it was built: tests/tracer/native/test_collector.py fails without it)."""
    monkeypatch.setenv(native.ENV, request.param)
    if request.param == "compiled" and native.choose()[0] is None:
        pytest.skip("the compiled collector was not built")
    return request.param


@pytest.fixture
def library():
    """A fresh custom-op namespace, destroyed (its ops and formulas gone) after the test."""
    made = []

    def define(schema_text, impl):
        lib = torch.library.Library(NS, "DEF")
        lib.define(schema_text)
        lib.impl(schema_text.split("(")[0], impl, "CompositeExplicitAutograd")
        made.append(lib)
        return lib

    yield define
    for packet in [p for p in _registry if getattr(p, "_qualified_op_name", "").startswith(NS + "::")]:
        del _registry[packet]
    for lib in made:
        lib._destroy()


def _packet(name):
    return getattr(getattr(torch.ops, NS), name)


def test_a_row_past_int64_is_an_error_and_the_rows_around_it_stay_whole(tmp_path, collector, library):
    """A formula counting below -2**63 (a bug in the user's formula) cannot be packed: the row is dropped
    and counted, and the next row's shapes are its own, not the dropped row's."""
    library("negative(Tensor x) -> Tensor", lambda x: x.clone())
    register_flop_formula(_packet("negative"))(lambda x, out_shape=None: -(2**64))
    torch.manual_seed(0)
    a, b, c = torch.randn(2, 5), torch.randn(3, 4), torch.randn(4, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Tracer(tmp_path / collector):
            _packet("negative")(a)
            out = torch.mm(b, c)
    assert torch.equal(out, b @ c)
    assert len(caught) == 1 and "could not record optrace_review.negative.default" in str(caught[0].message)
    assert read_metadata(tmp_path / collector)["record_errors"] == 1
    with pytest.warns(UserWarning, match=r"1 op\(s\) ran but were not recorded; reporting the 1 rows"):
        df = reports.load(tmp_path / collector)
    mm = df[df["op"] == "aten.mm.default"]
    assert len(mm) == 1
    assert [list(s) for s in mm["input_shapes"].iloc[0]] == [[3, 4], [4, 2]]
    assert [list(s) for s in mm["output_shapes"].iloc[0]] == [[3, 2]]
    assert int(mm["flops"].iloc[0]) == 48  # 2 * 3 * 4 * 2 = 48


# lengths about the Thrift varint's steps (127 | 128, 16383 | 16384) and the marker's 4,096
TEXTS = [json.dumps({"run_name": "r" * n}) for n in (1, 100, 113, 114, 115, 4070, 16360, 16380)] + [
    json.dumps({"run_name": "Größe ✓ 実行"}, ensure_ascii=False),  # multi-byte UTF-8: a byte length, not a char one
    json.dumps({"run_name": 'a "quoted" \\ name\n'}),
    "x" * 15,  # under 16 bytes: written by pyarrow, not spliced
    "optrace-marker-filler:" * 3,  # the filler itself
    "",
]


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_spliced_marker_is_pyarrows_and_reads_back(text):
    data = schema.marker_file(text)
    assert data == schema._marker_file(text.encode())
    assert schema.marker_json(data) == text.encode()
    assert pq.read_table(pa.BufferReader(data)).num_rows == 0


def test_a_long_run_name_reaches_the_marker_and_every_reader(tmp_path):
    """The marker at its padded length (4,096) and the metadata of a trace with a long non-ASCII run name."""
    import duckdb
    import polars as pl

    name = "Größe-✓-" * 300  # 2,400 characters, 3,600 bytes of UTF-8
    with Tracer(tmp_path / "t", run_name=name):
        torch.ones(2) + 1
    assert read_metadata(tmp_path / "t")["run_name"] == name
    facts = schema.marker_facts(tmp_path / "t")
    assert facts["rows"] == 2 and facts["complete"] is True  # ones, add
    marker = str(tmp_path / "t" / schema.MARKER_NAME)
    assert duckdb.sql(f"select count(*) from read_parquet('{marker}')").fetchall() == [(0,)]
    assert pl.read_parquet(marker).height == 0


def test_a_redefined_custom_op_gets_its_own_facts(tmp_path, library):
    """An op destroyed and defined again under the same name with another schema (here in place) is
    described anew, not from the facts kept for the first one."""
    lib = library("twice(Tensor x) -> Tensor", lambda x: x * 2)
    a = torch.ones(3)
    with Tracer(tmp_path / "first"):
        _packet("twice")(a)
    lib._destroy()
    library("twice(Tensor(a!) x) -> Tensor(a!)", lambda x: x.mul_(2))
    with Tracer(tmp_path / "second"):
        _packet("twice")(a)
    assert torch.equal(a, torch.full((3,), 2.0))
    first, second = (reports.load(tmp_path / n) for n in ("first", "second"))
    assert first[first["op"] == f"{NS}.twice.default"]["inplace"].tolist() == [False]
    assert second[second["op"] == f"{NS}.twice.default"]["inplace"].tolist() == [True]


def test_a_formula_registered_during_a_trace_counts_from_the_op_s_first_call_in_it(tmp_path, library):
    """The facts of an op are made at its first call in a trace, as they were per trace before: a formula
    registered in the trace before that call counts, also when an earlier trace kept the op's facts."""
    library("scaled(Tensor x) -> Tensor", lambda x: x * 3)
    a = torch.ones(4)
    with Tracer(tmp_path / "first"):
        _packet("scaled")(a)
    with Tracer(tmp_path / "second"):
        register_flop_formula(_packet("scaled"), kind="elementwise")(lambda x, out_shape=None: x[0])
        _packet("scaled")(a)
    first, second = (reports.load(tmp_path / n) for n in ("first", "second"))
    row = f"{NS}.scaled.default"
    assert first[first["op"] == row]["flop_kind"].tolist() == ["unknown"]
    assert second[second["op"] == row]["flops"].tolist() == [4]  # x[0]: 4 elements


def test_both_collectors_write_the_same_trace_around_a_row_past_int64(tmp_path, monkeypatch, library):
    from tests.tracer.native.test_collector import _assert_identical

    library("negative(Tensor x) -> Tensor", lambda x: x.clone())
    register_flop_formula(_packet("negative"))(lambda x, out_shape=None: -(2**64))

    def make():
        a, b, c = torch.randn(2, 5), torch.randn(3, 4), torch.randn(4, 2)
        return None, lambda: (torch.mm(b, c), _packet("negative")(a), torch.mm(b, c).relu_())

    if native.choose()[0] is None:
        pytest.skip("the compiled collector was not built")
    with pytest.warns(UserWarning, match="could not record optrace_review.negative.default"):
        df = _assert_identical(tmp_path, monkeypatch, make)
    assert df["op"].tolist() == ["aten.mm.default", "aten.mm.default", "aten.relu_.default"]


def test_an_interrupt_in_a_formula_reaches_the_program_and_the_trace_keeps_its_rows(tmp_path, collector, library):
    """Ctrl-C while a row is half made (its tensors appended, its integers not): the program gets the
    KeyboardInterrupt, the half row is dropped, the trace closes incomplete with the rows before it."""
    library("interrupted(Tensor x) -> Tensor", lambda x: x.clone())

    def interrupt(x, out_shape=None):
        raise KeyboardInterrupt

    register_flop_formula(_packet("interrupted"))(interrupt)
    with pytest.raises(KeyboardInterrupt):
        with Tracer(tmp_path / "t"):
            torch.ones(2, 3) + 1
            _packet("interrupted")(torch.ones(5))
    meta = read_metadata(tmp_path / "t")
    assert meta["complete"] is False and meta["error"].startswith("KeyboardInterrupt")
    facts = schema.marker_facts(tmp_path / "t")
    assert facts["complete"] is False and facts["rows"] == 3  # ones, add, and the interrupted op's ones
    with pytest.warns(UserWarning, match="incomplete"):
        df = reports.load(tmp_path / "t")
    assert df["op"].tolist() == ["aten.ones.default", "aten.add.Tensor", "aten.ones.default"]
    assert [[list(t) for t in s] for s in df["output_shapes"]] == [[[2, 3]], [[2, 3]], [[5]]]


def test_a_module_built_before_extend_runs_the_python_path(tmp_path, monkeypatch, compiled):
    """A `tracer/native/_collector.so` built from the source before `extend` was added (an install updated without
    `python -m tracer.native.build_ext`; the same torch) is not used: the trace is written by the Python path and
    its metadata says why, where entering the Tracer failed on `native.extend`."""
    import sys
    import types

    import tracer.native

    older = types.ModuleType("tracer.native._collector")
    older.torch_version, older.collect = compiled.torch_version, compiled.collect  # no `extend`
    monkeypatch.setitem(sys.modules, "tracer.native._collector", older)
    monkeypatch.setattr(tracer.native, "_collector", older, raising=False)
    monkeypatch.setattr(native, "_imported", None)
    with Tracer(tmp_path / "t"):
        torch.ones(2) + 1
    meta = read_metadata(tmp_path / "t")
    assert meta["collector"]["path"] == "python" and "extend" in meta["collector"]["reason"]
    assert meta["rows"] == 2 and meta["record_errors"] == 0  # ones, add


def test_ctrl_c_just_after_a_row_is_packed_keeps_its_frees_with_it(tmp_path, collector, monkeypatch):
    """Ctrl-C lands between two bytecodes: here just after a row's integers were packed, before anything
    else (a stand-in packer that packs, then raises). The row is kept with the frees it counts, so the
    rows after it keep theirs: the trace has no row claiming a free another row holds."""
    from tracer.recording.timing import WallTimer
    from tracer.store.writer import extend as writer_extend

    packed = []

    def pack_then_interrupt(buffer, *values):
        writer_extend(buffer, *values)
        packed.append(values)
        if len(packed) == 2:
            raise KeyboardInterrupt

    class InterruptingTimer(WallTimer):
        """The compiled hook packs the row in C++, where no bytecode runs: the first Python after the packed row
        is the timer's bind, which a timer that binds calls (tracer/native/_dispatch.cpp `record`)."""

        binds = True

        def bind(self, rows):
            packed.append(len(rows))
            if len(packed) == 2:
                raise KeyboardInterrupt

    if collector == "compiled":  # every timer the trace makes, the first device's too
        monkeypatch.setattr("tracer.recording.start.make_timer", lambda timing, device: InterruptingTimer())
    tr = Tracer(tmp_path / "t")
    with pytest.raises(KeyboardInterrupt):
        with tr:
            if collector == "python":
                tr._extend = pack_then_interrupt
            a = torch.ones(3)
            del a  # freed before the next op: that row's freed_storage_ids
            torch.ones(2)
    with pytest.warns(UserWarning, match="incomplete"):
        df = reports.load(tmp_path / "t")
    assert df["op"].tolist() == ["aten.ones.default", "aten.ones.default"]
    first_storage = df["output_storage_ids"].iloc[0].tolist()
    assert [s.tolist() for s in df["freed_storage_ids"]] == [[], first_storage]  # the first row's storage


def test_the_compiled_hook_closed_during_an_op_finishes_it_first(tmp_path, library):
    """The compiled hook's state closed while an op runs inside it (by a formula here; another thread's Tracer exit
    in a program) is dropped once that op returns (tracer/native/_dispatch.cpp `Dispatch_close`): the op's row is whole,
    and the ops after it go to the Python hook, which records them."""
    if native.choose()[0] is None:
        pytest.skip("the compiled collector was not built")
    tr = Tracer(tmp_path / "t")

    def closing(x, out_shape=None):
        tr._hot.close()
        return 5

    library("closing(Tensor x) -> Tensor", lambda x: x.clone())
    register_flop_formula(_packet("closing"))(closing)
    x = torch.ones(5)
    with tr:
        y = _packet("closing")(x)
        z = y * 2
    assert torch.equal(z, torch.full((5,), 2.0))
    df = reports.load(tmp_path / "t")
    assert df["op"].tolist() == [f"{NS}.closing.default", "aten.mul.Tensor"]
    assert df["flops"].tolist() == [5, 5]  # the formula's 5; one per output element of the mul: 5
    meta = read_metadata(tmp_path / "t")
    assert meta["record_errors"] == 0 and meta["collector"]["compiled_rows"] == 1  # the mul: the Python hook's
