"""flowrt's packages import only the packages DESIGN §2 lets them (control never learns about
the transport, the gateway never about the deployment behind it), and no two modules import
each other, even inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from tests.conftest import REPO

FLOWRT = REPO / "runtime" / "flowrt"
BASE = {"flowrt", "tables", "values", "errors", "options", "frontdoor", "entry_types", "logs", "extensions", "media"}
ALLOWED = {  # package -> what it may import (its own modules too)
    "deploy": {"gateway", "observe", "registry", "memory", "params", "compute", "transport", "control", "bundle"} | BASE,
    "compute": {"params", "memory"} | BASE,
    "params": {"memory"} | BASE,
    "memory": {"transport"} | BASE,
    "gateway": {"control", "observe"} | BASE,
    "observe": {"flowrt", "values", "extensions"},  # (DESIGN §2: nothing of flowrt but values; and which C extensions may run)
    "registry": {"transport"} | BASE,
    "transport": BASE,
    "control": {"bundle"} | BASE,
    "bundle": BASE,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(FLOWRT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "flowrt"


def imports(path: Path, module: str) -> set[str]:
    """The flowrt modules `path` imports anywhere but under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    modules = {module_name(p) for p in FLOWRT.rglob("*.py")}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("flowrt")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flowrt") and not node.level:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            # `from package import submodule` is the submodule's import; anything else, the module's
            found |= submodules if len(submodules) == len(node.names) else {node.module}
    return {name for name in found if name in modules and name != module}


def graph() -> nx.DiGraph:
    edges = nx.DiGraph()
    for path in sorted(FLOWRT.rglob("*.py")):
        module = module_name(path)
        edges.add_node(module)
        for target in imports(path, module):
            edges.add_edge(module, target)
    return edges


def test_each_package_imports_only_what_the_design_allows():
    wrong = []
    for source, target in graph().edges:
        a, b = package_of(source), package_of(target)
        if a != b and a in ALLOWED and b not in ALLOWED[a]:
            wrong.append(f"{source} imports {target}")
        if a in BASE and b not in BASE:
            wrong.append(f"{source} (a base module) imports {target}")
    assert wrong == []


def test_no_module_imports_itself_through_others():
    # a package's __init__ re-exports its modules: those edges point down, not round
    edges = graph()
    cycles = [c for c in nx.simple_cycles(edges) if len(c) > 1]
    assert cycles == []


def test_every_runtime_module_is_small_enough_to_read_in_one_sitting():
    sizes = {p.relative_to(FLOWRT).as_posix(): len(p.read_text().splitlines()) for p in FLOWRT.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}
