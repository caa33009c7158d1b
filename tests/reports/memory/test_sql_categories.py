"""reports.memory.sql_categories.by_category, what `optrace report`'s memory section and headline print: the storage
lifetime model run without pandas (a pyarrow.Table out), checked in a child process."""

import ast
import json
import subprocess
import sys

import torch

import reports
from tests.helpers import ROOT, gpt_trace
from tracer import Tracer

# The child runs the memory path on its own: `reports` without its front door (reports/__init__ imports the
# library's tables, which return pandas DataFrames), and a reports.sql.engine.Trace opened before the memory modules
# are imported. It records each call into pandas made from code under reports/memory/ (sys.setprofile), each call
# into pyarrow's pandas shim (which imports pandas in a process without it: reports.arrays), and the
# modules of reports/memory/, and those imported for the memory path, that hold pandas.
_CHILD = """
import json, os, sys, types

root, path = sys.argv[1], sys.argv[2]
package = types.ModuleType("reports")
package.__path__ = [os.path.join(root, "reports")]
sys.modules["reports"] = package
from reports.memory.row_scan import Scan  # what the Trace's read feeds (as `optrace report` opens it)
from reports.sql.engine import Trace

trace = Trace(path, keep=(Scan,))
before = set(sys.modules)
pandas = sys.modules.get("pandas")
pandas_dir = os.path.dirname(pandas.__file__) if pandas else None
memory_dir = os.path.join(root, "reports", "memory") + os.sep
calls = []
SHIM = os.path.join("pyarrow", "pandas_compat.py")


def watch(frame, event, arg):
    if pandas_dir is None or not frame.f_back:
        return
    if event == "call" and frame.f_code.co_filename.endswith(SHIM):  # pyarrow.array asks it, each call
        calls.append(f"pyarrow's pandas shim: {frame.f_code.co_name}")
    elif event == "call" and frame.f_code.co_filename.startswith(pandas_dir):
        caller = frame.f_back.f_code.co_filename
        if caller.startswith(memory_dir):
            calls.append(f"{os.path.basename(caller)} -> {frame.f_code.co_name}")
    elif event == "c_call" and (getattr(arg, "__module__", None) or "").startswith("pandas"):
        if frame.f_code.co_filename.startswith(memory_dir):
            calls.append(f"{os.path.basename(frame.f_code.co_filename)} -> {arg.__name__}")


sys.setprofile(watch)
from reports.memory.sql_categories import by_category

table = by_category(trace)
sys.setprofile(None)
checked = sorted(n for n in sys.modules if n.startswith("reports.memory") or n not in before and n.startswith("reports"))
holding = [n for n in checked if any(v is pandas for v in vars(sys.modules[n]).values())] if pandas else []
print(json.dumps({
    "type": type(table).__module__ + "." + type(table).__name__,
    "table": table.to_pylist() if hasattr(table, "to_pylist") else None,
    "checked": checked,
    "holding_pandas": holding,
    "pandas_calls": sorted(set(calls)),
    "pandas_loaded": "pandas" in sys.modules,
}))
"""


def _trace(path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 8)  # weight 8 x 4 + bias 8 float32: 128 + 32 bytes
    x = torch.randn(2, 4)  # the batch, made before the trace: 32 bytes
    with Tracer(path, model=model, tokens=2, run_name="lin"):
        model(x).pow(2).sum().backward()
    return path


def _child(path):
    found = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT), str(path)], capture_output=True, text=True, cwd=str(ROOT), timeout=120
    )
    assert found.returncode == 0, found.stderr[-3000:]
    return json.loads(found.stdout.strip().splitlines()[-1])


def test_the_memory_categories_of_the_report_run_without_pandas(tmp_path):
    path = _trace(tmp_path / "lin")
    got = _child(path)
    assert got["type"] == "pyarrow.lib.Table"
    assert {"reports.memory.lifetimes", "reports.memory.live", "reports.memory.sql_categories"} <= set(got["checked"])
    assert got["holding_pandas"] == []  # no module of the memory path (nor one it imported) imports pandas
    assert got["pandas_calls"] == []  # ... nor calls it
    want = reports.by_category(reports.load(path))  # the library's DataFrame: the same rows
    assert got["table"] == want.to_dict("records")
    rows = {r["category"]: r["bytes"] for r in got["table"]}
    assert rows["parameters"] == 8 * 4 * 4 + 8 * 4  # 160
    assert rows["inputs"] == 2 * 4 * 4  # the batch: 32


# modules of the report's memory path, and the pyarrow calls that import pandas (pyarrow's pandas shim) that the
# child's profile cannot see (Cython): reports.arrays stands in for them
_PATH = ("sql_categories", "row_scan", "lifetimes", "live", "run_rows", "id_space")
_SHIM_CALLS = {"to_numpy", "fill_null", "empty_table", "array", "scalar", "table"}


def test_the_memory_path_calls_no_pyarrow_function_that_imports_pandas():
    found = []
    for name in _PATH:
        path = ROOT / "reports" / "memory" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SHIM_CALLS:
                base = node.func.value
                if node.func.attr in ("array", "scalar", "table") and not (
                    isinstance(base, ast.Name) and base.id == "pa"
                ):
                    continue  # pa.array, pa.scalar, pa.table; any .to_numpy(), .fill_null(), .empty_table()
                found.append(f"{name}.py:{node.lineno} .{node.func.attr}")
    assert found == []


def test_the_report_memory_path_loads_no_pandas_at_all(tmp_path):
    """The Trace's read of the parts (reports.sql.rowpass) and the memory categories of the example GPT's trace, in
    a process that never loads pandas (on main, rowpass's `seq` column to numpy loaded it through pyarrow)."""
    code = (
        "import sys\nfrom reports.memory.row_scan import Scan\nfrom reports.memory.sql_categories import by_category\n"
        "from reports.sql.engine import Trace\n"
        f"table = by_category(Trace({str(gpt_trace(tmp_path / 'gpt'))!r}, keep=(Scan,)))\n"
        "print(table.num_rows > 0, 'pandas' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert found.stdout.strip() == "True False", found.stderr[-2000:]


def _scanned_lists(ids, seq=(0, 1, 2), step=(0, 0, 0)):
    """The Lists a row_scan.Scan makes of three rows naming `ids` (a, b, c: a the output of row 0 with 64 bytes;
    row 1 reads a and b, writes c with 16 bytes and frees a; row 2 reads c and frees c and b), fed row 0 then rows
    1 and 2, and the columns left."""
    import numpy as np
    import pyarrow as pa

    from reports.memory.row_scan import Scan

    a, b, c = ids
    ints, lists = pa.int64(), pa.list_(pa.int64())
    batch = pa.table(
        {
            "seq": pa.array(seq, ints),
            "step": pa.array(step, ints),
            "phase": pa.array(["forward"] * 3),
            "bytes_allocated": pa.array([64, 16, 0], ints),
            "live_bytes": pa.array([64, 80, 0], ints),
            "input_storage_ids": pa.array([[], [a, b], [c]], lists),
            "output_storage_ids": pa.array([[a], [c], []], lists),
            "output_storage_bytes": pa.array([[64], [16], []], lists),
            "freed_storage_ids": pa.array([[], [a], [c, b]], lists),
        }
    )
    scan = Scan(3)
    scan.feed(batch.slice(0, 1))
    scan.feed(batch.slice(1))
    columns = scan.finish("T", ["forward"])
    return scan.lists(columns, np.zeros(0, np.int64), None), columns


def test_the_scanned_lists_hold_ids_rows_and_positions_in_int32_where_they_fit():
    """Scan.lists gave int64 ids, rows and flat positions (34 MB a million rows); int32 where they fit now (26 MB),
    and the per-row counts its offsets were made of are let go (12 MB)."""
    got, columns = _scanned_lists((5, 7, 8))
    assert got.seen.tolist() == [5, 7, 8]
    assert got.first_row.tolist() == [0, 1, 1]  # a made by row 0, b read by row 1, c made by row 1
    assert got.as_output.tolist() == [True, False, True]
    assert got.first_at.tolist() == [0, 1, 1]  # a: output 0; b: row 1's second input (flat input 1); c: output 1
    assert got.free_ids.tolist() == [5, 8, 7] and got.free_rows.tolist() == [1, 2, 2]
    assert got.known.tolist() == [[5, 8], [64, 16]] and got.top == 8
    for field in ("seen", "first_row", "first_at", "free_ids", "free_rows", "in_offsets", "out_offsets"):
        assert getattr(got, field).dtype == "int32", field
    assert not {"n_inputs", "n_outputs", "n_freed"} & set(columns)


def test_the_scanned_lists_keep_ids_past_2_31_exact():
    """An id past int32 (2**31 + 5, 2**31 + 7: a damaged trace's, far past the Scan's dense range) keeps the ids
    in int64, value for value."""
    a, b = 2**31 + 5, 2**31 + 7
    got, _ = _scanned_lists((a, b, 8))
    assert got.seen.tolist() == [8, a, b] and got.seen.dtype == "int64"
    assert got.first_row.tolist() == [1, 0, 1] and got.first_at.tolist() == [1, 0, 1]
    assert got.free_ids.tolist() == [a, 8, b] and got.free_ids.dtype == "int64"
    assert got.known.tolist() == [[8, a], [16, 64]] and got.top == b  # 2**31 + 7 = 2,147,483,655


def test_the_scan_holds_seq_and_step_in_int32_until_a_value_does_not_fit():
    """Scan held seq and step in int64 as it was fed (16 MB a million rows); in int32 while they fit, widened by the
    first batch that does not fit, every value kept, and int64 from `finish` (as the model reads them)."""
    from reports.memory.row_scan import Scan

    scan = Scan(3)
    assert scan.arrays["seq"].dtype == "int32" and scan.arrays["step"].dtype == "int32"
    big = 2**31 + 1  # 2,147,483,649: past int32
    got, columns = _scanned_lists((5, 7, 8), seq=(4, big, big + 1), step=(0, 1, big))
    assert columns["seq"].tolist() == [4, big, big + 1] and columns["step"].tolist() == [0, 1, big]
    assert columns["seq"].dtype == "int64" and columns["step"].dtype == "int64"
    _, columns = _scanned_lists((5, 7, 8), seq=(4, 5, 6), step=(0, 1, 1))
    assert columns["seq"].tolist() == [4, 5, 6] and columns["seq"].dtype == "int64"


def test_the_memory_rows_give_the_freed_pages_back_before_the_model(tmp_path, monkeypatch):
    """memory_rows calls sql_categories.give_back (glibc's malloc_trim) once per run before it reads the scan, so the
    pages the Trace's open freed are not held under the model's peak."""
    import reports.memory.sql_categories as sql_categories
    from reports.memory.row_scan import Scan
    from reports.sql.engine import Trace

    calls, give_back = [], sql_categories.give_back
    real = Scan.finish
    monkeypatch.setattr(sql_categories, "give_back", lambda: calls.append("give_back"))
    monkeypatch.setattr(Scan, "finish", lambda self, *a: calls.append("finish") or real(self, *a))
    trace = Trace(gpt_trace(tmp_path / "t"), keep=(Scan,))
    assert len(sql_categories.memory_rows(trace, 0)) > 0
    assert calls == ["give_back", "finish"]
    give_back()  # the real one: glibc's trim here, nothing where there is none
    assert sql_categories._TRIM is not None
