"""The package's structure, read from its source: no import circle, imports that point down the
layers of ``docs/architecture.md``, and imports inside functions only where they defer a heavy
third-party package.

Every import counts, at module level or inside a function, except those under
``if TYPE_CHECKING:`` (they never run).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedbandit"

#: The layers, from the ground up: a module may import its own layer and those below it. A
#: module belongs to the layer of the longest prefix that names it (``docs/architecture.md``).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ground: mathematics and plumbing",
        (
            "fedbandit._version",
            "fedbandit.compile_notice",
            "fedbandit.errors",
            "fedbandit.rng",
            "fedbandit.state",
            "fedbandit.streams",
            "fedbandit.threads",
            "fedbandit.design",
            "fedbandit.estimators",
            "fedbandit.analysis",
            "fedbandit.plotting",
            "fedbandit.federation.messages",
            "fedbandit.contextual.kernels",
            "fedbandit.contextual.ridge",
            "fedbandit.privacy",
            "fedbandit.secure_sum",
            "fedbandit.catalogue",
        ),
    ),
    (
        "problems: environments, instances, data",
        (
            "fedbandit.group_environment",
            "fedbandit.environment",
            "fedbandit.instances",
            "fedbandit.contextual",
            "fedbandit.datasets",
        ),
    ),
    (
        "federation protocol and algorithms",
        ("fedbandit.federation", "fedbandit.algorithms", "fedbandit.resources"),
    ),
    ("registry", ("fedbandit.registry", "fedbandit.simulation")),
    (
        "harness: configuration, run specs, result folders, sweeps",
        ("fedbandit.config", "fedbandit.runspec", "fedbandit.results", "fedbandit.sweep"),
    ),
    (
        "runtimes and executors",
        ("fedbandit.runtimes", "fedbandit.flower", "fedbandit.executors"),
    ),
    ("orchestration", ("fedbandit.runner", "fedbandit.runs", "fedbandit.suites")),
    ("faces", ("fedbandit", "fedbandit.api", "fedbandit.cli", "fedbandit.bench")),
]

#: Third-party packages slow enough to import (or optional enough) that a module may defer them
#: to the function that needs them, together with any of our modules that import them.
HEAVY = {
    "flwr",
    "ray",
    "matplotlib",
    "cvxpy",
    "clarabel",
    "numba",
    "pandas",
    "sklearn",
    "scipy",
    "rliable",
    "arch",
}


@dataclass
class ImportGraph:
    """Imports among a package's modules (``edges``), those made inside functions
    (``deferred``), and the third-party packages each module imports at module level."""

    modules: set[str] = field(default_factory=set)
    edges: dict[str, set[str]] = field(default_factory=dict)
    deferred: dict[str, set[str]] = field(default_factory=dict)
    third_party: dict[str, set[str]] = field(default_factory=dict)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(root: Path) -> ImportGraph:
    """The import graph of the package in folder ``root``, from its source files."""
    package = root.name
    files: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    graph = ImportGraph(modules=set(files))

    def own_module(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    class Visitor(ast.NodeVisitor):
        def __init__(self, module: str, is_package: bool) -> None:
            self.module, self.is_package, self.depth = module, is_package, 0

        def visit_If(self, node: ast.If) -> None:
            if _is_type_checking(node.test):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            self.depth += 1
            self.generic_visit(node)
            self.depth -= 1

        def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
            self.depth += 1
            self.generic_visit(node)
            self.depth -= 1

        def add(self, name: str) -> None:
            top = name.split(".")[0]
            if top != package:
                if self.depth == 0 and top:
                    graph.third_party.setdefault(self.module, set()).add(top)
                return
            target = own_module(name)
            if target is None or target == self.module:
                return
            graph.edges.setdefault(self.module, set()).add(target)
            if self.depth:
                graph.deferred.setdefault(self.module, set()).add(target)

        def visit_Import(self, node: ast.Import) -> None:
            for alias in node.names:
                self.add(alias.name)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = self.module.split(".")
                base = base if self.is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            for alias in node.names:
                full = f"{name}.{alias.name}"
                self.add(full if full in files else name)

    for module, (path, is_package) in files.items():
        Visitor(module, is_package).visit(ast.parse(path.read_text(), str(path)))
    return graph


def circles(graph: ImportGraph) -> list[list[str]]:
    """One circle (a -> b -> ... -> a) through each group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.edges.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph.modules):
        if module not in index:
            connect(module)
    found = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:  # walk inside the group until the walk closes on itself
            step = min(t for t in graph.edges[path[-1]] if t in group)
            if step in seen:
                found.append([*path[path.index(step) :], step])
                break
            path.append(step)
            seen.add(step)
    return found


def layer_of(module: str) -> int:
    best, depth = -1, -1
    for level, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = level, len(prefix)
    return best


def heavy_modules(graph: ImportGraph) -> set[str]:
    """Our modules whose module-level imports load a ``HEAVY`` package, directly or through
    other modules of ours."""
    heavy = {m for m in graph.modules if graph.third_party.get(m, set()) & HEAVY}
    changed = True
    while changed:
        changed = False
        for module in graph.modules - heavy:
            top_level = graph.edges.get(module, set()) - graph.deferred.get(module, set())
            if top_level & heavy:
                heavy.add(module)
                changed = True
    return heavy


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return import_graph(PACKAGE)


def test_no_import_circle(graph):
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_every_module_has_a_layer(graph):
    assert not [m for m in sorted(graph.modules) if layer_of(m) < 0], "add them to LAYERS"


def test_imports_point_down_the_layers(graph):
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.edges.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_imports_inside_functions_only_defer_heavy_packages(graph):
    """An import of our own module inside a function is allowed only when that module loads a
    heavy package at import time (``HEAVY``); any other belongs at the top of the module."""
    heavy = heavy_modules(graph)
    light = [
        f"{module} imports {target} inside a function"
        for module, targets in sorted(graph.deferred.items())
        for target in sorted(targets - heavy)
    ]
    assert not light, "\n".join(light)


#: Flower's public API (these packages themselves, not their submodules): what fedbandit may
#: import outside ``fedbandit/flower/internals/``.
FLOWER_PUBLIC = {
    "flwr.app",
    "flwr.clientapp",
    "flwr.serverapp",
    "flwr.simulation",
    "flwr.common",
    # the legacy API that Flower's SecAgg+ runs on (documented: flwr.server.LegacyContext,
    # flwr.server.strategy.Strategy, flwr.server.workflow.SecAggPlusWorkflow,
    # flwr.client.mod.secaggplus_mod)
    "flwr.server",
    "flwr.server.strategy",
    "flwr.server.workflow",
    "flwr.client.mod",
}


def test_only_the_internals_folder_uses_flowers_private_modules():
    """A Flower upgrade touches ``fedbandit/flower/internals/`` alone: every other module
    imports Flower's public API only (every import counts, even under TYPE_CHECKING)."""
    internals = PACKAGE / "flower" / "internals"
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if internals in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                if name.split(".")[0] == "flwr" and name not in FLOWER_PUBLIC:
                    private.append(f"{path.relative_to(PACKAGE.parent)}: {name}")
    assert not private, "\n".join(private)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_circle_is_found_and_named(tmp_path):
    package = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "def f():\n    from pkg.sub import c\n",
            "sub/__init__.py": "",
            "sub/c.py": "from .. import a\nimport numpy\n",
            "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
        },
    )
    graph = import_graph(package)
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert graph.deferred == {"pkg.b": {"pkg.sub.c"}}
    assert "pkg.d" not in graph.edges  # TYPE_CHECKING imports never run
    assert graph.third_party == {"pkg.sub.c": {"numpy"}, "pkg.d": {"typing"}}


def test_heavy_modules_follow_module_level_imports_only(tmp_path):
    package = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "plots.py": "import matplotlib\n",
            "report.py": "from pkg import plots\n",
            "lazy.py": "def f():\n    import pandas\n",
        },
    )
    assert heavy_modules(import_graph(package)) == {"pkg.plots", "pkg.report"}
