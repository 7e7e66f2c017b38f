"""Checks on graph declarations: entries are placeholders, outputs have producers, a graph
can fill the OpenAI endpoints it `serves` (flowc.check.endpoints decides what each needs), and
`interruptible` is said once, of a graph that streams something its caller can have heard."""

from __future__ import annotations

from collections.abc import Iterator

from flowc.check import endpoints, schema
from flowc.check.checks.common import repeated, repeats, text, unique
from flowc.check.model import GraphInfo, Program
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic, Note
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


@register
class Endpoints(Check):
    codes = {
        "E177": "graph `serves` an endpoint whose entry it does not take (one Text or Json value; realtime: a streaming Audio one)",
        "E178": "graph `serves` an endpoint whose output it lacks",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for graph in program.graphs.values():
            setting = endpoints.serves_setting(graph)
            if setting is None:
                continue
            for problem in endpoints.problems(program, graph):
                values = setting.values[0].items if isinstance(setting.values[0], ast.ListValue) else setting.values
                place = next((v for v in values if getattr(v, "name", None) == problem.endpoint), setting.key)
                path = endpoints.PATHS[problem.endpoint]
                if problem.kind == "entry":
                    code = "E177"
                    hint = problem.hint or f"{path} fills one entry: give the graph one `entry`, a `Text` or `Json` placeholder"
                else:
                    need = next(n for n in endpoints.NEEDS[problem.endpoint] if not n.optional)
                    hint = f"stream or return a field declared {need.described}, or take `{problem.endpoint}` out of `serves`"
                    code = "E178"
                message = f"graph `{graph.name}` serves `{problem.endpoint}` ({path}), but {problem.message}"
                yield Diagnostic(code, message, place.span, hint)


@register
class Interruptible(Check):
    codes = {
        "E179": "`interruptible` given twice in a graph",
        "W175": "graph is `interruptible` but streams nothing to the caller",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for graph in program.graphs.values():
            if not graph.interruptible:
                continue
            first = graph.interruptible[0]
            for repeat in graph.interruptible[1:]:
                yield Diagnostic(
                    "E179",
                    f"graph `{graph.name}` says `interruptible` twice",
                    repeat.span,
                    "remove the repetition",
                    (Note(first.span, "first here"),),
                )
            if not graph.streams:
                yield Diagnostic(
                    "W175",
                    f"graph `{graph.name}` is `interruptible` but streams nothing, so an interrupted call has "
                    "delivered nothing partial: interrupting it only cancels it, and no role can keep what its caller heard",
                    first.span,
                    "stream the field the user sees as it is made (`stream FIELD`), or drop `interruptible`; "
                    "`allow W175` if cancelling is all you want",
                )
