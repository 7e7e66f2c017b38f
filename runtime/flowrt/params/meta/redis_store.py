"""The Redis metadata store: many machines, Redis the single source of truth (paper §4.1.3).

Every write is a Lua script (data files under lua/, each prefixed with lua/_lib.lua), loaded
once with SCRIPT LOAD and called by EVALSHA, loaded again on NOSCRIPT (a restarted or flushed
Redis); reads are pipelined. The whole prefix match, providers' slots included, is one
EVALSHA; so is `locate`. URLs:
`redis://[:PASSWORD@]HOST:PORT/DB` or `rediss://` (TLS). Key schema, all under the deployment's
prefix `flowkv:{DEPLOYMENT}:` (the braces are a cluster hash tag: one slot per deployment):

    layouts              hash  full layout id -> layout JSON                 deployment ttl
    lfull                hash  part layout id -> full layout id              deployment ttl
    parts:{full}         hash  part layout id -> part JSON                   deployment ttl
    members:{full}       hash  "node|part" -> 1, as registered               deployment ttl
    ver:{full}           int   bumped by every registration touching full    deployment ttl
    combos:{full}        JSON  {"version", "combos": [[part ids]...]}        deployment ttl
    node:{node}          hash  part id -> full id: the node's holdings       node ttl (heartbeat)
    chain:{full}:{sid}   list  the session's page hashes in order            publish ttl
    page:{full}:{hash}   hash  "node|part" -> "@SLOT" or "1" (no location):  publish ttl
                               the page's providers and where each keeps it
    psess:{full}:{hash}  set   sessions whose chains hold the page           publish ttl
    rlock:{full}:{hash}  zset  "reader|provider" -> expiry (ms, Redis TIME)  longest lock
    run:{sid}            zset  holder -> expiry (ms, Redis TIME)             longest lock

The deployment ttl (default one hour) is renewed by registrations and heartbeats, so the keys of
a deployment nobody runs any more expire. The store holds metadata only: losing Redis loses no
page; nodes register and publish again. A location is a field value of the page's key, not a
key of its own: it has the page's TTL, goes with its provider's field on eviction, and nothing
is left behind once a page's providers are gone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from urllib.parse import urlsplit

from flowrt.params.layout import KVLayout
from flowrt.params.meta.combos import candidate_combinations
from flowrt.params.meta.embedded import full_of
from flowrt.params.meta.types import (
    SEP,
    Eviction,
    Match,
    MetaError,
    MetaScriptError,
    MetaStore,
    MetaUnavailable,
    Provider,
    Segment,
    check_name,
    check_slots,
    check_ttl,
)

SCRIPTS = (
    "noop",
    "register_layout",
    "register_node",
    "set_combos",
    "heartbeat",
    "unregister_node",
    "publish",
    "match",
    "locate",
    "lock_replica",
    "unlock_replica",
    "lock_run",
    "unlock_run",
    "evict",
)
DEPLOYMENT_TTL = 3600.0


def script_source(name: str) -> str:
    """The text SCRIPT LOAD gets for script `name`: the helpers, then the script."""
    folder = resources.files("flowrt.params.meta") / "lua"
    return (folder / "_lib.lua").read_text() + "\n" + (folder / f"{name}.lua").read_text()


def hidden(url: str) -> str:
    """`url` with any password replaced by ***, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}").geturl()


def prefix(deployment: str) -> str:
    return f"flowkv:{{{deployment}}}:"


MAX_SLOT_DIGITS = 20  # up to 2**64: a longer run of digits names no slot


def slot_value(text: str | None) -> int | None:
    """A slot as a page field names it (a decimal string), else None: unknown. Whatever else is
    there (a Redis writer's garbage) is unknown too, never an error: the slot a location names is
    only a hint, checked against the slot's label before anything is read (flowrt.params.pool_verify)."""
    if not text or len(text) > MAX_SLOT_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def slot_values(reply: Sequence[str | None]) -> tuple[int | None, ...]:
    """Slots as the scripts answer them (decimal strings, nil where unknown) -> ints and None."""
    return tuple(slot_value(value) for value in reply)


class RedisStore(MetaStore):
    def __init__(self, client, url: str, deployment: str, deployment_ttl: float = DEPLOYMENT_TTL):
        self.client = client
        self.url = url
        self.deployment = check_name("deployment", deployment)
        self.prefix = prefix(deployment)
        self._dttl = check_ttl("the deployment ttl", deployment_ttl)
        self._sha: dict[str, str] = {}

    @classmethod
    def connect(cls, url: str, deployment: str, *, deployment_ttl: float = DEPLOYMENT_TTL, connection_class=None) -> RedisStore:
        """A store over Redis at `url` (checked: reachable, password right, scripts loaded), or
        MetaUnavailable saying what is wrong and the fix."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise MetaUnavailable(
                f"the KV metadata store takes redis://[:PASSWORD@]HOST:PORT/DB or rediss://..., not {hidden(url)!r}"
            )
        extra = {"connection_class": connection_class} if connection_class is not None else {}
        client = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_connect_timeout=2,
            socket_timeout=5,
            retry=Retry(NoBackoff(), 1),  # one reconnect: a pooled connection Redis closed (a restart)
            **extra,
        )
        store = cls(client, url, deployment, deployment_ttl)
        store._load()
        return store

    def close(self) -> None:
        self.client.close()

    # ── talking to Redis ──

    def _errors(self, error: Exception, script: str | None = None) -> MetaError:
        from redis import exceptions

        shown = hidden(self.url)
        if isinstance(error, exceptions.AuthenticationError) or "WRONGPASS" in str(error) or "invalid password" in str(error):
            if urlsplit(self.url).password is None:
                return MetaUnavailable(
                    f"Redis at {shown} requires a password; give it in the URL: redis://:PASSWORD@HOST:PORT/DB"
                )
            return MetaUnavailable(f"Redis at {shown} refused the credentials ({error}); put the right password in the URL")
        if "NOAUTH" in str(error):
            return MetaUnavailable(f"Redis at {shown} requires a password; give it in the URL: redis://:PASSWORD@HOST:PORT/DB")
        if isinstance(error, exceptions.ConnectionError | exceptions.TimeoutError | OSError):
            return MetaUnavailable(
                f"cannot reach the KV metadata store at {shown} ({error}); start Redis there (or fix the URL), "
                "or use the embedded store on one machine"
            )
        text = str(error)
        if text.startswith("FLOWKV "):
            return MetaError(text.removeprefix("FLOWKV "))
        if script is not None:
            return MetaScriptError(f"the KV metadata script {script}.lua failed on Redis at {shown}: {text}")
        return MetaError(f"Redis at {shown} answered: {text}")

    def _load(self) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for name in SCRIPTS:
                pipe.script_load(script_source(name))
            self._sha = dict(zip(SCRIPTS, pipe.execute(), strict=True))
        except Exception as error:  # noqa: BLE001 - every failure becomes one clear error
            raise self._errors(error, "(SCRIPT LOAD)") from None

    def _run(self, name: str, *args):
        """EVALSHA script `name` (one round trip); SCRIPT LOAD again once on NOSCRIPT."""
        from redis import exceptions

        for attempt in (0, 1):
            try:
                return self.client.evalsha(self._sha[name], 1, self.prefix, *args)
            except exceptions.NoScriptError:
                if attempt:
                    raise MetaScriptError(
                        f"Redis at {hidden(self.url)} lost script {name}.lua again right after loading it"
                    ) from None
                self._load()
            except Exception as error:  # noqa: BLE001
                raise self._errors(error, name) from None
        raise AssertionError("unreachable")

    def _read(self, build) -> list:
        """One pipelined round trip of reads: `build(pipe)` queues them."""
        try:
            pipe = self.client.pipeline(transaction=False)
            build(pipe)
            return pipe.execute()
        except Exception as error:  # noqa: BLE001
            raise self._errors(error) from None

    # ── layouts and combinations ──

    def register_layout(self, layout: KVLayout) -> str:
        lid = layout.layout_id()
        self._run("register_layout", lid, layout.to_json(), self._dttl)
        return lid

    def _layouts(self) -> dict[str, KVLayout]:
        (found,) = self._read(lambda pipe: pipe.hgetall(self.prefix + "layouts"))
        return {lid: KVLayout.from_json(text) for lid, text in found.items()}

    def layout(self, layout_id: str) -> KVLayout | None:
        (text,) = self._read(lambda pipe: pipe.hget(self.prefix + "layouts", layout_id))
        return None if text is None else KVLayout.from_json(text)

    def register_node(self, node: str, layouts: Sequence[KVLayout], ttl: float) -> None:
        check_name("node", node)
        ms = check_ttl("a node's ttl", ttl)
        fulls = self._layouts()
        args: list[str] = []
        for part in layouts:
            args += [part.layout_id(), full_of(fulls, part), part.to_json()]
        affected = self._run("register_node", node, ms, self._dttl, *args)
        for full in affected:
            self._recompute(full, fulls[full] if full in fulls else self.layout(full))

    def _recompute(self, full: str, layout: KVLayout | None) -> None:
        """Recompute and store the combinations of `full` (compare-and-set on its version)."""
        for _ in range(20):
            parts, members, version = self._read(
                lambda pipe: (
                    pipe.hgetall(self.prefix + f"parts:{full}"),
                    pipe.hkeys(self.prefix + f"members:{full}"),
                    pipe.get(self.prefix + f"ver:{full}"),
                )
            )
            members = sorted(members)
            alive = self._read(
                lambda pipe, members=members: [
                    pipe.hexists(self.prefix + "node:" + m.split(SEP)[0], m.split(SEP)[1]) for m in members
                ]
            )
            frequency: dict[str, int] = {}
            for member, live in zip(members, alive, strict=True):
                if live:
                    part = member.split(SEP)[1]
                    frequency[part] = frequency.get(part, 0) + 1
            held = {lid: KVLayout.from_json(text) for lid, text in parts.items() if frequency.get(lid)}
            combos = candidate_combinations(layout, held, frequency) if layout is not None else []
            text = json.dumps({"version": version, "combos": [list(c) for c in combos]}, separators=(",", ":"))
            if self._run("set_combos", full, version or "0", text, self._dttl):
                return
        raise MetaError(f"the combinations of layout {full} kept changing under registrations; register again")

    def heartbeat(self, node: str, ttl: float) -> bool:
        return bool(self._run("heartbeat", node, check_ttl("a node's ttl", ttl), self._dttl))

    def unregister_node(self, node: str) -> None:
        for full in self._run("unregister_node", node):
            self._recompute(full, self.layout(full))

    def node_alive(self, node: str) -> bool:
        (count,) = self._read(lambda pipe: pipe.exists(self.prefix + "node:" + node))
        return bool(count)

    def combinations(self, layout_id: str) -> list[tuple[str, ...]]:
        (text,) = self._read(lambda pipe: pipe.get(self.prefix + f"combos:{layout_id}"))
        return [] if text is None else [tuple(c) for c in json.loads(text)["combos"]]

    # ── publishing and matching ──

    def publish(
        self,
        node: str,
        session: str,
        layout_id: str,
        pages: Sequence[str],
        ttl: float,
        start: int | None = None,
        slots: Sequence[int] | None = None,
    ) -> int:
        check_name("node", node)
        check_name("session", session)
        for page in pages:
            check_name("page hash", page)
        ms = check_ttl("a page's ttl", ttl)
        located = check_slots(pages, slots)
        begin = -1 if start is None else start
        flag = "0" if located is None else "1"
        return int(self._run("publish", node, layout_id, session, ms, begin, flag, *pages, *(located or ())))

    def chain(self, layout_id: str, session: str) -> list[str]:
        (pages,) = self._read(lambda pipe: pipe.lrange(self.prefix + f"chain:{layout_id}:{session}", 0, -1))
        return pages

    def match(self, session: str, layout_id: str, pages: Sequence[str]) -> Match:
        reply = self._run("match", layout_id, session, *pages)
        length, chain_length, count = int(reply[0]), int(reply[1]), int(reply[2])
        segments, at = [], 3
        for _ in range(count):
            start, stop, k = int(reply[at]), int(reply[at + 1]), int(reply[at + 2])
            pairs = reply[at + 3 : at + 3 + 2 * k]
            at += 3 + 2 * k
            slots = tuple(tuple(slot_value(slot) for slot in reply[at + j].split(",")) for j in range(k))
            at += k
            providers = tuple(Provider(pairs[j + 1], pairs[j]) for j in range(0, 2 * k, 2))
            segments.append(Segment(start, stop, providers, slots))
        return Match(length, chain_length, tuple(segments))

    def locate(self, node: str, layout_id: str, pages: Sequence[str]) -> list[int | None]:
        return list(slot_values(self._run("locate", node, layout_id, *pages)))

    # ── locks ──

    def lock_replica(self, reader: str, provider: str, layout_id: str, pages: Sequence[str], ttl: float) -> None:
        check_name("reader", reader)
        check_name("provider", provider)
        self._run("lock_replica", reader, provider, layout_id, check_ttl("a lock's ttl", ttl), *pages)

    def unlock_replica(self, reader: str, provider: str, layout_id: str, pages: Sequence[str]) -> None:
        self._run("unlock_replica", reader, provider, layout_id, *pages)

    def lock_run(self, session: str, holder: str, ttl: float) -> None:
        check_name("session", session)
        check_name("holder", holder)
        self._run("lock_run", session, holder, check_ttl("a lock's ttl", ttl))

    def unlock_run(self, session: str, holder: str) -> None:
        self._run("unlock_run", session, holder)

    # ── eviction ──

    def evict(self, node: str, layout_id: str, pages: Sequence[str], drop: bool = False) -> list[Eviction]:
        reasons = self._run("evict", node, layout_id, "1" if drop else "0", *pages)
        return [Eviction(page, reason) for page, reason in zip(pages, reasons, strict=True)]

    # ── housekeeping ──

    def keys(self) -> list[str]:
        """Every key of this deployment (SCAN; for tests and tools, not the hot path)."""
        try:
            return sorted(self.client.scan_iter(match=self.prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000))
        except Exception as error:  # noqa: BLE001
            raise self._errors(error) from None

    def forget(self) -> int:
        """Delete every key of this deployment; how many there were."""
        keys = self.keys()
        for i in range(0, len(keys), 500):
            self._read(lambda pipe, chunk=keys[i : i + 500]: pipe.delete(*chunk))
        return len(keys)
