"""Checks on graph declarations: entries are placeholders, outputs have producers."""

from __future__ import annotations

from collections.abc import Iterator

from flowc.check import schema
from flowc.check.checks.common import repeated, repeats, text, unique
from flowc.check.model import GraphInfo, Program
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic
from flowc.syntax import ast


@register
class GraphEntries(Check):
    codes = {
        "E170": "graph entry is not a placeholder",
        "E171": "graph without `entry`",
        "E176": "entry given twice",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for graph in program.graphs.values():
            if not graph.entries:
                yield Diagnostic(
                    "E171",
                    f"graph `{graph.name}` has no `entry`",
                    graph.decl.name.span,
                    "add `entry PLACEHOLDER` naming the value given when the graph is called",
                )
            for entry, first in repeats(graph.entries, text):
                yield repeated(
                    "E176", f"`{entry.text}` is an entry of graph `{graph.name}` twice", entry, first, "remove the repetition"
                )
            for entry in unique(graph.entries, text):
                if entry.text not in program.placeholders:
                    yield self._not_placeholder(program, graph, entry)

    def _not_placeholder(self, program: Program, graph: GraphInfo, entry: ast.Ident) -> Diagnostic:
        producers = program.field(entry.text).producers
        if producers:
            p = producers[0]
            return Diagnostic(
                "E170",
                f"entry `{entry.text}` of graph `{graph.name}` is produced by `{p.role}.{p.interface}`, not a placeholder",
                entry.span,
                "entries are the values given at the call; declare `placeholder NAME: TYPE` and use it here",
            )
        hint = schema.did_you_mean(entry.text, program.placeholders) or f"declare `placeholder {entry.text}: TYPE`"
        return Diagnostic("E170", f"entry `{entry.text}` of graph `{graph.name}` is not a placeholder", entry.span, hint)


@register
class GraphOutputs(Check):
    codes = {
        "E172": "graph streams or returns a field nobody produces",
        "E173": "graph with neither `stream` nor `return`",
        "E174": "field streamed or returned twice",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        candidates = None
        for graph in program.graphs.values():
            outputs = [c.field for c in graph.streams] + graph.returns
            if not outputs:
                yield Diagnostic(
                    "E173",
                    f"graph `{graph.name}` has no `stream` or `return`, so a call would produce nothing",
                    graph.decl.name.span,
                    "add `return FIELD` or `stream FIELD` for the results the caller wants",
                )
            names = [o.name for o in sorted(outputs, key=lambda o: o.span.start)]
            for name, first in repeats(names, text):
                message = f"graph `{graph.name}` lists `{name.text}` twice among its outputs"
                yield repeated("E174", message, name, first, "a field is either streamed or returned, once")
            for name in unique(names, text):
                if not program.field(name.text).producers:
                    if candidates is None:
                        candidates = {n for n, i in program.fields.items() if i.producers}
                    hint = (
                        schema.did_you_mean(name.text, candidates)
                        or f"add `{name.text}` to the `out` of the interface that computes it"
                    )
                    yield Diagnostic(
                        "E172", f"graph `{graph.name}` outputs `{name.text}`, which no interface produces", name.span, hint
                    )
