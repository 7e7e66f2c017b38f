"""What a call's trace is made of, before it is written: the bytes an activation's inputs carry,
each activation's lane, and the lanes' thread ids and metadata events. flowrt.observe.trace
writes the JSON with them, and so does its C writer (flowrt.observe._tracewriter), so the two
lay a trace out the same way by construction.
"""

from __future__ import annotations

import dataclasses
import operator
from types import SimpleNamespace
from typing import Any

import msgspec

CALLER_LANE = "call"
START_THEN_AID = operator.itemgetter(4, 0)  # a record's start, then its aid (flowrt.observe.trace.RECORD)
NO_PAYLOAD = frozenset({str, int, float, bool, type(None), dict, tuple})  # values that carry no tensor or bytes


def printable(value: Any) -> Any:
    """A str as a trace can carry it: characters UTF-8 cannot encode (lone surrogates, which is
    what undecodable bytes in a header or a command-line argument become) as their escape, so
    `a\udcffb` reads `a\\udcffb`; anything else as it is."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(value, str) else value


def printable_trace(trace: Any) -> SimpleNamespace:
    """A trace's fields with every str among them `printable`: what both writers write instead
    when UTF-8 cannot encode one (a session, say), rather than failing the call's answer."""
    return SimpleNamespace(
        process=printable(trace.process), pid=trace.pid, call_id=printable(trace.call_id), graph=printable(trace.graph),
        session=printable(trace.session), status=printable(trace.status), started=trace.started, ended=trace.ended,
        activations=[(r[0], printable(r[1]), printable(r[2]), *r[3:]) for r in trace.activations],
    )  # fmt: skip


def payload_bytes(inputs: dict) -> int:
    """The bytes of the tensors and byte strings among an activation's inputs (a list's items
    and a dataclass's fields counted too: an audio clip's samples, say): what a deployment that
    copies frames moves; in process nothing is copied. It never raises (it runs in a hook): what
    cannot say its size (a released memoryview, a sparse tensor) counts 0."""
    total = 0
    try:
        for value in inputs.values():
            if type(value) not in NO_PAYLOAD:  # (most inputs are small values: one set lookup)
                total += value_bytes(value)
    except Exception:  # noqa: BLE001 - inputs that cannot be read: what was counted so far
        pass
    return total


def value_bytes(value: Any) -> int:
    """`payload_bytes` of one input value."""
    total = 0
    for item in value if isinstance(value, list) else (value,):
        total += _item_bytes(item)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            total += sum(_item_bytes(getattr(item, field.name, None)) for field in dataclasses.fields(item))
    return total


def _item_bytes(item: Any) -> int:
    try:
        if isinstance(item, (bytes, bytearray)):
            return len(item)
        if type(item) in NO_PAYLOAD:
            return 0
        nbytes = item.nbytes if isinstance(item, memoryview) else getattr(item, "nbytes", None)
    except Exception:  # noqa: BLE001 - a size it cannot tell (a released memoryview, a sparse tensor)
        return 0
    return nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) and 0 <= nbytes < MAX_BYTES else 0


MAX_BYTES = 1 << 62  # a size past this is not one (an object's own `nbytes` saying so is not believed)


def lanes(records: list[tuple]) -> list[str]:
    """Each activation's lane, `records` sorted by start: its replica's, or a further lane of
    that replica where it overlaps one already there (interval partitioning: the first lane
    free at its start)."""
    placed: list[str] = []
    free_at: dict[str, list[float]] = {}  # replica -> when each of its lanes is free again
    for record in records:
        name = replica_name(record[1], record[3])
        start, end = record[4], record[5]
        ends = free_at.get(name)
        if ends is None:
            free_at[name] = [end]
            placed.append(name)
            continue
        for index, free in enumerate(ends):
            if free <= start:
                ends[index] = end
                break
        else:
            index = len(ends)
            ends.append(end)
        placed.append(name if index == 0 else f"{name} ({index + 1})")
    return placed


class Layout(msgspec.Struct, frozen=True):
    """The lanes of a trace: their thread ids (the caller's first, then by `_lane_order`) and
    the metadata events naming the process and its lanes, as JSON text (comma separated, no
    brackets)."""

    tids: dict[str, int]
    metadata_json: bytes


def layout(process: str, pid: int, names: frozenset[str]) -> Layout:
    """The layout of a trace with these lanes. The same lanes recur call after call, so it is
    made once and shared by every trace that has them (traces are read, never changed)."""
    key = (process, pid, names)
    made = _LAYOUTS.get(key)
    if made is not None:
        return made
    tids = {CALLER_LANE: 1}
    for index, name in enumerate(sorted(names, key=_lane_order)):
        tids[name] = index + 2
    metadata = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"{process} (pid {pid})"}}]
    for name, tid in tids.items():
        metadata.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        metadata.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    text = b",".join(msgspec.json.encode(event) for event in metadata)
    return _remember(_LAYOUTS, key, Layout(tids, text))


def replica_name(role: str, replica: int) -> str:
    """A replica's lane: `role#N`, `role#all` (a broadcast), `role#?` (never started)."""
    name = _REPLICA_NAMES.get((role, replica))
    if name is None:
        name = f"{role}#{'all' if replica == -2 else '?' if replica < 0 else replica}"
        _remember(_REPLICA_NAMES, (role, replica), name)
    return name


def label(role: str, interface: str) -> str:
    """An activation's name: `role.interface`."""
    made = _LABELS.get((role, interface))
    if made is None:
        made = _remember(_LABELS, (role, interface), f"{role}.{interface}")
    return made


def _lane_order(name: str) -> tuple:
    """Lanes by role, then replica number, then overflow lane (read back off `lanes`' names;
    any name sorts, whatever its role is called)."""
    base, paren, extra = name.rpartition(" (")
    if paren and extra.endswith(")") and extra[:-1].isdecimal():
        overflow = int(extra[:-1])
    else:
        base, overflow = name, 1
    role, _, number = base.rpartition("#")
    return (role, int(number) if number.isdecimal() else 1 << 30, overflow)


# names and layouts made once, by what they are made of; bounded, as a call's roles and replicas
# are (a cache that fills up starts over)
_REPLICA_NAMES: dict[tuple[str, int], str] = {}
_LABELS: dict[tuple[str, str], str] = {}
_LAYOUTS: dict[tuple, Layout] = {}
_CACHE_SIZE = 4096


def _remember(cache: dict, key: Any, value: Any) -> Any:
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value
    return value
