"""`python -m BUNDLE [info|check|serve|launch|launch-ray]`: what a built bundle's `__main__.py` runs.

`info` describes the bundle, `check` loads it and cross-checks every table, `serve` serves it
over HTTP in this process (as `flowc run DIR`), `launch` serves it with one process per replica
(`--deploy local`, the default) or on Ray (`--deploy ray[=ADDRESS]`), and `launch-ray` is
`launch --deploy ray=auto`, what the generated Ray job and KubeRay manifests run inside a
cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from flowrt import __version__
from flowrt.bundle import Bundle, BundleError, load_bundle


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


# Every error line starts as `flowc`'s do, so one error reads the same from `flowc run DIR` and
# from `python -m DIR` (the runtime's log lines keep theirs, `flowrt: LEVEL ...`).
PREFIX = "flowc: "


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's `PROG: error: ...`, with the one prefix
        self.print_usage(sys.stderr)
        self.exit(2, f"{PREFIX}{message}\n")


def main(path: Path, argv: list[str]) -> int:
    from flowrt import frontdoor, options

    parser = _Parser(prog=f"python -m {path.name}", description=f"The flowc bundle at {path}.")
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
    parser.add_argument(
        "--pool-mb", metavar="MIB", help="launch: the shared-memory pool for tensors, 0 for none (default: 1024; docs/memory.md)"
    )
    parser.add_argument(
        "--http", metavar="HOST:PORT", default="127.0.0.1:8000", help="serve, launch: where to listen (default: %(default)s)"
    )
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
    parser.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="serve, launch: stderr's log as text or JSON lines"
    )
    frontdoor.add_to_argparse(parser)  # serve, launch: --api-key, --max-in-flight, --grace, ... (docs/security.md)
    args = parser.parse_args(argv)
    deploy = args.deploy or {"launch": "local", "launch-ray": "ray=auto"}.get(args.command, "inproc")
    try:
        limits = {
            "session_ttl": options.session_ttl_seconds(args.session_ttl),
            "max_sessions": options.session_cap(args.max_sessions),
            "max_body_mb": options.size_mib(args.max_body_mb),
            "deploy": deploy,
            "registry": args.registry,
            "heartbeat_ttl": options.timeout_seconds(args.heartbeat_ttl),
            "pool_mb": None if args.pool_mb is None else options.pool_mib(args.pool_mb),
        }
        if args.command in ("serve", "launch", "launch-ray"):
            limits["front"] = frontdoor.front_door(vars(args))
    except ValueError as error:
        parser.error(str(error))  # exits 2
    try:
        bundle = load_bundle(path)
    except BundleError as error:
        print(f"{PREFIX}{error}", file=sys.stderr)
        return 1
    if args.command in ("serve", "launch", "launch-ray"):
        return _serve(path, args.http, args.debug, limits, args.log_format)
    print(describe(bundle) if args.command == "info" else f"bundle {bundle.name}: {len(bundle.roles)} roles, tables consistent")
    return 0


def _serve(path: Path, address: str, debug: bool, limits: dict, log_format: str = "text") -> int:
    import asyncio

    from flowrt.deploy.serving import Stopped, serve
    from flowrt.errors import FlowrtError
    from flowrt.gateway import parse_address
    from flowrt.logs import show_log

    try:
        host, port = parse_address(address)
    except ValueError as error:
        print(f"{PREFIX}--http: {error}", file=sys.stderr)
        return 2
    show_log(debug, log_format)
    try:
        asyncio.run(serve(path, host, port, debug=debug, **limits))
    except Stopped as stopped:
        print(f"{PREFIX}{stopped}", file=sys.stderr)
        return 128 + stopped.signum
    except FlowrtError as error:  # a role that cannot be imported or set up, an address that is taken, a bad --deploy
        print(f"{PREFIX}{error}", file=sys.stderr)
        return 2 if limits["deploy"] != "inproc" else 1
    except ValueError as error:  # --deploy or --registry in a form flowrt does not take
        print(f"{PREFIX}{error}", file=sys.stderr)
        return 2
    return 0
