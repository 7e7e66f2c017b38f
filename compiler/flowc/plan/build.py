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
- SeqId generators are stream and session nodes; `order_source` says whose SeqIds totally order
  a node's output frames.
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
    order = _order_sources(ir, groups, in_cycle, sccs)
    outputs = _outputs(ir, order)
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
            seq_generator=node.stream or node.session,
            diamond_root=node_id in roots,
            carried_roots=carried[node_id],
            in_cycle=node_id in in_cycle,
            order_source=order.get(node_id),
        )
    return GraphPlan(
        name=ir.name,
        start=ir.start,
        entry=tuple(e.text for e in ir.info.entries),
        timeout_s=ir.info.config.get("timeout"),
        nodes=nodes,
        outputs=outputs,
        sccs=tuple(sccs),
        back_edges=_back_edges(ir),
        unreachable=tuple(sorted(n for n, node in ir.nodes.items() if node.kind == "interface" and n not in ir.live)),
    )


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


def _order_sources(ir: GraphIR, groups: dict[str, list[GroupPlan]], in_cycle: set[str], sccs) -> dict[str, str | None]:
    """Whose SeqIds totally order each node's output frames, walking the DAG of components."""
    condensed = nx.condensation(ir.digraph)
    multi: dict[str, bool] = {}
    order: dict[str, str | None] = {}
    for component in nx.topological_sort(condensed):
        for node_id in sorted(condensed.nodes[component]["members"]):
            node = ir.nodes[node_id]
            inbound = ir.inbound.get(node_id, [])
            preds = {e.source for e in inbound}
            live_groups = [g for g in groups.get(node_id, []) if g.routing != "dead"]
            multi[node_id] = node_id in in_cycle or (
                node.join is None  # a join fires once per call
                and (any(ir.nodes[p].stream or multi.get(p, True) for p in preds) or len(live_groups) > 1)
            )
            if node.kind != "interface" or node.session or not multi[node_id]:
                order[node_id] = node_id
            elif not node.stream and len(inbound) == 1:
                order[node_id] = order.get(inbound[0].source)
            else:
                order[node_id] = None
    return order


def _outputs(ir: GraphIR, order: dict[str, str | None]) -> tuple[GraphOutput, ...]:
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
        source = order.get(producers[0]) if len(producers) == 1 else None
        outputs.append(GraphOutput(name, kind, ordered, producers, source))
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
