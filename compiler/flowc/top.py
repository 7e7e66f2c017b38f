"""`flowc top URL`: a live terminal view of a serving deployment (`flowc run DIR --http ...`,
`python -m BUNDLE serve|launch`), drawn with rich.

It reads only what the server answers over HTTP: `GET /health` once (is this a flowrt
server, and which bundle), then at every refresh `GET /metrics` (Prometheus text, read with
prometheus_client's parser) and `GET /stats` (its `in_flight` calls). It shows, per role,
replicas up, queued and in-flight activations, activations per second, p50/p99 activation
latency, errors, restarts and heartbeat lapses; per graph, calls by status, calls per second,
calls in flight, p50/p99 call latency, p50 time to the first streamed frame and p50 time to
first audio (graphs whose calls stream audio: flowrt.observe.audio); the pools (KV
pages by tier, Tmp Buffer bytes, prefix-cache tokens); and the calls in flight (graph, call
id, session, age). Percentiles are estimated from the histograms' buckets since the server
started, as Prometheus' histogram_quantile does; rates are the counters' increase between two
successive scrapes. A figure the server does not export is shown as "–".

`--once` prints one frame to stdout as plain text (no live screen) and exits.

A server started with API keys (docs/security.md) answers `/stats` only to a request that sends
one: `--api-key KEY`, else the first key of `$FLOWC_ADMIN_KEYS` (an admin key's `/stats` shows
the calls' sessions too), else the first of `$FLOWC_API_KEYS`, the variables the server reads.
The key is sent as `Authorization: Bearer KEY` on every request, and never printed.
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import click

DASH = "–"
TIMEOUT = 5.0  # seconds for one request to the server
MAX_CALLS_SHOWN = 20
Samples = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value) of each series


class TopError(click.ClickException):
    """The URL does not lead to a flowrt server: one line naming the fix, exit 2."""

    exit_code = 2


# ── reading the server ──


def base_url(text: str) -> str:
    """`HOST:PORT` or `http(s)://HOST:PORT[/]` → `http(s)://HOST:PORT`; TopError otherwise."""
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TopError(f"{text!r} is not a server's address; give the URL `flowc run` printed, e.g. http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise TopError(f"{text!r} has no valid port; give the URL `flowc run` printed, e.g. http://127.0.0.1:8000") from None
    path = parts.path.rstrip("/")
    if path.rsplit("/", 1)[-1] in ("health", "metrics", "stats", "graphs"):
        path = path.rsplit("/", 1)[0]  # one of the server's own pages: top reads them all from the root
    if path or parts.query:
        raise TopError(f"{text!r} has a path; give the server's root URL, as `flowc run` printed it, e.g. http://127.0.0.1:8000")
    if parts.username or parts.password:
        raise TopError("give the server's URL without a user or password: flowrt serves none")
    return f"{parts.scheme}://{parts.netloc}"


def api_key(given: str | None, environ: Any = None) -> str | None:
    """The key top sends: `--api-key`, else the first of $FLOWC_ADMIN_KEYS, else of $FLOWC_API_KEYS."""
    import os

    from flowrt.frontdoor import ADMIN_KEYS_ENV, API_KEYS_ENV

    if given is not None:
        if not given.strip():
            raise click.BadParameter('give the key the server was started with, e.g. --api-key "$KEY"', param_hint="--api-key")
        return given.strip()
    environ = os.environ if environ is None else environ
    for name in (ADMIN_KEYS_ENV, API_KEYS_ENV):
        first = next((key.strip() for key in environ.get(name, "").split(",") if key.strip()), None)
        if first is not None:
            return first
    return None


def fetch(base: str, path: str, key: str | None = None) -> bytes:
    """The body of GET base+path (sending `key` as a Bearer token); TopError saying why not and what to do."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    try:
        request = urllib.request.Request(base + path, headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:  # noqa: S310 - the user's own server
            return answer.read()
    except urllib.error.HTTPError as error:
        if error.code == 401:
            told = "refused the API key top sent" if key is not None else "asks for an API key"
            raise TopError(
                f"{base} {told} (GET {path} answered 401); give one the server was started with: "
                "--api-key KEY, or $FLOWC_API_KEYS / $FLOWC_ADMIN_KEYS (an admin key shows the calls' sessions too)"
            ) from None
        raise TopError(
            f"{base} answered GET {path} with {error.code} {error.reason}: it is not a flowrt server; "
            "give the URL `flowc run DIR --http HOST:PORT` printed (serving NAME on http://...)"
        ) from None
    except http.client.HTTPException as error:  # an answer that is not HTTP, or cut short
        raise TopError(
            f"{base} did not answer GET {path} in HTTP ({type(error).__name__}): it is not a flowrt server, or it "
            "stopped mid-answer; give the URL `flowc run DIR --http HOST:PORT` printed (serving NAME on http://...)"
        ) from None
    except (urllib.error.URLError, OSError) as error:
        why = getattr(error, "reason", error)
        raise TopError(
            f"cannot reach {base} ({why}); is the server running? start one with `flowc run DIR --http HOST:PORT` "
            "and give the URL it prints"
        ) from None


def fetch_json(base: str, path: str, key: str | None = None) -> dict:
    body = fetch(base, path, key)
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise TopError(
            f"{base}{path} did not answer with a JSON object: it is not a flowrt server; "
            "give the URL `flowc run DIR --http HOST:PORT` printed (serving NAME on http://...)"
        )
    return value


def check_server(base: str, key: str | None = None) -> dict:
    """GET /health: the server's bundle and graphs; TopError if it is not a flowrt server."""
    health = fetch_json(base, "/health", key)
    if not isinstance(health.get("bundle"), str) or not isinstance(health.get("graphs"), list):
        raise TopError(
            f"{base}/health is not a flowrt server's (no bundle, no graphs); "
            "give the URL `flowc run DIR --http HOST:PORT` printed (serving NAME on http://...)"
        )
    return health


def parse_exposition(text: str) -> Samples:
    """Prometheus text → every sample by name; TopError if it is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name].append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError) as error:
        raise TopError(f"GET /metrics is not Prometheus text ({error}): is this a flowrt server?") from None
    return dict(samples)


@dataclass
class Scrape:
    """What one refresh read: the samples, the statistics, and when (monotonic seconds)."""

    samples: Samples
    stats: dict
    at: float


def scrape(base: str, clock: Any = time.monotonic, key: str | None = None) -> Scrape:
    text = fetch(base, "/metrics", key).decode("utf-8", errors="replace")
    return Scrape(parse_exposition(text), fetch_json(base, "/stats", key), clock())


# ── arithmetic on samples ──


def series(samples: Samples, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for labels, value in samples.get(name, ()) if all(labels.get(k) == v for k, v in match.items())]


def total(samples: Samples, name: str, **match: str) -> float | None:
    """The sum of `name`'s series whose labels match; None where the server has none."""
    found = series(samples, name, **match)
    return sum(value for _, value in found) if found else None


def grouped(samples: Samples, name: str, by: str, **match: str) -> dict[str, float]:
    """The sum of `name`'s series by the value of label `by`."""
    sums: dict[str, float] = defaultdict(float)
    for labels, value in series(samples, name, **match):
        sums[labels.get(by, "")] += value
    return dict(sums)


def buckets(samples: Samples, name: str, **match: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets (upper bound, count), summed over the matching series."""
    counts: dict[float, float] = defaultdict(float)
    for labels, value in series(samples, f"{name}_bucket", **match):
        counts[float(labels.get("le", "+Inf"))] += value
    return sorted(counts.items())


def quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """The q-quantile estimated from cumulative buckets, as Prometheus' histogram_quantile:
    linear within the bucket it falls in (from 0 in the first); the highest finite bound if it
    falls in +Inf's. None without observations."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = (bound if not math.isinf(bound) else lower), count
    return lower


def rate(now: float | None, before: float | None, seconds: float) -> float | None:
    """A counter's increase per second between two scrapes (a reset counts from 0)."""
    if now is None or before is None or seconds <= 0:
        return None
    return (now - before if now >= before else now) / seconds


# ── what a frame shows ──


def seconds_text(value: float | None) -> str:
    if value is None:
        return DASH
    if value < 0.001:
        return f"{value * 1e6:.0f}µs"
    if value < 1:
        return f"{value * 1e3:.1f}ms"
    return f"{value:.2f}s"


def count_text(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def rate_text(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}/s"


def bytes_text(value: float | None) -> str:
    if value is None:
        return DASH
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return DASH  # (unreached)


ROLE_COLUMNS = ("role", "up", "queue", "in flight", "done", "act/s", "p50", "p99", "errors", "restarts", "lapses")
GRAPH_COLUMNS = ("graph", "calls", "ok", "error", "cancelled", "calls/s", "in flight", "p50", "p99", "first frame p50", "TTFA p50")
CALL_COLUMNS = ("graph", "call id", "session", "age")


@dataclass
class Frame:
    """One refresh, as text: a title line and rows per table (flowc.top's rendering draws them)."""

    title: str
    roles: list[tuple[str, ...]] = field(default_factory=list)
    graphs: list[tuple[str, ...]] = field(default_factory=list)
    pools: list[tuple[str, str]] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    more_calls: int = 0
    note: str = ""


def _labels(samples: Samples, label: str, *names: str) -> list[str]:
    found = {labels[label] for name in names for labels, _ in samples.get(name, ()) if label in labels}
    return sorted(found)


def build_frame(health: dict, now: Scrape, before: Scrape | None = None, url: str = "") -> Frame:
    """What to show for the scrape `now` (rates against `before`, where there is one)."""
    s, stats = now.samples, now.stats
    seconds = now.at - before.at if before is not None else 0.0
    previous = before.samples if before is not None else {}
    running = stats.get("calls")
    title = f"flowc top · {health.get('bundle', '?')} at {url}" + (
        f" · {running} call{'s'[: running != 1]} running, {stats.get('queued_calls', 0)} queued"
        if isinstance(running, int)
        else ""
    )
    frame = Frame(title)
    roles = _labels(s, "role", "flowrt_activations_total", "flowrt_activations_in_flight", "flowrt_replica_up")
    for role in roles:
        done = total(s, "flowrt_activations_total", role=role)
        in_flight = total(s, "flowrt_activations_in_flight", role=role)
        if in_flight is None:
            in_flight = total(s, "flowrt_replica_in_flight", role=role)
        latency = buckets(s, "flowrt_activation_duration_seconds", role=role)
        frame.roles.append(
            (
                role,
                count_text(total(s, "flowrt_replica_up", role=role)),
                count_text(total(s, "flowrt_replica_queue_depth", role=role)),
                count_text(in_flight),
                count_text(done),
                rate_text(rate(done, total(previous, "flowrt_activations_total", role=role), seconds)),
                seconds_text(quantile(0.5, latency)),
                seconds_text(quantile(0.99, latency)),
                count_text(
                    (total(s, "flowrt_activations_total", role=role, outcome="error") or 0.0) if done is not None else None
                ),
                count_text(total(s, "flowrt_replica_restarts_total", role=role)),
                count_text(total(s, "flowrt_heartbeat_lapses_total", role=role)),
            )
        )
    graphs = sorted(set(health.get("graphs", [])) | set(_labels(s, "graph", "flowrt_calls_total", "flowrt_calls_in_flight")))
    for graph in graphs:  # (a graph not called yet has no series: its counts are 0)
        calls = total(s, "flowrt_calls_total", graph=graph) or 0.0
        by_status = grouped(s, "flowrt_calls_total", "status", graph=graph)
        latency = buckets(s, "flowrt_call_duration_seconds", graph=graph)
        first = buckets(s, "flowrt_first_frame_seconds", graph=graph)
        audio = buckets(s, "flowrt_time_to_first_audio_seconds", graph=graph)
        called_before = total(previous, "flowrt_calls_total", graph=graph) or 0.0 if before is not None else None
        frame.graphs.append(
            (
                graph,
                count_text(calls),
                *(count_text(by_status.get(status, 0.0)) for status in ("ok", "error", "cancelled")),
                rate_text(rate(calls, called_before, seconds)),
                count_text(total(s, "flowrt_calls_in_flight", graph=graph) or 0.0),
                seconds_text(quantile(0.5, latency)),
                seconds_text(quantile(0.99, latency)),
                seconds_text(quantile(0.5, first)) if "flowrt_first_frame_seconds_bucket" in s else DASH,
                seconds_text(quantile(0.5, audio)) if audio else DASH,  # (graphs that stream no audio: none)
            )
        )
    frame.pools = pools(s)
    in_flight = stats.get("in_flight")
    if isinstance(in_flight, list):
        for call in in_flight[:MAX_CALLS_SHOWN]:
            frame.calls.append(
                (
                    str(call.get("graph", "?")),
                    str(call.get("call_id", "?")),
                    str(call.get("session", "?")),
                    _age(call.get("age_s")),
                )
            )
        frame.more_calls = max(0, len(in_flight) - MAX_CALLS_SHOWN)
    else:
        frame.note = "the server does not list its calls in flight (GET /stats has no `in_flight`)"
    return frame


def _age(seconds: Any) -> str:
    return seconds_text(float(seconds)) if isinstance(seconds, (int, float)) else DASH


def pools(s: Samples) -> list[tuple[str, str]]:
    """(what, how much) for the KV pages by tier, the Tmp Buffer Pool and the prefix cache."""
    rows: list[tuple[str, str]] = []
    tiers = _labels(s, "tier", "flowrt_kv_pages")
    for tier in tiers:
        states = grouped(s, "flowrt_kv_pages", "state", tier=tier)
        rows.append((f"KV pages ({tier})", " · ".join(f"{state} {count_text(n)}" for state, n in sorted(states.items()))))
    if not tiers:
        rows.append(("KV pages", DASH))
    tmp = grouped(s, "flowrt_tmp_buffer_bytes", "state")
    rows.append(("Tmp Buffer", " · ".join(f"{state} {bytes_text(n)}" for state, n in sorted(tmp.items())) if tmp else DASH))
    prefix = grouped(s, "flowrt_prefix_tokens_total", "kind")
    rows.append(
        ("prefix tokens", " · ".join(f"{kind} {count_text(n)}" for kind, n in sorted(prefix.items())) if prefix else DASH)
    )
    return rows


# ── drawing ──


def render(frame: Frame) -> Any:
    """The frame as a rich renderable: a title and four tables."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]], empty: str) -> Any:
        grid = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for index, name in enumerate(columns):
            if index == 0:  # names may fold onto a second line in a narrow terminal; figures never
                grid.add_column(name, justify="left", overflow="fold")
                continue
            widest = max([len(name), *(len(row[index]) for row in rows)])
            grid.add_column(name, justify="left" if name == "session" else "right", no_wrap=True, min_width=widest)
        for row in rows:
            grid.add_row(*row)
        if not rows:
            grid.add_row(empty, *[""] * (len(columns) - 1))
        return grid

    calls = table("calls in flight", CALL_COLUMNS, frame.calls, frame.note or "none")
    parts = [
        Text(frame.title, style="bold"),
        table("roles", ROLE_COLUMNS, frame.roles, "no activation yet"),
        table("graphs", GRAPH_COLUMNS, frame.graphs, "none"),
        table("pools", ("pool", "usage"), frame.pools, DASH),
        calls,
    ]
    if frame.more_calls:
        parts.append(Text(f"… and {frame.more_calls} more"))
    return Group(*parts)


@click.command("top")
@click.argument("url")
@click.option(
    "--interval", metavar="SECONDS", default="1", show_default=True, help="Seconds between refreshes (rates are over this)."
)
@click.option("--once", is_flag=True, help="Print one frame to stdout as plain text and exit (no live screen).")
@click.option(
    "--api-key",
    "key",
    metavar="KEY",
    help="The key of a server started with API keys (default: the first of $FLOWC_ADMIN_KEYS, else of $FLOWC_API_KEYS).",
)
def top(url: str, interval: str, once: bool, key: str | None = None) -> None:
    """Watch a serving deployment: per role replicas, queues, latency and errors; per graph
    calls and latency; pool usage; the calls in flight (docs/observe.md). Ctrl-C leaves.

    \b
    Examples:
      flowc top http://127.0.0.1:8000
      flowc top 127.0.0.1:8000 --interval 5
      flowc top http://127.0.0.1:8000 --once > snapshot.txt
      FLOWC_API_KEYS="$KEY" flowc top https://gateway.example:8443
    """
    try:
        every = float(interval)
    except ValueError:
        every = math.nan
    if not math.isfinite(every) or not 0.05 <= every <= 3600:
        raise click.BadParameter(
            f"{interval!r}: give a number of seconds from 0.05 to 3600, e.g. --interval 2", param_hint="--interval"
        )
    base = base_url(url)
    key = api_key(key)
    health = check_server(base, key)
    from rich.console import Console

    if once:
        console = Console(width=160, force_terminal=False, color_system=None, highlight=False)
        console.print(render(build_frame(health, scrape(base, key=key), url=base)))
        return
    console = Console()
    if not console.is_terminal:  # a pipe or a file: plain frames one after another, as `top -b` writes
        _batch(base, health, every, Console(width=160, force_terminal=False, color_system=None, highlight=False), key)
        return
    _live(base, health, every, console, key)


def _batch(base: str, health: dict, every: float, console: Any, key: str | None = None) -> None:
    """Print a plain frame every `every` seconds until Ctrl-C or a signal, each flushed as it is
    printed, so a reader (or a file cut short) has every frame so far."""
    before: Scrape | None = None
    try:
        while True:
            try:
                now = scrape(base, key=key)
            except TopError as error:
                console.print(f"flowc top · {base}: {error.message}")
                before = None
            else:
                console.print(render(build_frame(health, now, before, base)))
                before = now
            console.print()
            console.file.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return


def _live(base: str, health: dict, every: float, console: Any, key: str | None = None) -> None:
    """Refresh every `every` seconds until Ctrl-C; a server gone away is said in the view,
    and the view goes on once it answers again."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    before: Scrape | None = None
    with Live(console=console, auto_refresh=False, screen=False, transient=False) as live:
        try:
            while True:
                try:
                    now = scrape(base, key=key)
                except TopError as error:
                    live.update(Group(Text(f"flowc top · {base}", style="bold"), Text(error.message, style="red")), refresh=True)
                    before = None
                else:
                    live.update(render(build_frame(health, now, before, base)), refresh=True)
                    before = now
                time.sleep(every)
        except KeyboardInterrupt:
            return
