"""The intermediate representation: one `GraphIR` per graph of a checked program."""

from __future__ import annotations

from flowc.check.model import Program
from flowc.ir.graph import Edge, GraphIR, Node, build_graph_ir


def graph_irs(program: Program) -> dict[str, GraphIR]:
    """The IR of every graph, built once per program and cached on it."""
    irs = program.derived.get("graph_irs")
    if irs is None:
        irs = program.derived["graph_irs"] = {name: build_graph_ir(program, g) for name, g in sorted(program.graphs.items())}
    return irs  # type: ignore[return-value]


__all__ = ["Edge", "GraphIR", "Node", "build_graph_ir", "graph_irs"]
