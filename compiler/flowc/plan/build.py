"""Building the `StaticPlan` from a checked program (semantics: DESIGN §4, Omni-Flow §3.2–3.5).

Per graph and per contributing interface (live, and on a path to a streamed or returned field;
the others never run in the graph and are listed as `unreachable`):
- each OR group is routed `direct` (one direct predecessor: fire per frame), `bucket` (two or
  more: synchronise), `join` (activate by count: one bucket per call) or `dead` (can never fire);
- a bucket's diamond root is the nearest common dominator of its direct predecessors, i.e. the
  fork source every path of one frame passes through, so Rule C finds its entry on every message;
- a slot is critical when it is its field's only slot in the group, and a stream slot when its
  producer streams and is not the bucket's root (Appendix A: a root's frames split buckets, an
  intermediate's frames accumulate);
- each out field has control edges with the aid rule of the edge (C into a bucket, seeded from
  the root; A otherwise; join for count joins); `all` join fields list the upstream set whose end
  completes them;
- order keys (DESIGN §4.3) extend per streaming hop and restart at `lb session` nodes; `key_ties`
  names the nodes on the way where two of a node's (or a graph output's) frames may come to share
  a key, so that part of their order is arrival order (W206 warns where such an output is ordered).
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

from flowc.check import schema
from flowc.check.model import Program
from flowc.ir import GraphIR, graph_irs
from flowc.ir.graph import cycles, live_fields
from flowc.plan.model import (
    GraphOutput,
    GraphPlan,
    GroupPlan,
    InterfaceConfig,
    JoinField,
    NodePlan,
    RolePlan,
    Slot,
    StaticPlan,
    Target,
)


def build_plan(program: Program) -> StaticPlan:
    irs = graph_irs(program)
    cached = program.derived.get("graph_plans") or {}  # the graph-analysis checks built them already
    return StaticPlan(
        flow=program.root.name,
        graphs={name: cached.get(name) or plan_graph(irs[name]) for name in sorted(irs)},
        roles={name: _role(program, name) for name in sorted(program.roles)},
        globals={
            name: {"kind": decl.kind.text, **_plain(schema.interpret(decl.entries, schema.GLOBAL_KINDS[decl.kind.text]).values)}
            for name, decl in sorted(program.globals.items())
            if decl.kind.text in schema.GLOBAL_KINDS
        },
    )


def _plain(values: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def _role(program: Program, name: str) -> RolePlan:
    role = program.roles[name]
    config = role.config
    return RolePlan(
        name=name,
        module=role.module,
        impl=config.get("impl"),
        replicas=int(config.get("replicas", 1)),
        lb=str(config.get("lb", "round_robin")),
        gpus=role.gpus,
        nodes=int(config.get("nodes", 1)),
        share_gpus_with=role.share_target,
        uses=tuple(config.get("uses", ())),
        interfaces={
            name: InterfaceConfig(
                timeout_s=info.config.get("timeout", config.get("timeout")),
                batch=info.config.get("batch", config.get("batch")),
                stream=info.stream,
            )
            for name, info in sorted(role.interfaces.items())
        },
        batch=config.get("batch"),
        timeout_s=config.get("timeout"),
    )


def plan_graph(full: GraphIR) -> GraphPlan:
    """The plan of one graph: only its contributing nodes (a node no output depends on never runs)."""
    ir = full.contributing_ir()
    sccs = cycles(ir.digraph)
    in_cycle = {n for component in sccs for n in component}
    groups = {n: _groups(ir, n) for n in sorted(ir.live) if n != ir.start}
    roots = {g.root for plans in groups.values() for g in plans if g.root}
    carried = _carried_roots(ir, groups)
    ties = _key_ties(ir, groups, in_cycle)
    outputs = _outputs(ir, ties)
    to_caller: dict[str, list[str]] = {}
    for output in outputs:
        for producer in output.producers:
            to_caller.setdefault(producer, []).append(output.field)
    nodes = {}
    for node_id in sorted(ir.live):
        node = ir.nodes[node_id]
        nodes[node_id] = NodePlan(
            id=node_id,
            kind=node.kind,
            role=node.role,
            groups=tuple(groups.get(node_id, ())),
            join=_join_fields(ir, node_id) if node.join is not None else None,
            control=_control(ir, node_id, groups, to_caller.get(node_id, [])),
            stream=node.stream,
            session=node.session,
            diamond_root=node_id in roots,
            carried_roots=carried[node_id],
            in_cycle=node_id in in_cycle,
            key_ties=ties.get(node_id, ()),
        )
    return GraphPlan(
        name=ir.name,
        start=ir.start,
        entry=tuple(e.text for e in ir.info.entries),
        entry_stream=tuple(e.text for e in ir.info.entries if _streams(ir, f"${e.text}")),
        interruptible=bool(ir.info.interruptible),
        timeout_s=ir.info.config.get("timeout"),
        nodes=nodes,
        outputs=outputs,
        sccs=tuple(sccs),
        back_edges=_back_edges(ir),
        unreachable=tuple(sorted(n for n, node in ir.nodes.items() if node.kind == "interface" and n not in ir.live)),
    )


def _streams(ir: GraphIR, node_id: str) -> bool:
    node = ir.nodes.get(node_id)
    return node is not None and node.stream


def _groups(ir: GraphIR, node_id: str) -> list[GroupPlan]:
    node = ir.nodes[node_id]
    plans = []
    for index, fields in enumerate(node.groups):
        edges = ir.group_edges(node_id, index)
        order = {f: i for i, f in enumerate(fields)}
        edges = sorted(edges, key=lambda e: (order.get(e.field, len(order)), e.source))
        per_field = Counter(e.field for e in edges)
        producers = sorted({e.source for e in edges})
        if node.join is not None:
            routing, root = "join", None
        elif any(f not in per_field for f in fields):
            # the IR keeps no edges into a group that cannot fire: name the fields no live node produces
            arriving = live_fields(node, ir.inbound_all(node_id), ir.reached, index)
            plans.append(GroupPlan(index, tuple(fields), "dead", (), None, tuple(f for f in fields if f not in arriving)))
            continue
        elif len(producers) >= 2:
            routing, root = "bucket", ir.common_dominator(producers)
        else:
            routing, root = "direct", None
        slots = tuple(
            Slot(
                producer=e.source,
                field=e.field,
                critical=per_field[e.field] == 1,
                stream=ir.nodes[e.source].stream and e.source != root and routing != "direct",
            )
            for e in edges
        )
        plans.append(GroupPlan(index, tuple(fields), routing, slots, root))
    return plans


def _join_fields(ir: GraphIR, node_id: str) -> tuple[JoinField, ...]:
    node = ir.nodes[node_id]
    assert node.join is not None
    result = []
    for field_name, threshold in node.join.items():
        upstream: tuple[str, ...] = ()
        if threshold is None:
            producers = {e.source for e in ir.group_edges(node_id, 0) if e.field == field_name}
            closure = set(producers)
            for producer in producers:
                closure |= nx.ancestors(ir.digraph, producer)
            upstream = tuple(sorted(closure - {ir.start}))
        result.append(JoinField(field_name, threshold, upstream))
    return tuple(result)


def _control(ir: GraphIR, node_id: str, groups: dict[str, list[GroupPlan]], to_caller: list[str]) -> dict:
    control: dict[str, list[Target]] = {name: [] for name in ir.nodes[node_id].outputs}
    for edge in sorted(ir.outbound.get(node_id, []), key=lambda e: (e.field, e.target, e.group)):
        group = groups[edge.target][edge.group]
        if group.routing == "dead":
            continue  # the group can never fire here; E201 reports it
        slot = next(i for i, s in enumerate(group.slots) if (s.producer, s.field) == (edge.source, edge.field))
        if group.routing == "join":
            rule, root = "join", None
        elif group.routing == "bucket":
            rule, root = "C", group.root
        else:
            rule, root = "A", None
        control.setdefault(edge.field, []).append(Target(edge.target, edge.group, slot, rule, root))
    for field in to_caller:
        control[field].append(Target("caller", 0, 0, "caller"))
    return {name: tuple(targets) for name, targets in sorted(control.items())}


def _carried_roots(ir: GraphIR, groups: dict[str, list[GroupPlan]]) -> dict[str, tuple[str, ...]]:
    """The diamond roots whose entries each node's outgoing messages must carry, outermost first.

    A root's entry is needed on the way from the root to the buckets it keys: walk back from
    each bucket's direct predecessors to its root (every node on the way is dominated by it).
    """
    needed: dict[str, set[str]] = {n: set() for n in ir.live}
    for plans in groups.values():
        for group in plans:
            if group.routing != "bucket" or group.root is None:
                continue
            root = group.root
            stack = [s.producer for s in group.slots]
            while stack:
                node = stack.pop()
                if root in needed[node] or not ir.dominates(root, node):
                    continue
                needed[node].add(root)
                if node != root:
                    stack.extend(p for p in ir.digraph.predecessors(node))
    depth = ir.dom_depth
    return {n: tuple(sorted(needed[n], key=lambda r: (depth[r], r))) for n in ir.live}


def _key_ties(ir: GraphIR, groups: dict[str, list[GroupPlan]], in_cycle: set[str]) -> dict[str, tuple[str, ...]]:
    """For each node, the nodes on the way to it where two of its output frames may come to share
    an order key in one call (empty: every frame it yields has a key of its own).

    Keys are distinct at the entry and stay distinct along a path: a streaming node extends them,
    a bucket fires once per key, a join once per call, and an `lb session` node outside a loop
    numbers its frames afresh. They can tie where a node fires once per OR group for one frame
    (two live groups), and in a loop, where a frame comes round with the key it had.
    """
    condensed = nx.condensation(ir.digraph)
    ties: dict[str, tuple[str, ...]] = {}
    for component in nx.topological_sort(condensed):
        for node_id in sorted(condensed.nodes[component]["members"]):
            node = ir.nodes[node_id]
            if node.kind != "interface":
                ties[node_id] = ()
            elif node_id in in_cycle:
                ties[node_id] = (node_id,)
            elif node.session or node.join is not None:
                ties[node_id] = ()  # numbered afresh, or fired once per call
            else:
                found = {t for e in ir.inbound.get(node_id, []) for t in ties.get(e.source, ())}
                if len([g for g in groups.get(node_id, []) if g.routing != "dead"]) > 1:
                    found.add(node_id)
                ties[node_id] = tuple(sorted(found))
    return ties


def _outputs(ir: GraphIR, ties: dict[str, tuple[str, ...]]) -> tuple[GraphOutput, ...]:
    producers_of: dict[str, list[str]] = {}
    for node_id in sorted(ir.live):
        node = ir.nodes[node_id]
        if node.kind == "interface":
            for name in node.outputs:
                producers_of.setdefault(name, []).append(node_id)
    outputs = []
    declared = [(c.field.name.text, "stream", c.ordered) for c in ir.info.streams]
    declared += [(r.name.text, "return", False) for r in ir.info.returns]
    for name, kind, ordered in declared:
        producers = tuple(producers_of.get(name, ()))
        tied = {t for p in producers for t in ties.get(p, ())}
        if len(producers) > 1:  # the frames of different producers of one frame share its key
            tied.update(producers)
        outputs.append(GraphOutput(name, kind, ordered, producers, tuple(sorted(tied))))
    return tuple(outputs)


def _back_edges(ir: GraphIR) -> tuple[tuple[str, str, str], ...]:
    """Edges that close a cycle in a depth-first walk from the start (the loops' back edges)."""
    on_stack = {ir.start}
    closing = set()
    for u, v, kind in nx.dfs_labeled_edges(ir.digraph, ir.start):
        if kind == "forward" and u != v:
            on_stack.add(v)
        elif kind == "reverse" and u != v:
            on_stack.discard(v)
        elif kind == "nontree" and v in on_stack:
            closing.add((u, v))
    return tuple(sorted({(e.source, e.target, e.field) for u, v in closing for e in ir.outbound.get(u, []) if e.target == v}))
