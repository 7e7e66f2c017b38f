"""The readable form of a static plan that `flowc plan` prints (the JSON form is `as_json`)."""

from __future__ import annotations

from flowc.plan.model import GraphPlan, NodePlan, RolePlan, StaticPlan


def plan_text(plan: StaticPlan) -> str:
    lines = [f"flow {plan.flow}"]
    for graph in plan.graphs.values():
        lines += ["", *_graph(graph)]
    lines += ["", "roles:"]
    run = {node.role for graph in plan.graphs.values() for node in graph.nodes.values() if node.role}
    lines += [
        f"  {_role(role)}" + ("" if role.name in run else "; no graph runs it: deployments do not start it")
        for role in plan.roles.values()
    ]
    return "\n".join(lines) + "\n"


def _graph(graph: GraphPlan) -> list[str]:
    timeout = f", timeout {graph.timeout_s:g}s" if graph.timeout_s else ""
    entry = ", ".join(f"{name} [stream]" if name in graph.entry_stream else name for name in graph.entry)
    interruptible = ", interruptible" if graph.interruptible else ""
    lines = [f"graph {graph.name} (entry {entry}{timeout}{interruptible})"]
    for output in graph.outputs:
        producers = ", ".join(output.producers) or "nothing"
        ties = f"; equal keys from {', '.join(output.key_ties)} go in arrival order" if output.key_ties else ""
        ordered = f" ordered by key{ties}" if output.ordered else ""
        lines.append(f"  {output.kind} {output.field} <- {producers}{ordered}")
    for node in graph.nodes.values():
        if node.kind == "interface":
            lines += node_lines(node)
    for component in graph.sccs:
        lines.append(f"  loop: {' -> '.join(component)} (unreachable signals deduplicated)")
    for source, target, field in graph.back_edges:
        lines.append(f"  back edge: {source} -[{field}]-> {target}")
    if graph.unreachable:
        lines.append(f"  never runs here: {', '.join(graph.unreachable)}")
    return lines


def node_lines(node: NodePlan) -> list[str]:
    """A node's plan in a few lines (also the comments of generated node modules)."""
    marks = [
        m
        for m, on in (
            ("session", node.session),
            ("stream", node.stream),
            ("diamond root", node.diamond_root),
            ("in loop", node.in_cycle),
        )
        if on
    ]
    head = f"  {node.id}" + (f"  [{', '.join(marks)}]" if marks else "")
    lines = [head]
    for group in node.groups:
        if group.routing == "join":
            continue
        if group.routing == "dead":
            lines.append(f"    in {group.index}: dead ({', '.join(group.missing)} never arrive)")
            continue
        root = f" root {group.root}" if group.root else ""
        slots = ", ".join(
            f"{s.field}<-{s.producer}" + ("*" if s.critical else "") + (" (list at end of stream)" if s.stream else "")
            for s in group.slots
        )
        lines.append(f"    in {group.index}: {group.routing}{root}: {slots}")
    for join in node.join or ():
        if join.threshold is None:
            lines.append(f"    join {join.field}: all, complete when {', '.join(join.upstream)} have ended")
        else:
            lines.append(f"    join {join.field}: {join.threshold}")
    for field, targets in node.control.items():
        shown = ", ".join(
            "caller"
            if t.node == "caller"
            else f"{t.node}/{t.group}#{t.slot} aid {t.aid_rule}" + (f"({t.root})" if t.root else "")
            for t in targets
        )
        lines.append(f"    out {field} -> {shown or 'nobody'}")
    return lines


def _role(role: RolePlan) -> str:
    parts = [f"{role.name}: {role.impl}", f"replicas {role.replicas}", f"lb {role.lb}"]
    if role.gpus:
        parts.append(f"gpus {role.gpus}")
    if role.share_gpus_with:
        parts.append(f"shares gpus of {role.share_gpus_with}")
    if role.uses:
        parts.append(f"uses {', '.join(role.uses)}")
    return "; ".join(parts)
