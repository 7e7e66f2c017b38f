"""Loading a bundle that `flowc build` wrote (its `python -m BUNDLE` entry point is
flowrt.deploy.entry's).

`load_bundle` reads bundle.json, imports every module under nodes/ (each builds its `RoleSpec`
from literal tables) and graphs.py (each graph's entry, outputs, start and entry-value nodes,
and the globals), and assembles from them the plan the runtime executes (`Bundle.plan`, in
the shape of `flowc plan --json`): a role's node tables are those of its nodes/ROLE.py, the one
copy the runtime reads. plan.json is the same plan for people and tools; the runtime never
reads it, so there are no two copies to keep in agreement. Problems are `BundleError`s naming
the file and the fix, never tracebacks.

A role none of whose interfaces runs in any graph (an imported library's role the graphs leave
out: the plan says so) is not part of what runs: `Bundle.roles` holds the roles some graph runs,
and `Bundle.unreached` names the others, which no deployment imports or starts.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from flowrt.errors import FlowrtError
from flowrt.tables import RoleSpec, TableError, entry_stream, interruptible


class BundleError(FlowrtError):
    """A bundle is missing, incomplete or inconsistent."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    name: str
    manifest: dict
    plan: dict
    roles: dict[str, RoleSpec]  # the roles some graph runs
    unreached: tuple[str, ...] = ()  # the roles no graph runs: never imported nor started

    @property
    def python_path(self) -> list[Path]:
        """Where the roles' impl modules are imported from (the .flow file's directory and parent)."""
        return [(self.path / p).resolve() for p in self.manifest.get("python_path", [])]


MALFORMED = (KeyError, TypeError, AttributeError, ValueError)  # what reading a table of the wrong shape raises


def load_bundle(path: Path) -> Bundle:
    path = Path(path)
    manifest = _read_json(path / "bundle.json")
    roles: dict[str, RoleSpec] = {}
    try:
        entries = sorted(manifest.get("roles", {}).items())
        modules = {name: path / entry["module"] for name, entry in entries}
        name = manifest.get("name", path.name)
        if not isinstance(name, str) or not isinstance(manifest.get("python_path", []), list):
            raise TypeError("`name` must be a string and `python_path` a list")
    except MALFORMED as error:
        raise BundleError(
            f"{path / 'bundle.json'} is malformed ({_reason(error)}); rebuild the bundle with `flowc build`"
        ) from None
    for name_, module_path in modules.items():
        spec = _import_role(path, name_, module_path)
        if spec.name != name_:
            raise BundleError(
                f"{module_path}: declares role `{spec.name}`, but bundle.json lists it as `{name_}`; rebuild the bundle"
            )
        roles[name_] = spec
    graphs = _import_module(path, "graphs", path / "graphs.py")
    try:
        plan = _assemble_plan(graphs, roles)
        for graph_name, graph in plan["graphs"].items():
            entry_stream(graph_name, graph)  # (malformed: a TableError)
            interruptible(graph_name, graph)
    except MALFORMED as error:
        raise BundleError(
            f"{path / 'graphs.py'} is malformed ({_reason(error)}); rebuild the bundle with `flowc build`"
        ) from None
    unreached = tuple(sorted(name for name, spec in roles.items() if not any(i.graphs for i in spec.interfaces.values())))
    reached = {name: spec for name, spec in roles.items() if name not in unreached}
    return Bundle(path=path, name=name, manifest=manifest, plan=plan, roles=reached, unreached=unreached)


def refuse_streaming_entries(bundle: Bundle, how: str, fix: str | None = None) -> None:
    """A graph with a streaming entry (`placeholder stream`) takes its frames from a caller of
    the runtime that runs the call's control (`Runtime.start`, `call.send`; docs/runtime.md,
    "Streaming input"), which a bundle run `how` (calls spread over the replica processes, ...)
    cannot do yet: a BundleError in one line naming each such graph and entry and `fix` (by
    default: call the graph in process), rather than a call that never ends."""
    found = [(name, entry_stream(name, graph)) for name, graph in sorted(bundle.plan["graphs"].items())]
    found = [(name, names) for name, names in found if names]
    if not found:
        return
    graphs = "; ".join(f"graph `{graph}` streams {', '.join(f'`{n}`' for n in names)}" for graph, names in found)
    fix = fix or (
        "call the graph in process instead (`flowc run --once` with the list of its frames as the entry's "
        "value, or `runtime.start(...)` and `await call.send(...)` from Python)"
    )
    raise BundleError(
        f"{bundle.path}: {graphs}: a streaming entry cannot take its frames {how} yet; {fix}, "
        "or declare the placeholder without `stream`"
    )


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{path} is missing; is {path.parent} a bundle written by `flowc build`?") from None
    except (OSError, ValueError, RecursionError) as error:
        raise BundleError(f"{path} cannot be read ({error}); rebuild the bundle with `flowc build`") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path} holds a JSON {type(data).__name__}, not an object; rebuild the bundle with `flowc build`")
    return data


def _import_module(bundle: Path, name: str, module_path: Path) -> ModuleType:
    """A generated module of the bundle, imported under a name of its own (never the bundle's package)."""
    module_name = f"_flowrt_bundle_{abs(hash(str(bundle.resolve())))}.{name}"
    spec = importlib.util.spec_from_file_location(module_name, module_path)
    if spec is None or spec.loader is None or not module_path.is_file():
        raise BundleError(f"{module_path} is missing; rebuild the bundle with `flowc build`")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except TableError as error:
        raise BundleError(f"{module_path}: {error}") from None
    except Exception as error:  # noqa: BLE001 - a broken generated module must not become a traceback
        raise BundleError(f"{module_path} failed to load ({type(error).__name__}: {error}); rebuild the bundle") from None
    return module


def _import_role(bundle: Path, name: str, module_path: Path) -> RoleSpec:
    role = getattr(_import_module(bundle, f"nodes.{name}", module_path), "SPEC", None)
    if not isinstance(role, RoleSpec):
        raise BundleError(f"{module_path} defines no SPEC; rebuild the bundle with `flowc build`")
    return role


def _assemble_plan(graphs: ModuleType, roles: dict[str, RoleSpec]) -> dict:
    """The plan the runtime executes: graphs.py's graphs with each role's nodes from its module
    (a control edge naming a node neither defines fails building the graph's program, which
    says the tables are malformed)."""
    literals = {role.name: role.as_literal() for role in roles.values()}
    plan_graphs = {}
    for graph_name, graph in graphs.GRAPHS.items():
        nodes = dict(graph["nodes"])
        for role, interfaces in literals.items():
            for interface, tables in interfaces.items():
                if graph_name in tables:
                    nodes[f"{role}.{interface}"] = tables[graph_name]
        plan_graphs[graph_name] = {**graph, "nodes": dict(sorted(nodes.items()))}
    return {"flow": str(graphs.FLOW), "globals": dict(graphs.GLOBALS), "graphs": plan_graphs}
