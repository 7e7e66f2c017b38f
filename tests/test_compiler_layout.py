"""The compiler's modules: each says what it owns, none is too long to read in one sitting, no
two import each other (even inside functions), and only the command line reaches the runtime
(`flowc.cli` for option defaults, `flowc.running` for everything `run` and `test` do)."""

from __future__ import annotations

import ast

import networkx as nx

from tests.conftest import REPO

COMPILER = REPO / "compiler"
MODULES = {
    ".".join(p.relative_to(COMPILER).with_suffix("").parts[: -1 if p.name == "__init__.py" else None]): p
    for p in sorted(COMPILER.rglob("*.py"))
}


def imports(module: str) -> set[str]:
    """The modules `module` imports, flowc's and flowrt's (top-level names for flowrt)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES]
            names = submodules if len(submodules) == len(node.names) else [node.module]
        found |= {n for n in names if n in MODULES or n.split(".")[0] == "flowrt"}
    return found - {module}


def test_no_compiler_module_imports_itself_through_others():
    graph = nx.DiGraph((m, t) for m in MODULES for t in imports(m) if t in MODULES)
    assert [c for c in nx.simple_cycles(graph) if len(c) > 1] == []


def test_only_the_command_line_reaches_the_runtime():
    reaching = {m for m in MODULES if any(t.split(".")[0] == "flowrt" for t in imports(m))}
    # (flowc.top is a command too: it reads the key variables' names where they are defined, flowrt.frontdoor)
    assert reaching == {"flowc.cli", "flowc.running", "flowc.top"}


def test_every_compiler_module_has_a_docstring_and_a_readable_size():
    missing = [m for m, p in MODULES.items() if ast.get_docstring(ast.parse(p.read_text())) is None and p.stat().st_size]
    assert missing == []
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}
