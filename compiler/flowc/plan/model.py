"""The static plan: everything the runtime needs, precomputed, so its hot path is table lookups.

One `GraphPlan` per graph (a role may sit in several graphs with different entries, so its
buckets, roots and control edges are per graph). `as_json()` gives plain data, every mapping
sorted, matching docs/plan.schema.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Slot:
    """One upstream path into a field of an OR group: the producer and the field it sends."""

    producer: str
    field: str
    critical: bool  # the field's only slot here: unreachable makes the bucket DEAD
    stream: bool  # fed by a stream producer below the bucket's root: satisfied at end-of-stream, a list


@dataclass(frozen=True)
class GroupPlan:
    index: int
    fields: tuple[str, ...]
    routing: str  # "bucket" | "direct" | "join" | "dead"
    slots: tuple[Slot, ...]
    root: str | None  # diamond root of a bucket
    missing: tuple[str, ...] = ()  # for a dead group: fields with no live producer


@dataclass(frozen=True)
class JoinField:
    field: str
    threshold: int | None  # None: all
    upstream: tuple[str, ...]  # for `all`: nodes whose end (for the call) completes the field


@dataclass(frozen=True)
class Target:
    """A control edge: who gets ARRIVED / SLOT_EOS / UNREACHABLE when a field is (not) yielded."""

    node: str  # a node id, or "caller" for the graph's stream/return
    group: int
    slot: int
    aid_rule: str  # "A" (seed from this node), "C" (seed from the root), "join" (one bucket per call), "caller"
    root: str | None = None


@dataclass(frozen=True)
class NodePlan:
    id: str
    kind: str  # "start" | "placeholder" | "interface"
    role: str | None
    groups: tuple[GroupPlan, ...]
    join: tuple[JoinField, ...] | None
    control: dict[str, tuple[Target, ...]]  # out field -> targets
    stream: bool
    session: bool  # lb session: runs in order-key order, numbers its frames' keys afresh
    diamond_root: bool  # appends its (node, aid, yield index) entry to outgoing messages
    carried_roots: tuple[str, ...]  # diamond roots whose entries its outgoing messages carry, outermost first
    in_cycle: bool  # dedup unreachable by (origin, node, or_group)
    key_ties: tuple[str, ...]  # nodes where two of its frames may come to share an order key (empty: none)


@dataclass(frozen=True)
class GraphOutput:
    field: str
    kind: str  # "stream" | "return"
    ordered: bool
    producers: tuple[str, ...]
    key_ties: tuple[str, ...]  # where two of its frames may share an order key (producers, OR groups, loops)


@dataclass(frozen=True)
class GraphPlan:
    name: str
    start: str
    entry: tuple[str, ...]
    entry_stream: tuple[str, ...]  # the entries declared `placeholder stream`, in `entry`'s order: frames over the call
    interruptible: bool  # `interruptible`: a call of the session that asks to interrupt cancels this graph's running call
    timeout_s: float | None
    nodes: dict[str, NodePlan]
    outputs: tuple[GraphOutput, ...]
    sccs: tuple[tuple[str, ...], ...]  # cycles: strongly connected components with a loop
    back_edges: tuple[tuple[str, str, str], ...]  # (source, target, field) closing each cycle
    unreachable: tuple[str, ...]  # interfaces that can never fire in this graph


@dataclass(frozen=True)
class InterfaceConfig:
    timeout_s: float | None  # the interface's own, else the role's
    batch: dict | None  # the interface's own, else the role's
    stream: bool


@dataclass(frozen=True)
class RolePlan:
    name: str
    module: str
    impl: str | None
    replicas: int
    lb: str
    gpus: int
    nodes: int
    share_gpus_with: str | None
    uses: tuple[str, ...]
    interfaces: dict[str, InterfaceConfig]
    batch: dict | None
    timeout_s: float | None


@dataclass(frozen=True)
class StaticPlan:
    flow: str
    graphs: dict[str, GraphPlan]
    roles: dict[str, RolePlan]
    globals: dict[str, dict]

    def as_json(self) -> dict:
        return _sorted(asdict(self))


def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value
