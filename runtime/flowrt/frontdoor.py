"""The HTTP front door's options, defined once: API keys, the admin key, admission limits, read
timeouts, the drain's grace, TLS and the scope of prefix reuse (docs/security.md). `flowc run` (click, flowc.running.front_door_options) and
`python -m BUNDLE serve|launch` (argparse, flowrt.deploy.entry) both build their options from
`OPTIONS`, and both hand what the user wrote to `front_door`, which checks it and returns the
`FrontDoor` the gateway serves with, or raises ValueError naming the option and the fix.

Keys come from `--api-key KEY` (repeatable), `--api-key-file PATH` (one key a line; blank lines
and `#` comments skipped) and `$FLOWC_API_KEYS` (comma-separated); all three add up. The admin
keys (`--admin-key`, `$FLOWC_ADMIN_KEYS`) are API keys too, and the only ones `/stats` shows
session ids, paths and process ids to.

`--tls-cert PATH --tls-key PATH` (both or neither) serve https: the files are read and checked
here, into the `ssl.SSLContext` the gateway's site listens with. `--prefix-scope key|shared`:
whether a call may reuse the KV pages of another API key's calls (`shared`) or only its own
key's (`key`, the default where keys are set; flowrt.control.sessions.PREFIX_SCOPE).
"""

from __future__ import annotations

import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_KEYS_ENV = "FLOWC_API_KEYS"
ADMIN_KEYS_ENV = "FLOWC_ADMIN_KEYS"
DEFAULT_HEADER_TIMEOUT = 10.0  # seconds a connection may take to send a request's headers
DEFAULT_BODY_TIMEOUT = 60.0  # seconds a request may take to send its body
DEFAULT_GRACE = 30.0  # seconds SIGTERM lets the calls in flight run before cancelling them
MIN_KEY_LENGTH = 8
PREFIX_SCOPES = ("key", "shared")


@dataclass(frozen=True)
class Option:
    """One option of the front door, as both command lines declare it."""

    flag: str  # e.g. "--api-key"
    dest: str  # the keyword `front_door` takes
    metavar: str | None  # None: a flag without a value
    help: str
    repeatable: bool = False
    default: str | None = None  # shown in --help; None: not given


OPTIONS = (
    Option(
        "--api-key",
        "api_key",
        "KEY",
        "Serving: a key callers must send as `Authorization: Bearer KEY` on /graphs, /v1 and /stats "
        "(repeatable; also --api-key-file and $FLOWC_API_KEYS; docs/security.md).",
        repeatable=True,
    ),
    Option(
        "--api-key-file", "api_key_file", "PATH", "Serving: a file of API keys, one a line (# comments and blank lines skipped)."
    ),
    Option(
        "--admin-key",
        "admin_key",
        "KEY",
        "Serving: a key that may also read /stats in full (session ids, paths, process ids); an API key too "
        "(repeatable; also $FLOWC_ADMIN_KEYS).",
        repeatable=True,
    ),
    Option(
        "--protect-metrics",
        "protect_metrics",
        None,
        "Serving: with keys, /metrics and /health ask for a key too (by default they are open, for probes and scrapers).",
    ),
    Option(
        "--max-in-flight",
        "max_in_flight",
        "N",
        "Serving: at most N calls run at once; more wait in the queue (default: no limit).",
    ),
    Option(
        "--max-queue",
        "max_queue",
        "M",
        "Serving: at most M calls wait for a place; more are answered 429 with Retry-After "
        "(default: 0 with --max-in-flight, else no limit).",
    ),
    Option(
        "--max-session-queue",
        "max_session_queue",
        "K",
        "Serving: at most K calls of one session run or wait at once; more are answered 429 (default: no limit).",
    ),
    Option(
        "--header-timeout",
        "header_timeout",
        "SECONDS",
        "Serving: a connection that has not sent a request's headers within this long is closed.",
        default=f"{DEFAULT_HEADER_TIMEOUT:g}",
    ),
    Option(
        "--body-timeout",
        "body_timeout",
        "SECONDS",
        "Serving: a request whose body has not arrived within this long is answered 408.",
        default=f"{DEFAULT_BODY_TIMEOUT:g}",
    ),
    Option(
        "--grace",
        "grace",
        "SECONDS",
        "Serving: on SIGTERM, the calls in flight may run this long (new ones get 503) before they are cancelled; "
        "0 cancels at once.",
        default=f"{DEFAULT_GRACE:g}",
    ),
    Option(
        "--tls-cert",
        "tls_cert",
        "PATH",
        "Serving: serve https with this certificate chain (PEM; give --tls-key too).",
    ),
    Option("--tls-key", "tls_key", "PATH", "Serving: the private key (PEM, unencrypted) of --tls-cert."),
    Option(
        "--prefix-scope",
        "prefix_scope",
        "key|shared",
        "Serving: `key`: a call reuses KV pages (a prompt's prefix) only of its own API key's calls, so reuse "
        "tells no tenant what another sent; `shared`: of every call (default: key with API keys, else shared).",
    ),
)


@dataclass(frozen=True)
class FrontDoor:
    """What the gateway enforces (flowrt.gateway.access, flowrt.gateway.admission)."""

    api_keys: tuple[str, ...] = ()  # every key that may call, admin keys included
    admin_keys: tuple[str, ...] = ()
    protect_metrics: bool = False
    max_in_flight: int | None = None
    max_queue: int | None = None
    max_session_queue: int | None = None
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    grace: float = DEFAULT_GRACE
    tls: ssl.SSLContext | None = field(default=None, compare=False)  # serve https (--tls-cert, --tls-key)
    prefix_scope: str = "shared"  # "key": prefix reuse only within an API key's calls
    sources: dict[str, int] = field(default_factory=dict, compare=False)  # where keys came from, counted (the log says)

    @property
    def keyed(self) -> bool:
        return bool(self.api_keys)


def _count(value: Any, flag: str, least: int) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < least:
        raise ValueError(f"{flag}: expected a whole number, {least} or more, not {value!r}")
    return int(text)


def _seconds(value: Any, flag: str, default: float, zero: bool = False) -> float:
    if value is None:
        return default
    try:
        seconds = float(str(value).strip()) if not isinstance(value, bool) else math.nan
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        least = "0 or more" if zero else "greater than 0"
        raise ValueError(f"{flag}: expected a finite number of seconds, {least}, e.g. {default:g}, not {value!r}")
    return seconds


def _key(key: str, source: str) -> str:
    key = key.strip()
    if len(key) < MIN_KEY_LENGTH or any(c.isspace() or not c.isprintable() for c in key):
        raise ValueError(
            f"{source}: an API key must be at least {MIN_KEY_LENGTH} printable characters without spaces "
            "(e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return key


class _Encrypted(Exception):
    """The TLS key asks for a password (flowrt asks for none)."""


def _no_password() -> bytes:
    raise _Encrypted


def tls_context(cert: Any, key: Any) -> ssl.SSLContext | None:
    """The server's TLS context from `--tls-cert` and `--tls-key` (both or neither: None);
    ValueError naming the option and the fix."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise ValueError(f"{given} needs {missing} too: give both (the certificate chain and its private key, PEM) or neither")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            Path(path).read_bytes()
        except OSError as error:
            raise ValueError(f"{flag}: cannot read {path}: {error.strerror or error}") from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key), password=_no_password)
    except _Encrypted:
        raise ValueError(
            f"--tls-key: {key} is encrypted; give an unencrypted key (e.g. `openssl pkey -in {key} -out plain.pem`), "
            "readable by the server's user only"
        ) from None
    except (ssl.SSLError, OSError) as error:
        why = getattr(error, "reason", None) or str(error)
        raise ValueError(
            f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate chain and its private key ({why}); "
            "give the certificate (chain) file and the key it was issued for"
        ) from None
    return context


def _prefix_scope(value: Any, keyed: bool) -> str:
    if value is None:
        return "key" if keyed else "shared"
    scope = str(value).strip().lower()
    if scope not in PREFIX_SCOPES:
        raise ValueError(f"--prefix-scope: expected key or shared, not {value!r}")
    if scope == "key" and not keyed:
        raise ValueError("--prefix-scope key scopes prefix reuse to API keys: give --api-key too (or leave it out)")
    return scope


def _environment_keys(environ: Mapping[str, str], name: str) -> list[str]:
    """The comma-separated keys of `$name`. Set but holding none (an empty secret, a lone comma)
    is an error, as an empty key file is: a deployment whose secret failed to arrive must not
    serve without keys."""
    if name not in environ:
        return []
    keys = [key for key in environ[name].split(",") if key.strip()]
    if not keys:
        raise ValueError(f"${name} is set but holds no key (comma-separated); give the keys, or unset it to serve without")
    return [_key(key, f"${name}") for key in keys]


def read_key_file(path: str) -> list[str]:
    """The keys in `path`, one a line; ValueError naming the file and what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"--api-key-file: cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--api-key-file: {path} is not UTF-8 text") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"--api-key-file: {path} holds no key (one a line)")
    return [_key(key, f"--api-key-file {path}") for key in keys]


def front_door(given: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> FrontDoor:
    """The options as the user gave them (`Option.dest` → a string, a list of strings for the
    repeatable ones, True for a flag; missing or None: not given) → FrontDoor; ValueError naming
    the option and the fix."""
    environ = os.environ if environ is None else environ
    sources: dict[str, int] = {}

    def add(found: list[str], keys: list[str], source: str) -> None:
        if keys:
            sources[source] = len(keys)
        found += keys

    admin: list[str] = []
    add(admin, [_key(k, "--admin-key") for k in given.get("admin_key") or ()], "--admin-key")
    add(admin, _environment_keys(environ, ADMIN_KEYS_ENV), ADMIN_KEYS_ENV)
    keys: list[str] = []
    add(keys, [_key(k, "--api-key") for k in given.get("api_key") or ()], "--api-key")
    if given.get("api_key_file"):
        add(keys, read_key_file(str(given["api_key_file"])), "--api-key-file")
    add(keys, _environment_keys(environ, API_KEYS_ENV), API_KEYS_ENV)
    protect = bool(given.get("protect_metrics"))
    if protect and not (keys or admin):
        raise ValueError("--protect-metrics asks for a key on /metrics and /health: give --api-key or --admin-key too")
    in_flight = _count(given.get("max_in_flight"), "--max-in-flight", 1)
    queue = _count(given.get("max_queue"), "--max-queue", 0)
    if queue is not None and in_flight is None:
        raise ValueError("--max-queue bounds the calls waiting for --max-in-flight: give --max-in-flight N too")
    return FrontDoor(
        api_keys=tuple(dict.fromkeys(keys + admin)),
        admin_keys=tuple(dict.fromkeys(admin)),
        protect_metrics=protect,
        max_in_flight=in_flight,
        max_queue=queue if queue is not None else (0 if in_flight is not None else None),
        max_session_queue=_count(given.get("max_session_queue"), "--max-session-queue", 1),
        header_timeout=_seconds(given.get("header_timeout"), "--header-timeout", DEFAULT_HEADER_TIMEOUT),
        body_timeout=_seconds(given.get("body_timeout"), "--body-timeout", DEFAULT_BODY_TIMEOUT),
        grace=_seconds(given.get("grace"), "--grace", DEFAULT_GRACE, zero=True),
        tls=tls_context(given.get("tls_cert"), given.get("tls_key")),
        prefix_scope=_prefix_scope(given.get("prefix_scope"), bool(keys or admin)),
        sources=sources,
    )


def add_to_argparse(parser: Any) -> None:
    """Declare `OPTIONS` on an argparse parser (flowrt.deploy.entry); read them back with
    `front_door(vars(args))`."""
    for option in OPTIONS:
        if option.metavar is None:
            parser.add_argument(option.flag, dest=option.dest, action="store_true", help=option.help)
        elif option.repeatable:
            parser.add_argument(option.flag, dest=option.dest, metavar=option.metavar, action="append", help=option.help)
        else:
            shown = f" (default: {option.default})" if option.default is not None else ""
            parser.add_argument(option.flag, dest=option.dest, metavar=option.metavar, help=option.help + shown)
