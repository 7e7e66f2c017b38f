"""`flowc lsp`: the language server (pygls over stdio).

It checks documents with the compiler (the same checks as `flowc check`, imports resolved
beside the file) and publishes the diagnostics, tagged with the document version they were
computed for. When a document is checked, where, and which results are published is
`flowc.lsp.scheduler`'s: at once on open and save, after a short pause in edits on change
(`flowc lsp --debounce-ms`), on a worker thread, results for outdated versions dropped.
Hover, definition, references, completion, document symbols and formatting are answered on
the event loop while a check runs, from the analysis of the latest checked version. A document
that does not parse keeps the names of its last good version for completion and hover, so
typing does not blank the editor's help. `workspace/executeCommand` `flowc.statistics` returns
`FlowServer.statistics()` (with the argument "settled": once no check runs or waits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from flowc import __version__
from flowc.check import CheckResult, check_source
from flowc.check.loader import STDLIB_PREFIX, stdlib_dir
from flowc.check.model import Program
from flowc.diagnostics import Diagnostic, Severity
from flowc.fmt import format_source
from flowc.lsp import answers
from flowc.lsp.index import Kind, Occurrence, at, occurrences
from flowc.lsp.positions import UTF16, LineIndex
from flowc.lsp.scheduler import DEFAULT_DEBOUNCE_S, CheckScheduler, Snapshot
from flowc.spans import Span


@dataclass
class Analysis:
    """One version of a document: its text, the compiler's result and the names in it."""

    uri: str
    path: str
    text: str
    version: int | None
    result: CheckResult
    found: list[Occurrence] = field(default_factory=list)


def analyse(snapshot: Snapshot) -> Analysis:
    """Check one version of a document (on the scheduler's worker thread: it reads nothing else of the server)."""
    path = to_fs_path(snapshot.uri) or snapshot.uri
    file = Path(path) if snapshot.uri.startswith("file:") else None
    result = check_source(snapshot.text, path, file)
    analysis = Analysis(snapshot.uri, path, snapshot.text, snapshot.version, result)
    if result.program is not None:
        analysis.found = occurrences(result.program.root.ast)
    return analysis


class FlowServer(LanguageServer):
    def __init__(self, debounce_s: float = DEFAULT_DEBOUNCE_S) -> None:
        super().__init__("flowc", __version__)
        self.analyses: dict[str, Analysis] = {}  # the latest published analysis of each open document
        self.last_program: dict[str, Program] = {}
        self.published: dict[str, set[str]] = {}  # root uri -> uris it published diagnostics to
        self.checks: CheckScheduler[Analysis] = CheckScheduler(self.snapshot, analyse, self.delivered, debounce_s)

    @property
    def encoding(self) -> str:
        return self.workspace.position_encoding or UTF16

    def lines(self, text: str) -> LineIndex:
        return LineIndex(text, self.encoding)

    # ── analysis ──

    def snapshot(self, uri: str) -> Snapshot | None:
        """The current text and version of an open document (None once it is closed)."""
        document = self.workspace.text_documents.get(unquote(uri))
        return None if document is None else Snapshot(uri, document.version, document.source)

    def delivered(self, snapshot: Snapshot, analysis: Analysis) -> None:
        """A check of the document's current version ended (called on the event loop)."""
        self.analyses[analysis.uri] = analysis
        if analysis.result.program is not None:
            self.last_program[analysis.uri] = analysis.result.program
        self.publish(analysis)

    async def analysis(self, uri: str) -> Analysis:
        """The latest checked version of `uri`; a document not checked yet (or not open) is checked first."""
        analysis = self.analyses.get(uri)
        if analysis is not None:
            return analysis
        snapshot = self.snapshot(uri)
        if snapshot is None:  # a request about a file the editor has not opened: read it from disk
            document = self.workspace.get_text_document(uri)
            snapshot = Snapshot(uri, document.version, document.source)
        return await self.checks.run(snapshot)

    def forget(self, uri: str) -> None:
        self.checks.forget(uri)
        for published in sorted(self.published.pop(uri, set())):
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=published, diagnostics=[]))
        self.analyses.pop(uri, None)
        self.last_program.pop(uri, None)

    def statistics(self) -> dict[str, Any]:
        """The checks' counts and state, and what the server holds per document (zero once every document is closed)."""
        return {
            "checks": self.checks.statistics(),
            "analyses": len(self.analyses),
            "last_programs": len(self.last_program),
            "published": len(self.published),
        }

    def program(self, uri: str) -> Program | None:
        analysis = self.analyses.get(uri)
        if analysis and analysis.result.program is not None:
            return analysis.result.program
        return self.last_program.get(uri)

    def uri_of(self, display: str, analysis: Analysis) -> str:
        if display == analysis.path:
            return analysis.uri
        if display.startswith(STDLIB_PREFIX + "/"):
            return from_fs_path(str(stdlib_dir() / display[len(STDLIB_PREFIX) + 1 :])) or display
        return from_fs_path(display) or display

    def text_of(self, uri: str, analysis: Analysis) -> str:
        if uri == analysis.uri:
            return analysis.text
        source = next((text for display, text in analysis.result.sources.items() if self.uri_of(display, analysis) == uri), "")
        return source

    def location(self, span: Span, analysis: Analysis) -> types.Location:
        uri = self.uri_of(span.file, analysis)
        return types.Location(uri=uri, range=self.lines(self.text_of(uri, analysis)).range(span))

    def publish(self, analysis: Analysis) -> None:
        by_uri: dict[str, list[types.Diagnostic]] = {}
        for diagnostic in analysis.result.diagnostics:
            uri = self.uri_of(diagnostic.span.file, analysis)
            by_uri.setdefault(uri, []).append(self.to_lsp(diagnostic, analysis))
        uris = set(by_uri) | {analysis.uri}
        for stale in self.published.get(analysis.uri, set()) - uris:
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=stale, diagnostics=[]))
        for uri in sorted(uris):
            # the version tells the editor which text the diagnostics are for (imported files: not known)
            version = analysis.version if uri == analysis.uri else None
            params = types.PublishDiagnosticsParams(uri=uri, diagnostics=by_uri.get(uri, []), version=version)
            self.text_document_publish_diagnostics(params)
        self.published[analysis.uri] = uris

    def to_lsp(self, diagnostic: Diagnostic, analysis: Analysis) -> types.Diagnostic:
        uri = self.uri_of(diagnostic.span.file, analysis)
        message = diagnostic.message + (f"\nhint: {diagnostic.hint}" if diagnostic.hint else "")
        severity = types.DiagnosticSeverity.Error if diagnostic.severity is Severity.ERROR else types.DiagnosticSeverity.Warning
        related = [
            types.DiagnosticRelatedInformation(location=self.location(note.span, analysis), message=note.message)
            for note in diagnostic.notes
        ]
        return types.Diagnostic(
            range=self.lines(self.text_of(uri, analysis)).range(diagnostic.span),
            message=message,
            severity=severity,
            code=diagnostic.code,
            source="flowc",
            related_information=related or None,
        )

    async def occurrence_at(self, uri: str, position: types.Position) -> tuple[Analysis, Occurrence] | None:
        analysis = await self.analysis(uri)
        if analysis.result.program is None:
            return None
        found = at(analysis.found, self.lines(analysis.text).offset(position))
        return (analysis, found) if found else None


server = FlowServer()


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: FlowServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.checks.now(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: FlowServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.checks.changed(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: FlowServer, params: types.DidSaveTextDocumentParams) -> None:
    # immediate even when the text is unchanged: the files it imports may have been saved
    ls.checks.now(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: FlowServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.forget(params.text_document.uri)


@server.feature(types.SHUTDOWN)
def shutdown(ls: FlowServer, params: None) -> None:
    ls.checks.close()


@server.command("flowc.statistics")
async def statistics(ls: FlowServer, *args: Any) -> dict[str, Any]:
    """`FlowServer.statistics()`; with the argument "settled", once no check is running or waiting."""
    if "settled" in args:
        await ls.checks.idle()
    return ls.statistics()


@server.feature(types.TEXT_DOCUMENT_HOVER)
async def hover(ls: FlowServer, params: types.HoverParams) -> types.Hover | None:
    hit = await ls.occurrence_at(params.text_document.uri, params.position)
    if hit is None:
        return None
    analysis, occurrence = hit
    text = answers.hover(analysis.result.program, occurrence)
    if text is None:
        return None
    content = types.MarkupContent(kind=types.MarkupKind.Markdown, value=text)
    return types.Hover(contents=content, range=ls.lines(analysis.text).range(occurrence.span))


@server.feature(types.TEXT_DOCUMENT_DEFINITION)
async def definition(ls: FlowServer, params: types.DefinitionParams) -> list[types.Location] | None:
    hit = await ls.occurrence_at(params.text_document.uri, params.position)
    if hit is None:
        return None
    analysis, occurrence = hit
    program = analysis.result.program
    if occurrence.kind is Kind.IMPORT:
        display = answers.imported_file(program, occurrence)
        if display is None:
            return None
        start = types.Position(line=0, character=0)
        return [types.Location(uri=ls.uri_of(display, analysis), range=types.Range(start=start, end=start))]
    return [ls.location(span, analysis) for span in answers.definition(program, occurrence)] or None


@server.feature(types.TEXT_DOCUMENT_REFERENCES)
async def references(ls: FlowServer, params: types.ReferenceParams) -> list[types.Location] | None:
    hit = await ls.occurrence_at(params.text_document.uri, params.position)
    if hit is None:
        return None
    analysis, occurrence = hit
    found = answers.references(analysis.found, occurrence)
    if not params.context.include_declaration:
        found = [o for o in found if not o.declares]
    return [ls.location(o.span, analysis) for o in found]


_COMPLETION_KINDS = {
    "keyword": types.CompletionItemKind.Keyword,
    "role": types.CompletionItemKind.Class,
    "interface": types.CompletionItemKind.Method,
    "field": types.CompletionItemKind.Field,
    "type": types.CompletionItemKind.TypeParameter,
    "global": types.CompletionItemKind.Variable,
    "policy": types.CompletionItemKind.EnumMember,
    "setting": types.CompletionItemKind.Property,
}


@server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[".", " "]))
def completion(ls: FlowServer, params: types.CompletionParams) -> types.CompletionList:
    uri = params.text_document.uri
    document = ls.workspace.get_text_document(uri)
    index = ls.lines(document.source)
    line = index.lines[params.position.line] if params.position.line < len(index.lines) else ""
    column = index.offset(params.position) - index.offset(types.Position(line=params.position.line, character=0))
    candidates = answers.completions(ls.program(uri), line[:column])
    items = [
        types.CompletionItem(label=c.label, kind=_COMPLETION_KINDS[c.kind], detail=c.detail or c.kind, sort_text=f"{i:04d}")
        for i, c in enumerate(candidates)
    ]
    return types.CompletionList(is_incomplete=False, items=items)


_SYMBOL_KINDS = {
    "role": types.SymbolKind.Class,
    "interface": types.SymbolKind.Method,
    "graph": types.SymbolKind.Function,
    "field": types.SymbolKind.Field,
    "type": types.SymbolKind.TypeParameter,
    "global": types.SymbolKind.Variable,
    "module": types.SymbolKind.Module,
}


@server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
async def document_symbols(ls: FlowServer, params: types.DocumentSymbolParams) -> list[types.DocumentSymbol]:
    analysis = await ls.analysis(params.text_document.uri)
    if analysis.result.program is None:
        return []
    index = ls.lines(analysis.text)

    def convert(symbol: answers.Symbol) -> types.DocumentSymbol:
        return types.DocumentSymbol(
            name=symbol.name,
            kind=_SYMBOL_KINDS[symbol.kind],
            range=index.range(symbol.span),
            selection_range=index.range(symbol.selection),
            detail=symbol.detail or None,
            children=[convert(child) for child in symbol.children],
        )

    return [convert(symbol) for symbol in answers.symbols(analysis.result.program.root.ast)]


@server.feature(types.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: FlowServer, params: types.DocumentFormattingParams) -> list[types.TextEdit] | None:
    document = ls.workspace.get_text_document(params.text_document.uri)
    formatted, _ = format_source(document.source, to_fs_path(document.uri) or document.uri)
    if formatted is None:
        ls.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Warning, message="flowc: fix the syntax errors before formatting")
        )
        return None
    if formatted == document.source:
        return []
    whole = types.Range(start=types.Position(line=0, character=0), end=ls.lines(document.source).end())
    return [types.TextEdit(range=whole, new_text=formatted)]


def main(debounce_s: float = DEFAULT_DEBOUNCE_S) -> None:
    server.checks.debounce_s = debounce_s
    server.start_io()
