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
