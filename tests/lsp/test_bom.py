"""`flowc lsp` on text that starts with a UTF-8 byte-order mark (issue 12, item 17): the editor
sends the text as it is; the server checks it without complaint, places diagnostics where the
editor shows them, and formats it keeping the mark (as `flowc fmt` does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient

from flowc.sources import BOM

pytestmark = pytest.mark.asyncio(loop_scope="module")

CLEAN = 'flow t\n\nplaceholder x: Json\n\nrole r {\n    impl "m:R"\n    interface go { in x  out y: Text }\n}\n\ngraph g {\n    entry  x\n    return y\n}\n'


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=[sys.executable, "-m", "flowc", "lsp"]))
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    yield
    await lsp_client.shutdown_session()


async def open_document(client: LanguageClient, path: Path, text: str) -> str:
    uri = from_fs_path(str(path))
    item = types.TextDocumentItem(uri=uri, language_id="flow", version=1, text=text)
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return uri


async def close_document(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)


async def test_a_document_with_a_bom_checks_clean(client: LanguageClient, tmp_path: Path):
    uri = await open_document(client, tmp_path / "bom.flow", BOM + CLEAN)
    assert list(client.diagnostics[uri]) == []
    await close_document(client, uri)


async def test_positions_on_the_first_line_count_the_bom_as_the_editor_does(client: LanguageClient, tmp_path: Path):
    uri = await open_document(client, tmp_path / "bad.flow", BOM + "flow 7\n")
    (diagnostic,) = client.diagnostics[uri]
    assert diagnostic.code == "E001"
    assert diagnostic.range.start == types.Position(line=0, character=6)  # U+FEFF is one UTF-16 unit
    await close_document(client, uri)


async def test_formatting_keeps_the_bom(client: LanguageClient, tmp_path: Path):
    uri = await open_document(client, tmp_path / "messy.flow", BOM + CLEAN.replace("    impl", " impl"))
    options = types.FormattingOptions(tab_size=4, insert_spaces=True)
    (edit,) = await client.text_document_formatting_async(
        types.DocumentFormattingParams(text_document=types.TextDocumentIdentifier(uri=uri), options=options)
    )
    assert edit.new_text == BOM + CLEAN
    await close_document(client, uri)
