"""The packages' import graph: no circle, and imports that run one way.

Every module under reports/ and tracer/ is parsed with `ast` (imports inside functions
count: a lazy import is still a dependency), and each import of a module of these
packages becomes an edge. The layers of reports/, from the bottom:
the base (errors, _util, steps) -> loading/ and sql/ -> the analyses (tables, compare, flops/,
memory/, time/, distributed/) -> output/ (text, the CLI, its sections, plots, exports).
A module may import its own layer or those below it, never one above.
"""

import ast
import subprocess
import sys

from tests import helpers

ROOT = helpers.ROOT
PACKAGES = ("reports", "tracer")
BASE = {"reports", "reports.errors", "reports._util", "reports.steps"}
LOADING = "reports.loading"
SQL = "reports.sql"  # the SQL views and their engine: beside loading (analyses use it; it uses loading only)
OUTPUT = "reports.output"


def _modules():
    """{dotted name: path} of every module of the packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolve(name, modules):
    """The module an imported name lands on: `reports.flops.mfu.mfu` -> `reports.flops.mfu`."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph():
    """{module: {module it imports}}, package front doors (`__init__`) included."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package this module is in
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            else:
                continue
            for target in targets:
                if target.split(".")[0] in PACKAGES:
                    found = _resolve(target, modules)
                    if found and found != name:
                        edges.add(found)
        graph[name] = edges
    return graph


def _without_front_doors(graph):
    """The graph with each package's `__init__` dropped: importing `reports.flops.mfu` runs `reports/__init__`,
    but that is Python's import order, not a dependency of mfu on what the front door re-exports."""
    doors = {name for name in graph if (ROOT / name.replace(".", "/") / "__init__.py").exists()}
    return {name: edges - doors for name, edges in graph.items() if name not in doors}


def _cycle(graph):
    """One import circle as [a, b, ..., a], or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt, path)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [])
            if found:
                return found
    return None


def _layer(name):
    if name.startswith("tracer"):
        return -1
    if name in BASE:
        return 0
    if name in (LOADING, SQL) or name.startswith((LOADING + ".", SQL + ".")):
        return 1
    if name == OUTPUT or name.startswith(OUTPUT + "."):
        return 3
    return 2  # an analysis


def test_the_graph_sees_every_kind_of_import():
    graph = _graph()
    assert "reports.loading.load" in graph["reports"]  # `from reports.loading.load import load`, at the top
    assert "reports.flops.mfu" in graph["reports.compare"]  # imported inside a function only
    assert "tracer.schema" in graph["reports.loading.load"]
    assert "reports.flops.mfu" in graph["reports.output.source"]  # the CLI reaches it through Source


def test_no_import_circle():
    graph = _without_front_doors(_graph())
    found = _cycle(graph)
    assert found is None, "import circle: " + " -> ".join(found)


def test_the_cycle_finder_names_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_imports_run_one_way():
    """Output -> analyses -> loading -> base -> tracer.schema, never back."""
    graph = _without_front_doors(_graph())
    upward = sorted(
        f"{name} imports {target}"
        for name, edges in graph.items()
        if name.startswith("reports")
        for target in edges
        if _layer(target) > _layer(name)
    )
    assert upward == []


def test_tracer_and_reports_meet_only_at_the_schema():
    graph = _without_front_doors(_graph())
    into_reports = sorted(
        f"{n} -> {t}" for n, e in graph.items() if n.startswith("tracer") for t in e if t.startswith("reports")
    )
    into_tracer = sorted({t for n, e in graph.items() if n.startswith("reports") for t in e if t.startswith("tracer")})
    # tracer.devices: the device catalogue (peaks, memory, bandwidth, links), pure data: the tracer's run-time meter
    # needs its peaks (tracer.meter), and the roofline's bandwidth and the plan's targets are the same records;
    # tracer.peaks: the peak FLOP/s lookup over it, shared with the meter;
    # tracer.rules: the counting rules both apply (add-first ops, the run's dtype, attention's score recomputation)
    assert into_reports == [] and into_tracer == ["tracer.devices", "tracer.peaks", "tracer.rules", "tracer.schema"]


def test_no_reports_module_imports_torch():
    """Import every module of reports/ in a fresh interpreter: torch stays out of sys.modules."""
    names = sorted(name for name in _modules() if name.startswith("reports"))
    code = f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(ROOT))
    assert out.stdout.strip() == "False"


def test_reports_modules_use_only_public_names_of_each_other():
    # a name starting with `_` is its module's own: another reports module that needs it gets a public name
    private = []
    for name, path in _modules().items():
        if not name.startswith("reports"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("reports.", "tracer.")):
                private += [
                    f"{name}: from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and a.name != "_util"
                ]
    assert private == []
