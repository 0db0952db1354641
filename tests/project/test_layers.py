"""The package layers: zoo <- inference <- lab, enforced by import-linter, and no import cycles.

The contract lives in setup.cfg ([importlinter]); ``lint-imports`` reads it.  The cycle check
uses grimp (import-linter's import graph), counting imports inside functions too.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("zoo", "inference", "lab")


def test_import_linter_contracts_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    done = subprocess.run([exe, "--config", str(ROOT / "setup.cfg")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _strongly_connected(graph: dict) -> list:
    """Tarjan's strongly connected components of ``{node: set(successors)}`` with more than one node."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_between_modules():
    graph = grimp.build_graph(*PACKAGES)
    # a package's __init__ re-exporting its submodules is not a cycle between modules
    edges = {
        m: {i for i in graph.find_modules_directly_imported_by(m) if not m.startswith(i + ".")}
        for m in graph.modules
    }
    assert _strongly_connected(edges) == []


def test_strongly_connected_finds_a_cycle():
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_inference_floor_is_folders_of_parts_and_no_module_is_long():
    """inference/'s top level holds the public surface only (the rest lives in one folder per family),
    and no module of the three packages is over 400 lines (docs/architecture.md)."""
    top_level = sorted(p.name for p in (ROOT / "inference").glob("*.py"))
    assert len(top_level) <= 8, top_level
    long = {str(p.relative_to(ROOT)): n for package in PACKAGES for p in (ROOT / package).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, long
    families = {"optim", "variational", "laplace", "swag", "mcmc", "sgmcmc", "ensembles", "dropout"}
    assert families <= {p.name for p in (ROOT / "inference").iterdir() if (p / "__init__.py").exists()}


def _folder(module: str) -> str:
    """The unit of ``inference``'s folder graph a module belongs to: its sub-package or top-level module
    (``inference.laplace.curvature`` → ``inference.laplace``, ``inference.posterior`` → itself)."""
    return ".".join(module.split(".")[:2])


def _folder_graph(graph, package: str = "inference") -> tuple[dict, dict]:
    """``({folder: {folders it imports}}, {(a, b): "module -> module"})`` over ``package``'s folders and
    top-level modules (its ``__init__``, the public re-exports, left out); imports inside functions count."""
    edges, example = {}, {}
    for module in graph.modules:
        if module == package or not module.startswith(package + "."):
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = _folder(module), _folder(imported)
            if imported.startswith(package + ".") and a != b:
                edges.setdefault(a, set()).add(b)
                example.setdefault((a, b), f"{module} -> {imported}")
    return edges, example


def _cycle_in(component: list, edges: dict) -> list:
    """One closed path ``[a, b, ..., a]`` through the strongly connected ``component`` (breadth first)."""
    inside, start = set(component), component[0]
    parents, queue = {start: None}, [start]
    for node in queue:
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                path = [node]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                return path[::-1] + [start]
            if nxt in inside and nxt not in parents:
                parents[nxt] = node
                queue.append(nxt)
    return component  # pragma: no cover - a strongly connected component always closes


def test_no_import_loop_between_the_folders_of_inference():
    """No loop in the graph of inference's folders and top-level modules (an arrow a → b when a module of a
    imports one of b): the posterior base, prediction and evaluation sit below the families, the families
    below the backends (docs/architecture.md)."""
    edges, example = _folder_graph(grimp.build_graph(*PACKAGES))
    loops = []
    for component in _strongly_connected(edges):
        cycle = _cycle_in(component, edges)
        loops.append(" → ".join(cycle) + "\n    " + "\n    ".join(example[a, b] for a, b in zip(cycle, cycle[1:])))
    assert loops == [], "folder-level import loops in inference/:\n" + "\n".join(loops)


def test_folder_graph_names_the_loop():
    class Graph:  # a stand-in for grimp's graph
        imports = {"inference.a.x": {"inference.b.y"}, "inference.b.y": {"inference.c"},
                   "inference.c": {"inference.a.z", "zoo.bnn"}, "inference.a.z": set(), "inference": {"inference.a.x"}}
        modules = set(imports)

        def find_modules_directly_imported_by(self, module):
            return self.imports[module]

    edges, example = _folder_graph(Graph())
    assert edges == {"inference.a": {"inference.b"}, "inference.b": {"inference.c"}, "inference.c": {"inference.a"}}
    component = _strongly_connected(edges)[0]
    assert _cycle_in(component, edges) == ["inference.a", "inference.b", "inference.c", "inference.a"]
    assert example["inference.c", "inference.a"] == "inference.c -> inference.a.z"
