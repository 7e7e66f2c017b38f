"""Pictures of a graph's plan: Mermaid and Graphviz DOT text (SVG through Graphviz `dot`).

Roles are clusters, interfaces their nodes, fields label the edges. Buckets, count joins and
session nodes are marked in the node label and styled; a loop's back edges are dashed; the
graph's start, placeholders and the caller are drawn outside the clusters.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict

from flowc.plan.model import GraphPlan, NodePlan

CALLER = "caller"


def _safe(node_id: str) -> str:
    return re.sub(r"\W", "_", node_id.replace("@", "start_").replace("$", "ph_"))


def _marks(node: NodePlan) -> list[str]:
    marks = []
    for group in node.groups:
        if group.routing == "bucket":
            marks.append(f"bucket: {' & '.join(group.fields)}")
        elif group.routing == "join":
            counts = {j.field: ("all" if j.threshold is None else j.threshold) for j in node.join or ()}
            marks.append("join: " + ", ".join(f"{f} {n}" for f, n in counts.items()))
    if node.session:
        marks.append("session (ordered)")
    if node.stream:
        marks.append("stream")
    return marks


def _placeholder_label(node: NodePlan, newline: str) -> str:
    """A placeholder's name; a streaming one says so (its frames come while the call runs)."""
    return node.id[1:] + (f"{newline}stream" if node.stream else "")


def _edges(graph: GraphPlan) -> list[tuple[str, str, str, bool]]:
    back = {(s, t) for s, t, _ in graph.back_edges}
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node in graph.nodes.values():
        for field, targets in node.control.items():
            for target in targets:
                if field not in edges[(node.id, target.node)]:
                    edges[(node.id, target.node)].append(field)
    return [(s, t, ", ".join(sorted(f)), (s, t) in back) for (s, t), f in sorted(edges.items())]


def _by_role(graph: GraphPlan) -> dict[str, list[NodePlan]]:
    roles: dict[str, list[NodePlan]] = defaultdict(list)
    for node in graph.nodes.values():
        if node.role:
            roles[node.role].append(node)
    return dict(sorted(roles.items()))


def mermaid(graph: GraphPlan) -> str:
    lines = ["flowchart LR", f"    %% graph {graph.name}"]
    lines.append(f'    {_safe(graph.start)}(["call {graph.name}"])')
    for node in graph.nodes.values():
        if node.kind == "placeholder":
            lines.append(f'    {_safe(node.id)}[/"{_placeholder_label(node, "<br/>")}"/]')
    lines.append(f"    {CALLER}((caller))")
    for role, nodes in _by_role(graph).items():
        lines.append(f'    subgraph role_{_safe(role)} ["{role}"]')
        for node in nodes:
            label = "<br/>".join([node.id.split(".", 1)[1], *_marks(node)])
            lines.append(f'        {_safe(node.id)}["{label}"]')
        lines.append("    end")
    for source, target, fields, back in _edges(graph):
        arrow = f"-. {fields} .->" if back else f"-- {fields} -->"
        lines.append(f"    {_safe(source)} {arrow} {_safe(target)}")
    for cls, style in (
        ("bucket", "fill:#fff3cd,stroke:#b8860b"),
        ("join", "fill:#e2f0d9,stroke:#2e7d32"),
        ("session", "stroke:#1565c0,stroke-width:3px"),
    ):
        members = [_safe(n.id) for n in graph.nodes.values() if _has_class(n, cls)]
        if members:
            lines.append(f"    classDef {cls} {style}")
            lines.append(f"    class {','.join(members)} {cls}")
    return "\n".join(lines) + "\n"


def _has_class(node: NodePlan, cls: str) -> bool:
    if cls == "session":
        return node.session
    return any(g.routing == cls for g in node.groups)


def dot(graph: GraphPlan) -> str:
    lines = [
        f'digraph "{graph.name}" {{',
        "    rankdir=LR;",
        '    node [shape=box, style="rounded", fontname="Helvetica"];',
        '    edge [fontname="Helvetica", fontsize=10];',
        f'    {_safe(graph.start)} [label="call {graph.name}", shape=oval];',
        f'    {CALLER} [label="caller", shape=doublecircle];',
    ]
    for node in graph.nodes.values():
        if node.kind == "placeholder":
            label = _placeholder_label(node, "\\n")
            lines.append(f'    {_safe(node.id)} [label="{label}", shape=parallelogram];')
    for role, nodes in _by_role(graph).items():
        lines.append(f"    subgraph cluster_{_safe(role)} {{")
        lines.append(f'        label="{role}"; style="dashed";')
        for node in nodes:
            label = "\\n".join([node.id.split(".", 1)[1], *_marks(node)])
            attrs = [f'label="{label}"']
            if _has_class(node, "bucket"):
                attrs.append('style="rounded,filled", fillcolor="#fff3cd"')
            elif _has_class(node, "join"):
                attrs.append('style="rounded,filled", fillcolor="#e2f0d9"')
            if node.session:
                attrs.append("penwidth=3")
            lines.append(f"        {_safe(node.id)} [{', '.join(attrs)}];")
        lines.append("    }")
    for source, target, fields, back in _edges(graph):
        style = ", style=dashed, constraint=false" if back else ""
        lines.append(f'    {_safe(source)} -> {_safe(target)} [label="{fields}"{style}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


class GraphvizMissing(RuntimeError):
    pass


# The packages that hold `dot`; README.md's prerequisites name them too (tests/test_docs.py).
INSTALL_GRAPHVIZ = "Debian/Ubuntu: `apt-get install graphviz`; macOS: `brew install graphviz`"


def svg(graph: GraphPlan) -> str:
    executable = shutil.which("dot")
    if executable is None:
        raise GraphvizMissing(
            f"SVG needs Graphviz's `dot`, which is not installed. Install the `graphviz` package ({INSTALL_GRAPHVIZ}), "
            "or use `--format dot` or `--format mermaid`."
        )
    result = subprocess.run([executable, "-Tsvg"], input=dot(graph), capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise GraphvizMissing(f"Graphviz `dot` failed: {result.stderr.strip()}")
    return result.stdout
