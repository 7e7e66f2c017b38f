"""Property: on random pipelines (DAGs, and DAGs with back edges) the plan's bucket placement,
critical and stream slots, diamond roots and loop membership equal a brute-force reference that
enumerates paths. The reference shares nothing with flowc's IR: it works from the generator's
own description of who produces and consumes what."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from flowc.check import check_source
from flowc.plan import build_plan

START, REQUEST = "@g", "$request"


@dataclass
class Pipeline:
    outputs: list[list[str]]  # per node: fields it produces
    stream: list[bool]
    groups: list[list[list[str]]]  # per node: OR groups of fields

    def fields(self) -> list[str]:
        return sorted({f for outs in self.outputs for f in outs})

    def node(self, i: int) -> str:
        return f"r{i}.run"

    def producers(self, field: str) -> list[str]:
        if field == "request":
            return [REQUEST]
        return [self.node(i) for i, outs in enumerate(self.outputs) if field in outs]

    def text(self, returned: list[str] | None = None) -> str:
        lines = ["placeholder request: Json", ""]
        for i, outs in enumerate(self.outputs):
            groups = " | ".join(" & ".join(g) for g in self.groups[i])
            out = ", ".join(f"{f}: Json" for f in outs)
            lines += [
                f"role r{i} {{",
                f'    impl "m:R{i}"',
                "    interface run {",
                f"        in  {groups}",
                f"        out {'stream ' if self.stream[i] else ''}{out}",
                "    }",
                "}",
                "",
            ]
        returned = returned or self.fields()
        lines += ["graph g {", "    entry  request", f"    return {', '.join(returned)}", "}", ""]
        return "\n".join(lines)


@st.composite
def pipelines(draw, back_edges: bool) -> Pipeline:
    n = draw(st.integers(2, 6))
    shared = ["s0", "s1"]
    outputs = []
    for i in range(n):
        extra = draw(st.lists(st.sampled_from(shared), max_size=2, unique=True))
        outputs.append([f"f{i}", *extra])
    stream = [draw(st.booleans()) for _ in range(n)]
    groups = []
    for i in range(n):
        earlier = sorted({f for j in range(i) for f in outputs[j]} - {f for j in range(i, n) for f in outputs[j]})
        if not earlier or draw(st.integers(0, 9)) == 0:  # mostly build on earlier nodes, so roots sit deep
            earlier = ["request", *earlier]
        first = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3, unique=True))
        node_groups = [first]
        later = sorted({f for j in range(i, n) for f in outputs[j]})
        if back_edges and later and draw(st.booleans()):
            node_groups.append(draw(st.lists(st.sampled_from(later), min_size=1, max_size=2, unique=True)))
        groups.append(node_groups)
    return Pipeline(outputs, stream, groups)


def reference_graph(p: Pipeline) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_edge(START, REQUEST)
    for i, node_groups in enumerate(p.groups):
        for fields in node_groups:
            for f in fields:
                for producer in p.producers(f):
                    graph.add_edge(producer, p.node(i))
    return graph


def dominators_by_paths(graph: nx.DiGraph, target: str) -> set[str]:
    if target == START:
        return {START}
    paths = [set(path) for path in nx.all_simple_paths(graph, START, target)]
    return set.intersection(*paths)


def reference_root(graph: nx.DiGraph, preds: list[str]) -> str:
    doms = {p: dominators_by_paths(graph, p) for p in preds}
    common = set.intersection(*doms.values())
    (root,) = [c for c in common if common <= dominators_by_paths(graph, c)]
    return root


def on_a_cycle(graph: nx.DiGraph, node: str) -> bool:
    return any(node == s or nx.has_path(graph, s, node) for s in graph.successors(node))


def check_against_reference(p: Pipeline) -> None:
    result = check_source(p.text(), "random.flow")
    assume(not any(d.code == "E209" for d in result.diagnostics))  # rejected by design (docs/plan.md)
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    graph = reference_graph(p)
    plan = build_plan(result.program).graphs["g"]
    roots = {g.root for n in plan.nodes.values() for g in n.groups if g.root}
    event(f"buckets: {sum(g.routing == 'bucket' for n in plan.nodes.values() for g in n.groups) > 0}")
    event(f"root below the entry: {bool(roots - {START, REQUEST})}")
    event(f"loop: {bool(plan.sccs)}")
    event(f"stream slot: {any(s.stream for n in plan.nodes.values() for g in n.groups for s in g.slots)}")
    for i, node_groups in enumerate(p.groups):
        node = plan.nodes[p.node(i)]
        for g, fields in enumerate(node_groups):
            group = node.groups[g]
            slots = [(producer, f) for f in fields for producer in p.producers(f)]
            preds = sorted({producer for producer, _ in slots})
            expected_routing = "bucket" if len(preds) >= 2 else "direct"
            assert group.routing == expected_routing
            root = reference_root(graph, preds) if expected_routing == "bucket" else None
            assert group.root == root
            count = {f: sum(1 for _, g2 in slots if g2 == f) for f in fields}
            expected = sorted(
                (
                    producer,
                    f,
                    count[f] == 1,
                    producer.startswith("r")
                    and p.stream[int(producer[1:].split(".")[0])]
                    and producer != root
                    and root is not None,
                )
                for producer, f in slots
            )
            assert sorted((s.producer, s.field, s.critical, s.stream) for s in group.slots) == expected
        assert node.in_cycle == on_a_cycle(graph, p.node(i))
        assert node.diamond_root == any(g.root == p.node(i) for other in plan.nodes.values() for g in other.groups)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pipelines(back_edges=False))
def test_random_dags_match_the_reference(pipeline):
    check_against_reference(pipeline)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pipelines(back_edges=True))
def test_random_graphs_with_back_edges_match_the_reference(pipeline):
    check_against_reference(pipeline)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data(), st.booleans())
def test_a_graph_plans_exactly_the_nodes_on_a_path_to_what_it_returns(data, back_edges):
    pipeline = data.draw(pipelines(back_edges=back_edges))
    returned = data.draw(st.lists(st.sampled_from(pipeline.fields()), min_size=1, unique=True))
    everything = check_source(pipeline.text(), "random.flow")
    assume(everything.ok)
    result = check_source(pipeline.text(returned), "random.flow")
    assume(not any(d.code == "E204" for d in result.diagnostics))  # a loop left with no exit
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    graph = reference_graph(pipeline)
    needed = {START}
    for f in returned:
        for producer in pipeline.producers(f):
            needed |= {producer, *nx.ancestors(graph, producer)}
    full = build_plan(everything.program).graphs["g"]
    plan = build_plan(result.program).graphs["g"]
    event(f"pruned: {len(needed) < len(full.nodes)}")
    assert set(plan.nodes) == needed
    assert set(plan.unreachable) == set(full.nodes) - needed
    assert any(d.code == "W210" for d in result.diagnostics) == (len(needed) < len(full.nodes))
    for node_id in needed:
        kept, whole = plan.nodes[node_id], full.nodes[node_id]
        # a node that stays is planned as if nothing were pruned: the same slots, roots and loops
        assert (kept.groups, kept.join, kept.in_cycle, kept.key_ties) == (
            whole.groups,
            whole.join,
            whole.in_cycle,
            whole.key_ties,
        )
        assert set(kept.carried_roots) <= set(whole.carried_roots)
        for name, targets in kept.control.items():
            expected = tuple(t for t in whole.control[name] if t.node in needed or (t.node == "caller" and name in returned))
            assert targets == expected


def test_reference_root_on_a_known_diamond():
    # start -> $request -> a -> {b, c} -> d: the root of {b, c} is a, found by enumerating paths.
    graph = nx.DiGraph([(START, REQUEST), (REQUEST, "a"), ("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert reference_root(graph, ["b", "c"]) == "a"
    assert reference_root(graph, ["a", "d"]) == "a"
