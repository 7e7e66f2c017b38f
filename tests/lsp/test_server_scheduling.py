"""When `flowc lsp` checks and publishes, driven over stdio by a real client (pytest-lsp).

Every publishDiagnostics is recorded in arrival order with its version. To know that nothing
more will be published, a test asks the server's `flowc.statistics` command to answer once no
check is running or waiting ("settled"): everything the server published before has then
arrived (one pipe, in order). The "long check" is a real one: a 1,500-role file takes a large part of
a second to check, against milliseconds to answer a request. No test sleeps.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features
from pytest_lsp.protocol import LanguageClientProtocol

from flowc.check import check_source
from flowc.lsp.positions import LineIndex

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROLES = 1500
DEADLINE_S = 60  # for any one wait: a server that never publishes fails the test instead of hanging it


def chain(roles: int, typos: int = 0) -> str:
    """`roles` roles in a chain; the first `typos` of them (after the first) read a field that does not exist."""
    out = ["flow big", "", "placeholder request: Json", ""]
    for i in range(roles):
        source = "request" if i == 0 else (f"g{i - 1}" if i <= typos else f"f{i - 1}")
        out.append(f'role r{i} {{\n    impl "m:R{i}"\n    interface run{i} {{ in {source}  out f{i}: Tensor }}\n}}\n')
    out.append(f"graph g {{\n    entry  request\n    return f{roles - 1}\n}}\n")
    return "\n".join(out)


def recording_client() -> LanguageClient:
    """pytest-lsp's client, also keeping every publishDiagnostics in `client.published`."""
    client = LanguageClient(protocol_cls=LanguageClientProtocol)
    client.published = []

    def publish_diagnostics(client: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        client.diagnostics[params.uri] = params.diagnostics
        client.published.append(params)

    register_lsp_features(client, {**DEFAULT_CLIENT_FEATURES, types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: publish_diagnostics})
    return client


def server(*args: str) -> ClientServerConfig:
    return ClientServerConfig(server_command=[sys.executable, "-m", "flowc", "lsp", *args], client_factory=recording_client)


async def start(lsp_client: LanguageClient) -> None:
    await lsp_client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))


@pytest_lsp.fixture(scope="module", config=server("--debounce-ms", "100"))
async def client(lsp_client: LanguageClient):
    await start(lsp_client)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(scope="module", config=server("--debounce-ms", "60000"))
async def patient(lsp_client: LanguageClient):
    """A server whose delay after edits outlasts any test: only open and save publish."""
    await start(lsp_client)
    yield
    await lsp_client.shutdown_session()


async def statistics(client: LanguageClient, *arguments: str) -> dict:
    params = types.ExecuteCommandParams(command="flowc.statistics", arguments=list(arguments))
    return await asyncio.wait_for(client.workspace_execute_command_async(params), DEADLINE_S)


async def settle(client: LanguageClient) -> dict:
    """The statistics once no check runs or waits (see the module doc)."""
    return await statistics(client, "settled")


async def published_for(client: LanguageClient, uri: str, version: int | None, since: int = 0) -> types.PublishDiagnosticsParams:
    """Wait for the diagnostics of `uri` at `version` (counting those received from `client.published[since]` on)."""
    while True:
        found = [p for p in client.published[since:] if p.uri == uri and p.version == version]
        if found:
            return found[-1]
        # registered before yielding to the loop, so a notification arriving now is not missed
        arrival = client.protocol.wait_for_notification_async(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        await asyncio.wait_for(arrival, DEADLINE_S)


async def open_document(client: LanguageClient, path: Path, text: str) -> str:
    uri = from_fs_path(str(path))
    since = len(client.published)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(uri=uri, language_id="flow", version=1, text=text))
    )
    await published_for(client, uri, 1, since)
    return uri


def position_of(text: str, needle: str, into: int = 1) -> types.Position:
    """The position `into` characters inside the first `needle` of an ASCII text."""
    offset = text.index(needle) + into
    return types.Position(line=text.count("\n", 0, offset), character=offset - (text.rfind("\n", 0, offset) + 1))


def change(client: LanguageClient, uri: str, text: str, version: int) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


def save(client: LanguageClient, uri: str) -> None:
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))


def close(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))


def expected(text: str, path: Path) -> list[tuple[str | None, types.Range]]:
    """What `flowc check` reports for `text`, as LSP codes and ranges."""
    lines = LineIndex(text, "utf-16")
    return sorted(((d.code, lines.range(d.span)) for d in check_source(text, str(path), path).diagnostics), key=repr)


def received(params: types.PublishDiagnosticsParams) -> list[tuple[str | None, types.Range]]:
    return sorted(((d.code, d.range) for d in params.diagnostics), key=repr)


async def test_a_burst_of_edits_publishes_once_for_the_final_version(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "big.flow"
    uri = await open_document(client, path, chain(ROLES))
    before = len(client.published)
    for version in range(2, 12):  # ten quick edits, each with one more mistake
        change(client, uri, chain(ROLES, typos=version - 1), version)
    final = await published_for(client, uri, 11, before)
    stats = await settle(client)
    after = [p for p in client.published[before:] if p.uri == uri]
    assert [p.version for p in after] == [11]  # once, and nothing for versions 2..10
    assert received(final) == expected(chain(ROLES, typos=10), path)
    unknown = sorted(d.message.split("`")[1] for d in final.diagnostics if d.code == "E140")
    assert unknown == sorted(f"g{i}" for i in range(10))
    assert stats["checks"]["failed"] == 0
    close(client, uri)
    await settle(client)


async def test_requests_are_answered_while_a_long_check_runs(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "big.flow"
    text = chain(ROLES)
    uri = await open_document(client, path, text)
    document = types.TextDocumentIdentifier(uri=uri)
    since = len(client.published)
    save(client, uri)  # a check of 1,500 roles starts at once
    at = position_of(text, f"role r{ROLES - 1} ", into=6)
    hover = await client.text_document_hover_async(types.HoverParams(text_document=document, position=at))
    completion = await client.text_document_completion_async(
        types.CompletionParams(text_document=document, position=types.Position(line=0, character=0))
    )
    during = await statistics(client)
    assert during["checks"]["running"] == 1, "the answers came only after the check"
    assert f"role r{ROLES - 1}" in hover.contents.value
    assert "role" in {item.label for item in completion.items}
    assert received(await published_for(client, uri, 1, since)) == []
    close(client, uri)
    await settle(client)


async def test_diagnostics_and_answers_follow_the_final_text_after_a_burst(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "small.flow"
    base = (
        "flow small\n\nplaceholder prompt: Text\n\n"
        'role writer {\n    impl "m:Writer"\n    interface write { in prompt  out answer: Text }\n}\n\n'
        "graph ask {\n    entry  prompt\n    return answer\n}\n"
    )
    uri = await open_document(client, path, base)
    texts = [base.replace("answer", f"answer{n}") for n in range(1, 6)]
    texts[-1] = texts[-1].replace("return answer5", "return reply")  # the last edit breaks the graph
    for version, text in enumerate(texts, start=2):
        change(client, uri, text, version)
    final = await published_for(client, uri, 6, len(client.published))
    await settle(client)
    assert received(final) == expected(texts[-1], path)
    by_code = {d.code: d.message for d in final.diagnostics}
    assert set(by_code) == {"E172", "W143"} and "`reply`" in by_code["E172"] and "`answer5`" in by_code["W143"]
    at = position_of(texts[-1], "answer5")
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=at)
    )
    assert "field answer5: Text" in hover.contents.value
    close(client, uri)
    await settle(client)


async def test_open_and_save_publish_at_once_and_edits_wait_for_the_delay(patient: LanguageClient, tmp_path: Path):
    client = patient
    path = tmp_path / "broken.flow"
    text = chain(3, typos=1)
    uri = await open_document(client, path, text)  # open: published at once despite a one-minute delay
    assert "E140" in {d.code for d in client.diagnostics[uri]}
    before = len(client.published)
    change(client, uri, chain(3), 2)
    change(client, uri, chain(3, typos=2), 3)
    stats = await statistics(client)
    assert stats["checks"]["waiting"] == 1 and stats["checks"]["running"] == 0
    assert client.published[before:] == []
    save(client, uri)
    final = await published_for(client, uri, 3, before)
    stats = await settle(client)
    assert received(final) == expected(chain(3, typos=2), path)
    assert [p.version for p in client.published[before:] if p.uri == uri] == [3]
    close(client, uri)
    stats = await settle(client)
    assert stats["analyses"] == stats["last_programs"] == stats["published"] == 0
    assert stats["checks"]["documents"] == 0


async def test_a_document_closed_during_its_check_publishes_nothing_more(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "big.flow"
    uri = await open_document(client, path, chain(ROLES, typos=1))
    before = len(client.published)
    change(client, uri, chain(ROLES, typos=2), 2)
    save(client, uri)  # a check of version 2 starts at once
    assert (await statistics(client))["checks"]["running"] == 1
    close(client, uri)
    # opening it again queues a check behind the one running: its result arriving means the other ended
    reopened = chain(3)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="flow", version=1, text=reopened)
        )
    )
    await published_for(client, uri, 1, before)
    stats = await settle(client)
    after = [(p.version, len(p.diagnostics)) for p in client.published[before:] if p.uri == uri]
    assert after[0] == (None, 0)  # the close cleared the document's diagnostics
    assert after[-1] == (1, 0) and all(version != 2 for version, _ in after)
    assert stats["checks"]["stale"] >= 1
    close(client, uri)
    await settle(client)
