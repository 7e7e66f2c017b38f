"""Checks only graph analysis can make (phase 2): dead branches and joins, joins in loops, loops
that never yield a result, unreachable roles, roles a graph reaches but does not need, ordered
streams with nothing to order them."""

from __future__ import annotations

from collections.abc import Iterator

from flowc.check.checks.allows import role_allows
from flowc.check.model import Program
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic, Note
from flowc.ir import GraphIR, graph_irs
from flowc.ir.graph import cycles, live_fields


def _plans(program: Program):
    from flowc.plan import plan_graph

    plans = program.derived.get("graph_plans")
    if plans is None:
        plans = program.derived["graph_plans"] = {name: plan_graph(ir) for name, ir in graph_irs(program).items()}
    return plans


def _missing(ir: GraphIR, node_id: str, group: int) -> list[str]:
    node = ir.nodes[node_id]
    present = live_fields(node, ir.inbound_all(node_id), ir.live, group)
    if node.join is not None:
        return [f for f, n in node.join.items() if n is not None and f not in present]
    return [f for f in node.groups[group] if f not in present]


@register
class DeadBranches(Check):
    phase = 2
    codes = {
        "E201": "an OR group (a bucket) that can never fire",
        "E202": "a count join that can never fire",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        irs = graph_irs(program)
        for info in program.interfaces():
            node_id = info.qualname
            for group in range(1 if info.join else len(info.groups)):
                reached = [ir for ir in irs.values() if live_fields(ir.nodes[node_id], ir.inbound_all(node_id), ir.live, group)]
                dead = [ir for ir in reached if _missing(ir, node_id, group) or (info.join and node_id not in ir.live)]
                if not reached or len(dead) < len(reached):
                    continue
                ir = dead[0]
                missing = ", ".join(f"`{f}`" for f in _missing(ir, node_id, group)) or "an input"
                graphs = ", ".join(f"`{d.name}`" for d in dead)
                if info.join is not None:
                    yield Diagnostic(
                        "E202",
                        f"the join of `{node_id}` can never fire: in graph {graphs} no producer of {missing} is reachable from the entry",
                        info.join.span,
                        "use `all` for a field that may have no frames, or make the graph's entry reach a producer of it",
                    )
                    continue
                and_group = info.groups[group]
                fields = " & ".join(r.field.text for r in and_group.inputs)
                producers = {e.source for e in ir.inbound_all(node_id) if e.group == group}
                what = "bucket" if len(producers) >= 2 else "input group"
                yield Diagnostic(
                    "E201",
                    f"the {what} `{fields}` of `{node_id}` can never fire: in graph {graphs} no producer of {missing} is reachable from the entry",
                    and_group.span,
                    "remove the dead alternative, or make the graph's entry reach a producer of the missing field",
                )


@register
class Loops(Check):
    phase = 2
    codes = {
        "E203": "`join ... all` inside a loop",
        "E204": "a loop whose results never leave it",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        reported: set[tuple[str, ...]] = set()
        # the full live IR: a loop that feeds no output is not in the plan, but it is still a mistake
        for ir in graph_irs(program).values():
            name = ir.name
            produced = _outputs(ir)
            for component in cycles(ir.digraph):
                for node_id in component:
                    node = ir.nodes[node_id]
                    if node.join is not None and None in node.join.values() and (node_id,) not in reported:
                        reported.add((node_id,))
                        item = next(i for i in node.info.join.items if i.count is None)
                        yield Diagnostic(
                            "E203",
                            f"`{node_id}` waits for `all` of `{item.field.text}` inside a loop, where the upstream never ends",
                            item.span,
                            "use a count (`" + item.field.text + ": 1`) inside loops, or move the join after the loop",
                        )
                if component in reported or not _without_exit(ir, component, produced):
                    continue
                reported.add(component)
                first = min((ir.nodes[n] for n in component), key=lambda n: n.span.sort_key())
                loop = " → ".join(component)
                yield Diagnostic(
                    "E204",
                    f"the loop {loop} never yields a result in graph `{name}`: nothing leaves it and none of its fields is streamed or returned",
                    first.span,
                    "stream or return a field the loop produces, or consume one outside the loop so it can exit",
                    tuple(Note(ir.nodes[n].span, f"`{n}` is part of the loop") for n in component if ir.nodes[n] is not first),
                )


def _outputs(ir: GraphIR) -> set[str]:
    return {c.field.name.text for c in ir.info.streams} | {r.name.text for r in ir.info.returns}


def _without_exit(ir: GraphIR, component: tuple[str, ...], produced: set[str]) -> bool:
    """A loop nothing leaves and none of whose fields the graph streams or returns (E204)."""
    members = set(component)
    leaves = any(e.target not in members for n in component for e in ir.outbound.get(n, []))
    return not leaves and not any(f in produced for n in component for f in ir.nodes[n].outputs)


@register
class Reachability(Check):
    phase = 2
    codes = {
        "W205": "role no graph can reach",
        "W206": "`stream ... ordered` whose frames may share an order key (part of its order is arrival order)",
        "E208": "graph output that nothing reachable from the entry produces",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        irs = graph_irs(program)
        if not program.is_library:
            root = program.root.path
            for role in program.roles.values():
                if role.decl.span.file != root or not role.interfaces:
                    continue
                if not any(f"{role.name}.{i}" in ir.live for ir in irs.values() for i in role.interfaces):
                    yield Diagnostic(
                        "W205",
                        f"role `{role.name}` can never run: no graph's entry reaches its inputs",
                        role.decl.name.span,
                        "connect its inputs to a graph's entry, or remove the role",
                    )
        for name, plan in _plans(program).items():
            clauses = {c.field.name.text: c for c in irs[name].info.streams}
            for output, declared in zip(
                plan.outputs, [c.field for c in irs[name].info.streams] + irs[name].info.returns, strict=True
            ):
                if not output.producers:
                    yield Diagnostic(
                        "E208",
                        f"graph `{name}` {output.kind}s `{output.field}`, but no producer of it is reachable from the graph's entry",
                        declared.name.span,
                        f"connect a producer of `{output.field}` to the graph's entry, or drop it from the graph",
                    )
            for output in plan.outputs:
                if output.ordered and output.key_ties:
                    message, hint = _tie(plan, output)
                    yield Diagnostic("W206", message, clauses[output.field].span, hint)


def _tie(plan, output) -> tuple[str, str]:
    """Why frames of an ordered output may share an order key (W206), and what to do about it."""
    field = f"`{output.field}` is streamed ordered, but"
    arrival = "those reach the caller in arrival order"
    if len(output.producers) > 1:
        listed = ", ".join(f"`{p}`" for p in output.producers)
        return (
            f"{field} it has {len(output.producers)} producers ({listed}); the frames each makes from one input share "
            f"that input's order key, and {arrival}",
            "give each producer's output a name of its own and stream each `ordered`, or drop `ordered` if arrival "
            "order between them is right",
        )
    looped = [n for n in output.key_ties if plan.nodes[n].in_cycle]
    if looped:
        return (
            f"{field} `{looped[0]}` is in a loop, where a frame comes round with the order key it had, so frames of "
            f"different rounds may share a key and {arrival}",
            "drop `ordered` if arrival order is right for the loop's rounds, or return the loop's result and stream "
            "what comes after the loop",
        )
    node = plan.nodes[output.key_ties[0]]
    alternatives = " | ".join(" & ".join(g.fields) for g in node.groups if g.routing != "dead")
    return (
        f"{field} `{node.id}` runs once per OR group that one frame completes (`in {alternatives}`), so its "
        f"activations may share an order key and {arrival}",
        "join the alternatives with `&` if they always come together, or give each its own interface and stream "
        "their outputs as separate fields",
    )


@register
class Contribution(Check):
    phase = 2
    codes = {"W210": "interfaces a graph's entry reaches that contribute nothing to its outputs (they do not run in it)"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for name, ir in graph_irs(program).items():
            produced = _outputs(ir)
            exitless = {n for c in cycles(ir.digraph) if _without_exit(ir, c, produced) for n in c}  # E204 says it
            idle = [  # interfaces reached here but not needed, by name (`role.interface`)
                node_id
                for node_id in sorted(ir.live - ir.contributing - exitless)
                if ir.nodes[node_id].kind == "interface"
                and ir.nodes[node_id].role is not None
                and not role_allows(program, ir.nodes[node_id].role, "W210")  # a role may say it can be left out
            ]
            if not idle:
                continue
            listed = ", ".join(f"`{n}`" for n in idle)
            fields = sorted({f for n in idle for f in ir.nodes[n].outputs})
            shown = ", ".join(f"`{f}`" for f in fields[:4]) + (", ..." if len(fields) > 4 else "")
            several = len(idle) > 1
            yield Diagnostic(
                "W210",
                f"graph `{name}`'s entry reaches {'interfaces' if several else 'interface'} {listed}, but nothing `{name}` "
                f"streams or returns depends on {'them' if several else 'it'}, so {'they do' if several else 'it does'} not "
                f"run when `{name}` is called",
                ir.info.decl.name.span,
                f"to run {'them' if several else 'it'} in `{name}`, stream or return a field {'they produce' if several else 'it produces'} "
                f"({shown}); if {'they belong' if several else 'it belongs'} only to another graph, enter `{name}` through a "
                f"placeholder {'they do' if several else 'it does'} not read; if leaving {'them' if several else 'it'} out is intended, add "
                f"`allow W210` to `{name}`",
                tuple(
                    Note(ir.nodes[n].span, f"`{n}` is reached from `{name}`'s entry but feeds none of its outputs") for n in idle
                ),
            )


@register
class BucketMultiplicity(Check):
    phase = 2
    codes = {"E209": "a bucket slot that may receive several frames for one frame of its root"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        reported: set[tuple[str, int]] = set()
        for name, plan in _plans(program).items():
            ir = graph_irs(program)[name]
            memo: dict[tuple[str, str], bool] = {}
            for node_id, node in plan.nodes.items():
                for group in node.groups:
                    if group.routing != "bucket" or (node_id, group.index) in reported:
                        continue
                    for slot in group.slots:
                        if slot.producer == group.root or _once_per_frame(plan, slot.producer, group.root, memo):
                            continue
                        reported.add((node_id, group.index))
                        info = ir.nodes[node_id].info
                        yield Diagnostic(
                            "E209",
                            f"`{slot.producer}` may send `{slot.field}` to the bucket of `{node_id}` several times for one frame of "
                            f"its root `{group.root}`, so the bucket cannot tell which frames belong together",
                            info.groups[group.index].span,
                            f"feed the bucket from nodes that run once per frame of `{group.root}` (one input group, no stream or "
                            "loop in between), or collect every frame with `join { ... }`",
                        )
                        break


def _once_per_frame(plan, node_id: str, root: str, memo: dict) -> bool:
    """Whether `node_id` runs exactly once, yielding once, per frame of `root` (which dominates it)."""
    key = (node_id, root)
    if key in memo:
        return memo[key]
    memo[key] = False  # a loop back here is not "once"
    node = plan.nodes[node_id]
    live = [g for g in node.groups if g.routing != "dead"]
    result = False
    if node_id == root:
        result = True
    elif node.in_cycle or node.join is not None or len(live) != 1:
        result = False
    else:
        (group,) = live
        if group.routing == "direct":
            (producer,) = {s.producer for s in group.slots}
            upstream = [producer]
        else:
            upstream = [group.root]
        result = all(u == root or (not plan.nodes[u].stream and _once_per_frame(plan, u, root, memo)) for u in upstream)
    memo[key] = result
    return result
