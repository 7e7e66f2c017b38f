"""What `flowc run` does once its options are read: one call (`--once`) or serving, on flowrt;
and the calls `flowc test` makes (`deployed`, `call_events`). The compiler reaches flowrt
only through this module.

Problems the user can fix (a bundle or role that cannot open, an input that does not fit, an
address that is taken) become click errors (exit 2, one line, no traceback). The runtime's log
goes to stderr (flowrt.logs), so stdout carries only a call's events or the server's banner.

Serving shows how the start goes on stderr (flowc.progress: bars on a terminal, a line per
replica ready elsewhere, nothing with --quiet or a JSON log), then prints the URL on stdout.

`--once` and signals: SIGINT or SIGTERM cancels the call (its `done` event says `cancelled`,
reason `shutdown`) and the command exits 128 + the signal's number (130, 143), as a shell
expects of a process a signal stopped; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Refused(click.ClickException):
    """A problem with what `flowc run` was given (an input, a bundle, an address): one line
    naming it and the fix, exit 2; unlike a usage error, no usage text, as the options were fine."""

    exit_code = 2


def front_door_options(command: Any) -> Any:
    """Add the front door's options (API keys, admission limits, read timeouts, the drain's
    grace), made into click options from their one definition, flowrt.frontdoor.OPTIONS, which
    `python -m BUNDLE serve|launch` reads too. `command` gets them together as `front` (what the
    user wrote, by `Option.dest`; `serve_bundle` checks it); with `--once GRAPH` they are refused."""
    import functools

    from flowrt.frontdoor import OPTIONS

    @functools.wraps(command)
    def gathered(*args: Any, **kwargs: Any) -> Any:
        front = {option.dest: kwargs.pop(option.dest) for option in OPTIONS}
        given = [option.flag for option in OPTIONS if front[option.dest] not in (None, (), False)]
        if given and kwargs.get("graph_name") is not None:
            raise click.UsageError(f"{', '.join(given)}: for serving; leave them out with --once (one call, no server)")
        return command(*args, front=front, **kwargs)

    for option in reversed(OPTIONS):
        if option.metavar is None:
            declared = click.option(option.flag, option.dest, is_flag=True, help=option.help)
        elif option.repeatable:
            declared = click.option(option.flag, option.dest, metavar=option.metavar, multiple=True, help=option.help)
        else:
            shown = f" [default: {option.default}]" if option.default is not None else ""
            declared = click.option(option.flag, option.dest, metavar=option.metavar, help=option.help + shown)
        gathered = declared(gathered)
    return gathered


def parse_input(text: str) -> dict:
    """`--input`: a JSON object, or @FILE holding one. A string `file:PATH` anywhere in it is
    that file, as a data URL (`with_files`): how a local image or clip goes to a role."""
    source = "--input"
    base = Path.cwd()
    if text.startswith("@"):
        source = text[1:]
        base = Path(source).parent
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as error:
            raise Refused(f"--input: cannot read {source}: {error.strerror or error}") from None
        except UnicodeDecodeError as error:
            raise Refused(f"--input: {source} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise Refused(f"{source} is nested too deeply to read as JSON") from None
    except ValueError as error:
        raise Refused(f"--input is not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise Refused("--input must be a JSON object mapping each entry placeholder to its value")
    return with_files(value, base)


def with_files(value: dict, base: Path) -> dict:
    """`value` with each string `file:PATH` (relative to `base`; `file:///abs` too) replaced by
    the file as a `data:` URL (flowrt.media.with_files). Only the command line reads local
    files: a served call's `file:` URL is refused by the roles."""
    from flowrt.media import with_files as replaced

    return replaced(value, lambda name: _local_file(base / name.removeprefix("//")))


def _local_file(path: Path) -> tuple[bytes, str]:
    import mimetypes

    from flowrt.media import media_limits

    limit = media_limits().max_media_bytes
    try:
        size = path.stat().st_size
        if size > limit:
            raise Refused(f"--input: {path} is {size:,} bytes; media files are at most {limit:,} (FLOWRT_MAX_MEDIA_BYTES)")
        return path.read_bytes(), mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    except OSError as error:
        raise Refused(f"--input: cannot read file:{path}: {error.strerror or error}") from None


def option_value(check: Any, name: str, value: Any) -> Any:
    """`value` through one of flowrt.options' checks, or a usage error naming the option."""
    if value is None:
        return None
    try:
        return check(value)
    except ValueError as error:
        raise Refused(f"{name}: {error}") from None


def timeout_option(name: str, value: str | None) -> float | None:
    """A timeout option's seconds (a finite number > 0), or a usage error naming the option."""
    from flowrt import options

    return option_value(options.timeout_seconds, name, value)


def placement(deploy: str, registry: str | None, heartbeat_ttl: str | None, pool_mb: str | None = None) -> dict:
    """`--deploy`, `--registry`, `--heartbeat-ttl` and `--pool-mb`, checked, as open_deployment's arguments."""
    from flowrt import options
    from flowrt.deploy.launch import parse_deploy
    from flowrt.registry import RegistryError, parse_registry

    try:
        kind, _ = parse_deploy(deploy)
    except ValueError as error:
        raise Refused(f"--deploy: {error}") from None
    try:
        registry = parse_registry(registry)
    except RegistryError as error:
        raise Refused(str(error)) from None
    for name, given in (("--registry", registry), ("--heartbeat-ttl", heartbeat_ttl), ("--pool-mb", pool_mb)):
        if given is not None and kind == "inproc":
            raise Refused(f"{name} is for --deploy local or ray; add --deploy local, or leave {name} out")
    ttl = option_value(options.timeout_seconds, "--heartbeat-ttl", heartbeat_ttl)
    pool = option_value(options.pool_mib, "--pool-mb", pool_mb)
    if kind != "inproc" and pool != 0:
        pool = _checked_pool(pool)
    return (
        {"deploy": deploy, "registry": registry}
        | ({"heartbeat_ttl": ttl} if ttl is not None else {})
        | ({"pool_mb": pool} if pool is not None else {})
    )


def use_kv_meta(url: str) -> None:
    """--kv-meta: checked, then handed to every process of the deployment as $FLOWRT_KV_META."""
    if url != "embedded" and not url.startswith(("redis://", "rediss://")):
        raise Refused(f"--kv-meta {url!r}: give `embedded` or a Redis URL such as redis://127.0.0.1:6379/0")
    os.environ["FLOWRT_KV_META"] = url


def _checked_pool(pool: float | None) -> float | None:
    """--pool-mb (or $FLOWRT_POOL_MB, when it is not given) against the shared-memory file
    system's free space, before anything starts: a usage error naming the value and the fix.
    0 from $FLOWRT_POOL_MB turns the data plane off, as --pool-mb 0 does."""
    import importlib.util

    if importlib.util.find_spec("numpy") is None:
        return pool  # no data plane without numpy: the pool is never made
    from flowrt.memory.keeper import MemoryStartError, pool_bytes

    try:
        nbytes = pool_bytes(pool)
    except MemoryStartError as error:
        raise Refused(str(error)) from None
    return 0.0 if nbytes == 0 else pool


class _Signals:
    """SIGINT/SIGTERM during `--once`: cancel the call, or stop opening the bundle."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.runtime: Any = None  # set once the call can be cancelled
        self.task = asyncio.current_task()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in SIGNALS:
            loop.add_signal_handler(signum, self.handle, signum)

    def handle(self, signum: int) -> None:
        if self.received is not None:  # a second signal: do not wait for roles that are slow to stop
            print(f"flowc: {signal.Signals(signum).name} again; exiting without waiting for the call", file=sys.stderr)
            sys.stderr.flush()
            os._exit(128 + signum)
        self.received = signum
        if self.runtime is not None:
            self.runtime.cancel_all("shutdown")
        elif self.task is not None:
            self.task.cancel()  # still opening the bundle (a role's setup, say): stop there


async def run_once(
    bundle_dir: Path,
    graph: str,
    inputs: dict,
    session: str | None,
    timeout: float | None,
    placement: dict | None = None,
    debug: bool = False,
    trace_file: str | None = None,
) -> int:
    """Call `graph` once, print its events as JSON lines; the exit status. With `trace_file`,
    the call's Chrome trace is written there (flowrt.observe.trace)."""
    from flowrt.control import FlowrtError
    from flowrt.deploy import open_deployment
    from flowrt.values import event_json

    trace = _trace_to(trace_file) if trace_file is not None else None
    signals = _Signals()
    signals.install()
    try:
        deployment = await open_deployment(bundle_dir, **(placement or {}), debug=debug)
        runtime = deployment.runtime
    except FlowrtError as error:
        raise Refused(str(error)) from None
    except asyncio.CancelledError:
        if signals.received is None:
            raise
        print(f"flowc: {signal.Signals(signals.received).name}: stopped while opening the bundle", file=sys.stderr)
        return 128 + signals.received
    status = "error"
    try:
        signals.runtime = runtime
        if signals.received is not None:
            return 128 + signals.received
        observer = None if trace is None else _combined(runtime.observer, trace)  # (a JSON log's CallLog too)
        async for event in runtime.call(graph, inputs, session=session, timeout=timeout, observer=observer):
            click.echo(event_json(event))
            if event["event"] == "done":
                status = event["status"]
    except FlowrtError as error:
        raise Refused(str(error)) from None
    finally:
        await deployment.close()
    if trace is not None:
        _write_trace(trace, trace_file)
    if signals.received is not None:
        return 128 + signals.received
    return 0 if status == "ok" else 1


def _combined(*observers: Any) -> Any:
    from flowrt.observe import combine

    return combine(*observers)


def _trace_to(path: str) -> Any:
    """--trace FILE: the observer that records the call; Refused at once if FILE cannot be written."""
    from flowrt.observe import CallTrace

    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir() or not folder.is_dir() or not os.access(target if target.exists() else folder, os.W_OK):
        raise Refused(f"--trace: cannot write {path}; choose a file in a writable directory, e.g. --trace call.json")
    return CallTrace("flowc run")


def _write_trace(trace: Any, path: str) -> None:
    try:
        Path(path).write_bytes(trace.chrome_trace_json() + b"\n")
    except OSError as error:
        raise Refused(f"--trace: cannot write {path}: {error.strerror or error}; choose a writable path") from None


@contextlib.asynccontextmanager
async def deployed(bundle_dir: Path, placement: dict | None = None, debug: bool = False, open_timeout: float | None = None):
    """The runtime of the bundle at `bundle_dir`, deployed as `placement` says (`placement()`)
    and closed on leaving; Refused when it cannot open (a role that cannot run, say), or does
    not within `open_timeout` seconds (a setup() that never returns)."""
    from flowrt.control import FlowrtError
    from flowrt.deploy import open_deployment
    from flowrt.logs import show_log

    show_log(debug=debug)
    try:
        deployment = await asyncio.wait_for(open_deployment(bundle_dir, **(placement or {}), debug=debug), open_timeout)
    except FlowrtError as error:
        raise Refused(str(error)) from None
    except TimeoutError:
        raise Refused(
            f"it did not start within {open_timeout:g}s: a role's setup() does not return, or waits for what never comes"
        ) from None
    try:
        yield deployment.runtime
    finally:
        await deployment.close()


async def call_events(runtime: Any, graph: str, inputs: dict, timeout: float | None = None) -> list[dict]:
    """The events of one call as plain JSON data, exactly what `--once` prints; Refused when
    the runtime refuses the call (an unknown graph, inputs that do not fit its entry)."""
    from flowrt.control import FlowrtError
    from flowrt.values import event_json

    try:
        return [json.loads(event_json(event)) async for event in runtime.call(graph, inputs, timeout=timeout)]
    except FlowrtError as error:
        raise Refused(str(error)) from None


def serve_bundle(
    bundle_dir: Path,
    http: str,
    session_ttl: float,
    max_sessions: int,
    max_body_mb: float,
    placement: dict | None = None,
    debug: bool = False,
    quiet: bool = False,
    front: dict | None = None,
) -> None:
    """Serve over HTTP until SIGINT or SIGTERM, showing how the start goes unless `quiet`;
    `front`: the front-door options as given (flowc.serve_options), checked here."""
    try:
        from flowrt.deploy.serving import CannotListen, Stopped, serve
        from flowrt.gateway import parse_address
    except ImportError as error:
        raise click.ClickException(f"serving needs aiohttp ({error}); reinstall flowc: pip install flowc") from None
    from flowc.progress import Startup
    from flowrt.control import FlowrtError
    from flowrt.frontdoor import front_door
    from flowrt.logs import log_format

    try:
        host, port = parse_address(http)
    except ValueError as error:
        raise Refused(f"--http takes HOST:PORT: {error}") from None
    try:
        door = front_door(front or {})
    except ValueError as error:
        raise Refused(str(error)) from None
    startup = Startup.for_stream(sys.stderr, quiet=quiet or log_format() == "json")
    try:
        asyncio.run(
            serve(
                bundle_dir,
                host,
                port,
                session_ttl=session_ttl,
                max_sessions=max_sessions,
                max_body_mb=max_body_mb,
                debug=debug,
                progress=startup,
                front=door,
                **(placement or {}),
            )
        )
    except CannotListen as error:
        raise Refused(str(error)) from None
    except Stopped as stopped:
        startup.close()
        print(f"flowc: {stopped}", file=sys.stderr)
        sys.exit(128 + stopped.signum)
    except FlowrtError as error:
        raise Refused(str(error)) from None
    finally:
        startup.close()
