"""Loading a bundle that `flowc build` wrote, and its `python -m BUNDLE` entry point.

`load_bundle` reads bundle.json and plan.json, imports every module under nodes/ (each builds
its `RoleSpec` from literal tables) and checks that they agree with each other. Problems are
`BundleError`s naming the file and the fix, never tracebacks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from flowrt import __version__
from flowrt.errors import FlowrtError
from flowrt.tables import RoleSpec, TableError


class BundleError(FlowrtError):
    """A bundle is missing, incomplete or inconsistent."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    name: str
    manifest: dict
    plan: dict
    roles: dict[str, RoleSpec]

    @property
    def python_path(self) -> list[Path]:
        """Where the roles' impl modules are imported from (the .flow file's directory and parent)."""
        return [(self.path / p).resolve() for p in self.manifest.get("python_path", [])]


MALFORMED = (KeyError, TypeError, AttributeError, ValueError)  # what reading a table of the wrong shape raises


def load_bundle(path: Path) -> Bundle:
    path = Path(path)
    manifest = _read_json(path / "bundle.json")
    plan = _read_json(path / "plan.json")
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
    try:
        _check_agreement(path, plan, roles)
    except MALFORMED as error:
        raise BundleError(
            f"{path / 'plan.json'} is malformed ({_reason(error)}); rebuild the bundle with `flowc build`"
        ) from None
    return Bundle(path=path, name=name, manifest=manifest, plan=plan, roles=roles)


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


def _import_role(bundle: Path, name: str, module_path: Path) -> RoleSpec:
    module_name = f"_flowrt_bundle_{abs(hash(str(bundle.resolve())))}.nodes.{name}"
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
    role = getattr(module, "SPEC", None)
    if not isinstance(role, RoleSpec):
        raise BundleError(f"{module_path} defines no SPEC; rebuild the bundle with `flowc build`")
    return role


def _check_agreement(path: Path, plan: dict, roles: dict[str, RoleSpec]) -> None:
    for graph_name, graph in plan.get("graphs", {}).items():
        for node_id, node in graph.get("nodes", {}).items():
            if node.get("kind") != "interface":
                continue
            role, interface = node_id.split(".", 1)
            literal = roles.get(role)
            if literal is None or interface not in literal.interfaces:
                raise BundleError(f"{path}/plan.json names `{node_id}`, which no module under nodes/ defines; rebuild the bundle")
            tables = literal.as_literal()[interface].get(graph_name)
            if tables != node:
                raise BundleError(
                    f"nodes/{role}.py disagrees with plan.json about `{node_id}` in graph `{graph_name}`; rebuild the bundle"
                )


def describe(bundle: Bundle) -> str:
    from flowrt.control import CORE

    lines = [f"bundle {bundle.name} (flowc {bundle.manifest.get('flowc_version')}, flowrt {__version__}; control core: {CORE})"]
    for name, graph in sorted(bundle.manifest.get("graphs", {}).items()):
        streams = ", ".join(s["field"] + (" ordered" if s["ordered"] else "") for s in graph["stream"]) or "-"
        lines.append(
            f"  graph {name}: entry {', '.join(graph['entry'])}; stream {streams}; return {', '.join(graph['return']) or '-'}"
        )
    for name, role in sorted(bundle.roles.items()):
        lines.append(
            f"  role {name}: {role.impl}, {role.replicas} replica(s), lb {role.lb}, interfaces {', '.join(role.interfaces)}"
        )
    return "\n".join(lines)


def main(path: Path, argv: list[str]) -> int:
    from flowrt import options

    parser = argparse.ArgumentParser(prog=f"python -m {path.name}", description=f"The flowc bundle at {path}.")
    parser.add_argument(
        "command",
        nargs="?",
        default="info",
        choices=["info", "check", "serve", "launch", "launch-ray"],
        help="info: what the bundle holds (default); check: load and cross-check every table; "
        "serve: serve it over HTTP in this process (as `flowc run DIR`); launch: serve it with one process "
        "per replica (--deploy local, the default) or on Ray (--deploy ray[=ADDRESS]); launch-ray: launch --deploy ray",
    )
    parser.add_argument("--deploy", metavar="inproc|local|ray[=ADDRESS]", help="serve/launch: where the roles run")
    parser.add_argument("--registry", metavar="URL", help="launch: the replica registry in Redis (redis://...)")
    parser.add_argument(
        "--heartbeat-ttl", metavar="SECONDS", default="3", help="launch: drop a replica not heard from for this long (default: 3)"
    )
    parser.add_argument("--http", metavar="HOST:PORT", default="127.0.0.1:8000", help="serve: where to listen")
    parser.add_argument(
        "--session-ttl",
        metavar="SECONDS",
        default=options.DEFAULT_SESSION_TTL,
        help="serve: an idle session's state is dropped after this long (default: %(default)g)",
    )
    parser.add_argument(
        "--max-sessions",
        metavar="N",
        default=options.DEFAULT_MAX_SESSIONS,
        help="serve: at most N idle sessions keep their state (default: %(default)d)",
    )
    parser.add_argument(
        "--max-body-mb",
        metavar="MIB",
        default=options.DEFAULT_MAX_BODY_MB,
        help="serve: the largest request body accepted (default: %(default)g)",
    )
    parser.add_argument("--debug", action="store_true", help="log debug records and full tracebacks of role errors")
    args = parser.parse_args(argv)
    deploy = args.deploy or {"launch": "local", "launch-ray": "ray"}.get(args.command, "inproc")
    try:
        limits = {
            "session_ttl": options.session_ttl_seconds(args.session_ttl),
            "max_sessions": options.session_cap(args.max_sessions),
            "max_body_mb": options.size_mib(args.max_body_mb),
            "deploy": deploy,
            "registry": args.registry,
            "heartbeat_ttl": options.timeout_seconds(args.heartbeat_ttl),
        }
    except ValueError as error:
        parser.error(str(error))  # exits 2
    try:
        bundle = load_bundle(path)
    except BundleError as error:
        print(f"flowrt: {error}", file=sys.stderr)
        return 1
    if args.command in ("serve", "launch", "launch-ray"):
        return _serve(path, args.http, args.debug, limits)
    print(describe(bundle) if args.command == "info" else f"bundle {bundle.name}: {len(bundle.roles)} roles, tables consistent")
    return 0


def _serve(path: Path, address: str, debug: bool, limits: dict) -> int:
    import asyncio

    from flowrt.control import FlowrtError
    from flowrt.logs import show_log
    from flowrt.serve import parse_address, serve

    try:
        host, port = parse_address(address)
    except ValueError as error:
        print(f"flowrt: --http: {error}", file=sys.stderr)
        return 2
    show_log(debug)
    try:
        asyncio.run(serve(path, host, port, debug=debug, **limits))
    except FlowrtError as error:  # a role that cannot be imported or set up, an address that is taken, a bad --deploy
        print(f"flowrt: {error}", file=sys.stderr)
        return 2 if limits["deploy"] != "inproc" else 1
    except ValueError as error:  # --deploy or --registry in a form flowrt does not take
        print(f"flowrt: {error}", file=sys.stderr)
        return 2
    return 0
