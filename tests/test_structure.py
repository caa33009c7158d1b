"""The packages' import graph: no circle, and imports that run one way.

Every module under reports/ and tracer/ is parsed with `ast` (imports inside functions
count: a lazy import is still a dependency), and each import of a module of these
packages becomes an edge. The layers of reports/, from the bottom:
the base (errors, _util, steps, arrays) -> loading/ and sql/ -> the analyses (tables, compare, flops/,
memory/, time/, distributed/) -> output/ (text, the CLI, its sections, plots, exports).
A module may import its own layer or those below it, never one above.

The layers of tracer/, from the bottom: the base (its top-level modules: errors, safety, the schema,
the counting rules, the device catalogue and its lookups) -> store/ (the trace directory and its
parts), native/ (the compiled hook) and flops/ (the formulas), which do not import each other ->
recording/ (the dispatch mode and what it reads per op) -> metering/ and tracer.measure, which run
a Tracer. reports/ meets tracer/ only at a few base modules.
"""

import ast
import subprocess
import sys

import tomllib

from tests import helpers

ROOT = helpers.ROOT
PACKAGES = ("reports", "tracer")
BASE = {"reports", "reports.errors", "reports._util", "reports.steps", "reports.arrays"}
LOADING = "reports.loading"
SQL = "reports.sql"  # the SQL views and their engine: beside loading (analyses use it; it uses loading only)
OUTPUT = "reports.output"
# tracer's folders by layer (tracer.<folder>); folders of one layer are independent of each other
TRACER_LAYERS = {"store": 1, "native": 1, "flops": 1, "recording": 2, "metering": 3}
TRACER_TOP = {"measure": 3}  # a top-level module above the base: time_step times steps around a Tracer
TRACER_TOP_LEVEL_MAX = 15  # modules at the top of tracer/, its front door included
# private names one tracer folder takes from another, each with its reason
TRACER_PRIVATE_CROSSINGS = {
    # the hook looks up the formula registered now, a formula registered during the trace included
    "tracer.recording.dispatch: from tracer.flops.formulas import _registry",
}


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


def _tracer_place(name):
    """(the folder of tracer/ a module is in, "" at the top level; its layer)."""
    parts = name.split(".")
    if len(parts) > 2 or len(parts) == 2 and parts[1] in TRACER_LAYERS:  # a folder's module, or its __init__
        return parts[1], TRACER_LAYERS[parts[1]]
    return "", TRACER_TOP.get(parts[-1], 0) if len(parts) == 2 else 0


def _tracer_upward(graph):
    """The imports between tracer's modules that do not run down: to a higher layer, or to another folder of the
    same layer."""
    found = []
    for name, edges in graph.items():
        if not name.startswith("tracer"):
            continue
        folder, layer = _tracer_place(name)
        for target in edges:
            if target.startswith("tracer"):
                to_folder, to_layer = _tracer_place(target)
                if to_layer > layer or to_layer == layer and to_folder != folder:
                    found.append(f"{name} imports {target}")
    return sorted(found)


def test_the_graph_sees_every_kind_of_import():
    graph = _graph()
    assert "reports.loading.integrity" in graph["reports.output.cli"]  # `from reports.loading.integrity import ...`
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
    # needs its peaks (tracer.metering.meter), and the roofline's bandwidth and the plan's targets are the same records;
    # tracer.peaks: the peak FLOP/s lookup over it, shared with the meter;
    # tracer.rules: the counting rules both apply (add-first ops, the run's dtype, attention's score recomputation)
    assert into_reports == [] and into_tracer == ["tracer.devices", "tracer.peaks", "tracer.rules", "tracer.schema"]


def test_tracer_imports_run_one_way():
    """metering/ and measure -> recording/ -> store/, native/, flops/ (not each other) -> the top-level base."""
    assert _tracer_upward(_without_front_doors(_graph())) == []


def test_the_tracer_layer_check_names_an_upward_import():
    graph = {
        "tracer.store.writer": {"tracer.recording.mode", "tracer.store.directory", "tracer.schema"},
        "tracer.flops.formulas": {"tracer.native.loader"},  # the same layer, another folder
        "tracer.peaks": {"tracer.measure"},  # the base, above it at the top level
        "tracer.measure": {"tracer.recording.mode", "tracer.device"},
    }
    assert _tracer_upward(graph) == [
        "tracer.flops.formulas imports tracer.native.loader",
        "tracer.peaks imports tracer.measure",
        "tracer.store.writer imports tracer.recording.mode",
    ]


def test_every_tracer_folder_has_a_layer_and_is_installed():
    folders = sorted(p.parent.name for p in (ROOT / "tracer").glob("*/__init__.py"))
    assert folders == sorted(TRACER_LAYERS)
    with open(ROOT / "pyproject.toml", "rb") as f:
        installed = tomllib.load(f)["tool"]["setuptools"]["packages"]
    packages = sorted(
        ".".join(p.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for p in (ROOT / package).rglob("__init__.py")
    )
    assert sorted(installed) == packages


def test_tracer_keeps_at_most_15_modules_at_its_top_level():
    top = sorted(p.name for p in (ROOT / "tracer").glob("*.py"))
    assert len(top) <= TRACER_TOP_LEVEL_MAX, f"{len(top)} modules at the top of tracer/: {top}"


def test_tracer_folders_use_only_public_names_of_each_other():
    # a name starting with `_` belongs to its folder of tracer/; another folder that needs it gets a public name
    crossings = set()
    for name, path in _modules().items():
        if not name.startswith("tracer"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tracer."):
                if _tracer_place(node.module)[0] != _tracer_place(name)[0]:
                    crossings |= {
                        f"{name}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")
                    }
    assert crossings == TRACER_PRIVATE_CROSSINGS


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


def test_the_paths_the_sources_name_are_there():
    """A comment or docstring that names a file of the checkout names one that exists (the oracles named the test
    files by their places before tests/ mirrored the packages); a module named without its `.py` (`reports/__init__`)
    counts."""
    import re

    named = re.compile(r"(?<![\w/.-])(?:tracer|reports|tests|examples|benchmarks|docs)/[\w/.*-]*[\w*]")
    quoting = {"tests/integration/test_readme.py"}  # names the old places on purpose, as examples
    missing = []
    for base in (*PACKAGES, "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / base).rglob("*")):
            if path.suffix not in (".py", ".sql", ".cpp", ".h", ".md") or str(path.relative_to(ROOT)) in quoting:
                continue
            for found in sorted(set(named.findall(path.read_text(encoding="utf-8")))):
                if not list(ROOT.glob(found)) and not (ROOT / f"{found}.py").exists():
                    missing.append((str(path.relative_to(ROOT)), found))
    assert missing == []
