"""The tables a generated node module hands to flowrt, as typed, immutable records.

A module under a bundle's `nodes/` holds its role's tables as plain literals (readable, diffable,
no imports but this module) and calls `role_spec(...)`; the node controller then works from the
`RoleSpec`. graphs.py's graph literals are read as they are; `entry_stream` reads which of a
graph's entries stream and `interruptible` whether its calls may be interrupted. The literals
have the shape of the static plan's JSON (docs/plan.schema.json), so a table read here equals
the plan entry it came from; `RoleSpec.as_literal()` gives it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


class TableError(ValueError):
    """A generated module's tables are malformed (edited by hand, or from another flowc)."""


@dataclass(frozen=True, slots=True)
class Slot:
    producer: str
    field: str
    critical: bool
    stream: bool


@dataclass(frozen=True, slots=True)
class Group:
    index: int
    fields: tuple[str, ...]
    routing: str  # direct | bucket | join | dead
    slots: tuple[Slot, ...]
    root: str | None
    missing: tuple[str, ...]
    slots_by_field: tuple[tuple[int, ...], ...] = field(init=False)  # slot indices of each field

    def __post_init__(self) -> None:
        by_field: dict[str, list[int]] = {}
        for i, s in enumerate(self.slots):
            by_field.setdefault(s.field, []).append(i)
        object.__setattr__(self, "slots_by_field", tuple(tuple(v) for v in by_field.values()))


@dataclass(frozen=True, slots=True)
class JoinField:
    field: str
    threshold: int | None  # None: all
    upstream: tuple[str, ...]
    upstream_set: frozenset[str] = field(init=False, compare=False)  # for membership tests at run time

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstream_set", frozenset(self.upstream))


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    group: int
    slot: int
    aid_rule: str  # A | C | join | caller
    root: str | None


@dataclass(frozen=True, slots=True)
class NodeTables:
    """One interface's tables in one graph."""

    id: str
    kind: str
    role: str | None
    groups: tuple[Group, ...]
    join: tuple[JoinField, ...] | None
    control: MappingProxyType  # out field -> tuple[Target, ...]
    stream: bool
    session: bool
    diamond_root: bool
    carried_roots: tuple[str, ...]
    in_cycle: bool
    key_ties: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class InterfaceSpec:
    name: str
    timeout_s: float | None
    batch: MappingProxyType | None
    stream: bool
    graphs: MappingProxyType  # graph name -> NodeTables


@dataclass(frozen=True, slots=True)
class RoleSpec:
    name: str
    impl: str
    replicas: int
    lb: str
    gpus: int
    nodes: int
    share_gpus_with: str | None
    uses: tuple[str, ...]
    batch: MappingProxyType | None
    timeout_s: float | None
    interfaces: MappingProxyType  # interface name -> InterfaceSpec

    def as_literal(self) -> dict[str, Any]:
        """The `TABLES` literal this spec was read from (the inverse of `role_spec`)."""
        return {
            name: {graph: _node_literal(tables) for graph, tables in spec.graphs.items()}
            for name, spec in self.interfaces.items()
        }


def role_spec(name: str, impl: str, resources: dict, interfaces: dict, tables: dict) -> RoleSpec:
    """Read a generated module's literals into a `RoleSpec`; raises `TableError` when malformed."""
    try:
        return RoleSpec(
            name=name,
            impl=impl,
            replicas=int(resources["replicas"]),
            lb=str(resources["lb"]),
            gpus=int(resources["gpus"]),
            nodes=int(resources["nodes"]),
            share_gpus_with=resources["share_gpus_with"],
            uses=tuple(resources["uses"]),
            batch=_frozen(resources["batch"]),
            timeout_s=resources["timeout_s"],
            interfaces=MappingProxyType(
                {
                    iface: InterfaceSpec(
                        name=iface,
                        timeout_s=config["timeout_s"],
                        batch=_frozen(config["batch"]),
                        stream=bool(config["stream"]),
                        graphs=MappingProxyType({g: node_tables(t) for g, t in tables.get(iface, {}).items()}),
                    )
                    for iface, config in interfaces.items()
                }
            ),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise TableError(
            f"tables of role `{name}` are malformed ({type(error).__name__}: {error}); rebuild the bundle with `flowc build`"
        ) from None


def _frozen(mapping: dict | None) -> MappingProxyType | None:
    return None if mapping is None else MappingProxyType(dict(mapping))


def node_tables(t: dict) -> NodeTables:
    """Read one node's plan entry (a `TABLES` literal or plan.json) into `NodeTables`."""
    return NodeTables(
        id=t["id"],
        kind=t["kind"],
        role=t["role"],
        groups=tuple(
            Group(
                index=g["index"],
                fields=tuple(g["fields"]),
                routing=g["routing"],
                slots=tuple(Slot(**s) for s in g["slots"]),
                root=g["root"],
                missing=tuple(g["missing"]),
            )
            for g in t["groups"]
        ),
        join=None if t["join"] is None else tuple(JoinField(j["field"], j["threshold"], tuple(j["upstream"])) for j in t["join"]),
        control=MappingProxyType({f: tuple(Target(**x) for x in targets) for f, targets in t["control"].items()}),
        stream=t["stream"],
        session=t["session"],
        diamond_root=t["diamond_root"],
        carried_roots=tuple(t["carried_roots"]),
        in_cycle=t["in_cycle"],
        key_ties=tuple(t["key_ties"]),
    )


def entry_stream(name: str, graph: dict) -> tuple[str, ...]:
    """The entries of graph `name` that stream (`placeholder stream`), read from its plan entry
    (graphs.py's `GRAPHS` literal, or plan.json): their values come as frames while the call
    runs, and their placeholder nodes' tables say `stream`. A bundle from a flowc before
    streaming entries records none. Raises `TableError` when the list is malformed."""
    names = graph.get("entry_stream", [])
    entry = graph.get("entry")
    if (
        not isinstance(names, list)
        or not isinstance(entry, list)
        or not all(isinstance(n, str) and n in entry for n in names)
        or len(set(names)) != len(names)
    ):
        raise TableError(
            f"graph `{name}`: `entry_stream` must list some of its entries ({entry!r}) once each, not {names!r}; "
            "rebuild the bundle with `flowc build`"
        )
    return tuple(names)


def interruptible(name: str, graph: dict) -> bool:
    """Whether graph `name` says `interruptible` (its plan entry's `interruptible`): a later call of
    the same session made with `interrupt` cancels its running call (flowrt.control.interrupts).
    A bundle from a flowc before it records nothing: not interruptible. Raises `TableError` when
    the value is not a boolean."""
    value = graph.get("interruptible", False)
    if not isinstance(value, bool):
        raise TableError(
            f"graph `{name}`: `interruptible` must be True or False, not {value!r}; rebuild the bundle with `flowc build`"
        )
    return value


def _node_literal(n: NodeTables) -> dict[str, Any]:
    return {
        "carried_roots": list(n.carried_roots),
        "control": {
            f: [{"aid_rule": x.aid_rule, "group": x.group, "node": x.node, "root": x.root, "slot": x.slot} for x in targets]
            for f, targets in n.control.items()
        },
        "diamond_root": n.diamond_root,
        "groups": [
            {
                "fields": list(g.fields),
                "index": g.index,
                "missing": list(g.missing),
                "root": g.root,
                "routing": g.routing,
                "slots": [
                    {"critical": s.critical, "field": s.field, "producer": s.producer, "stream": s.stream} for s in g.slots
                ],
            }
            for g in n.groups
        ],
        "id": n.id,
        "in_cycle": n.in_cycle,
        "join": None
        if n.join is None
        else [{"field": j.field, "threshold": j.threshold, "upstream": list(j.upstream)} for j in n.join],
        "key_ties": list(n.key_ties),
        "kind": n.kind,
        "role": n.role,
        "session": n.session,
        "stream": n.stream,
    }
