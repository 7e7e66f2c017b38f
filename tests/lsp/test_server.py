"""`flowc lsp` driven over stdio by a real LSP client (pytest-lsp), as an editor would.

The server runs as a subprocess (`python -m flowc lsp`). Tests wait on the server's
notifications and responses; none sleeps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient

from flowc.fmt import format_source
from tests.conftest import REPO

pytestmark = pytest.mark.asyncio(loop_scope="module")

IMAGE_CHAT = REPO / "examples" / "image_chat" / "pipeline.flow"


@pytest_lsp.fixture(
    scope="module",
    config=ClientServerConfig(server_command=[sys.executable, "-m", "flowc", "lsp"]),
)
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    yield
    await lsp_client.shutdown_session()


def position(text: str, needle: str, nth: int = 0, into: int = 1) -> types.Position:
    """The position `into` characters inside the `nth` occurrence of `needle` (ASCII text)."""
    offset = -1
    for _ in range(nth + 1):
        offset = text.index(needle, offset + 1)
    offset += into
    line = text.count("\n", 0, offset)
    return types.Position(line=line, character=offset - (text.rfind("\n", 0, offset) + 1))


async def open_document(client: LanguageClient, path: Path, text: str | None = None) -> tuple[str, str]:
    uri = from_fs_path(str(path))
    text = path.read_text(encoding="utf-8") if text is None else text
    item = types.TextDocumentItem(uri=uri, language_id="flow", version=1, text=text)
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return uri, text


async def change_document(client: LanguageClient, uri: str, text: str, version: int) -> None:
    document = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
    change = types.TextDocumentContentChangeWholeDocument(text=text)
    client.text_document_did_change(types.DidChangeTextDocumentParams(text_document=document, content_changes=[change]))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)


async def close_document(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)


BROKEN = """\
flow broken

placeholder prompt: Text

role writer {
    impl "m:Writer"
    interface write { in promt  out answer: Text }
}

graph ask {
    entry  prompt
    return answer
}
"""


async def test_diagnostics_appear_for_a_broken_file_and_clear_when_fixed(client: LanguageClient, tmp_path: Path):
    uri, text = await open_document(client, tmp_path / "broken.flow", BROKEN)
    (unknown,) = client.diagnostics[uri]
    assert unknown.code == "E140"
    assert unknown.severity == types.DiagnosticSeverity.Error
    assert unknown.source == "flowc"
    assert unknown.range.start == position(text, "promt", into=0)
    assert unknown.range.end == position(text, "promt", into=5)
    assert unknown.message.endswith("hint: did you mean `prompt`?")

    await change_document(client, uri, text.replace("promt", "prompt"), version=2)
    assert not client.diagnostics[uri]

    await change_document(client, uri, text.replace("role writer {", "role writer {{"), version=3)
    syntax = client.diagnostics[uri]
    assert syntax and syntax[0].severity == types.DiagnosticSeverity.Error
    await close_document(client, uri)
    assert not client.diagnostics[uri]


async def test_columns_are_utf16_code_units(client: LanguageClient, tmp_path: Path):
    # Each emoji is one code point but two UTF-16 code units; the error after them must move by 2 each.
    text = 'flow emoji\n\nrole a { impl "🙂🙂" replicas 0 }\n'
    uri, _ = await open_document(client, tmp_path / "emoji.flow", text)
    (diagnostic,) = [d for d in client.diagnostics[uri] if "replicas" in d.message]
    line = text.splitlines()[2]
    code_points = line.index(" 0 }") + 1
    assert diagnostic.range.start == types.Position(line=2, character=code_points + 2)
    await close_document(client, uri)


async def test_hover_on_a_field_lists_producers_consumers_and_type(client: LanguageClient):
    uri, text = await open_document(client, IMAGE_CHAT)
    assert not client.diagnostics[uri]
    answer = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position(text, "vit_emb &"))
    )
    value = answer.contents.value
    assert "field vit_emb: Tensor" in value
    assert "**Produced by** `vit.encode`" in value
    assert "`dit.denoise`" in value and "`llm.generate`" in value
    assert answer.range.start == position(text, "vit_emb &", into=0)


async def test_hover_on_a_role_shows_interfaces_and_resources(client: LanguageClient):
    uri, text = await open_document(client, IMAGE_CHAT)
    answer = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position(text, "with llm", into=6))
    )
    value = answer.contents.value
    assert "role llm" in value
    assert "lb session" in value and "gpus 1" in value and "uses `kv`" in value
    assert "interface generate { in txt_emb | vit_emb & vae_lat  out stream token: Text, hidden: Tensor }" in value


async def test_definition_of_a_field_is_its_producer(client: LanguageClient):
    uri, text = await open_document(client, IMAGE_CHAT)
    locations = await client.text_document_definition_async(
        types.DefinitionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position(text, "in latent", into=4))
    )
    (location,) = locations
    assert location.uri == uri
    assert location.range.start == position(text, "out latent", into=4)


async def test_definition_of_role_references_and_imports(client: LanguageClient, tmp_path: Path):
    (tmp_path / "shared").mkdir()
    library = 'role encoder {\n    impl "m:Encoder"\n    interface encode { in image  out features: Tensor }\n}\n'
    (tmp_path / "shared" / "encoders.flow").write_text(library, encoding="utf-8")
    main = (
        "flow main\n\nimport shared.encoders\n\nplaceholder image: Image\n\n"
        'role head {\n    impl "m:Head"\n    interface classify { in features from encoder.encode  out label: Text }\n}\n\n'
        "graph label {\n    entry  image\n    return label\n}\n"
    )
    uri, text = await open_document(client, tmp_path / "main.flow", main)
    assert not client.diagnostics[uri]
    library_uri = from_fs_path(str(tmp_path / "shared" / "encoders.flow"))
    document = types.TextDocumentIdentifier(uri=uri)

    (imported,) = await client.text_document_definition_async(
        types.DefinitionParams(text_document=document, position=position(text, "encoders"))
    )
    assert imported.uri == library_uri

    (role,) = await client.text_document_definition_async(
        types.DefinitionParams(text_document=document, position=position(text, "from encoder", into=6))
    )
    assert role.uri == library_uri
    assert role.range.start == position(library, "encoder {", into=0)

    (interface,) = await client.text_document_definition_async(
        types.DefinitionParams(text_document=document, position=position(text, "encoder.encode", into=10))
    )
    assert interface.range.start == position(library, "encode {", into=0)

    (field,) = await client.text_document_definition_async(
        types.DefinitionParams(text_document=document, position=position(text, "in features", into=4))
    )
    assert field.uri == library_uri
    assert field.range.start == position(library, "features", into=0)
    await close_document(client, uri)


async def test_references_of_a_field(client: LanguageClient):
    uri, text = await open_document(client, IMAGE_CHAT)
    found = await client.text_document_references_async(
        types.ReferenceParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position(text, "image_seg", nth=1),
            context=types.ReferenceContext(include_declaration=True),
        )
    )
    starts = sorted((loc.range.start.line, loc.range.start.character) for loc in found)
    expected = sorted((p.line, p.character) for p in (position(text, "image_seg", nth=n, into=0) for n in range(3)))
    assert starts == expected


async def completion_labels(client: LanguageClient, uri: str, at: types.Position) -> list[str]:
    answer = await client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=at)
    )
    return [item.label for item in answer.items]


async def test_completion_offers_policies_roles_fields_and_keywords(client: LanguageClient, tmp_path: Path):
    uri, text = await open_document(client, IMAGE_CHAT)
    after_lb = position(text, "lb round_robin", into=3)
    assert await completion_labels(client, uri, after_lb) == ["round_robin", "session", "broadcast", "load_aware"]

    after_with = position(text, "with llm", into=5)
    assert "llm" in await completion_labels(client, uri, after_with)
    assert "txt_emb" not in await completion_labels(client, uri, after_with)

    in_clause = position(text, "in  txt_emb", into=4)
    fields = await completion_labels(client, uri, in_clause)
    assert {"txt_emb", "vit_emb", "vae_lat", "request", "latent"} <= set(fields)
    assert "role" not in fields

    # While the user is typing, the file does not parse; names come from its last good version.
    typing = text.replace("role dit {", "role dit {\n    \n    inter", 1)
    await change_document(client, uri, typing, version=2)
    assert client.diagnostics[uri]
    line_start = position(typing, "    inter", into=4)
    labels = await completion_labels(client, uri, line_start)
    assert {"interface", "role", "graph", "impl", "replicas", "llm"} <= set(labels)
    await close_document(client, uri)


async def test_formatting_gives_the_same_text_as_flowc_fmt(client: LanguageClient, tmp_path: Path):
    messy = (
        'flow messy\nplaceholder   x :Json\nrole r {impl "m:R"\ninterface go {in x out y: Text}}\ngraph g { entry x\nreturn y }\n'
    )
    uri, _ = await open_document(client, tmp_path / "messy.flow", messy)
    options = types.FormattingOptions(tab_size=4, insert_spaces=True)
    edits = await client.text_document_formatting_async(
        types.DocumentFormattingParams(text_document=types.TextDocumentIdentifier(uri=uri), options=options)
    )
    (edit,) = edits
    assert edit.new_text == format_source(messy)[0]
    assert edit.range.start == types.Position(line=0, character=0)
    assert edit.range.end == types.Position(line=6, character=0)
    await close_document(client, uri)


async def test_document_symbols_outline_the_file(client: LanguageClient):
    uri, text = await open_document(client, IMAGE_CHAT)
    symbols = await client.text_document_document_symbol_async(
        types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    outline = [(s.name, s.kind) for s in symbols]
    assert outline == [
        ("request", types.SymbolKind.Field),
        ("kv", types.SymbolKind.Variable),
        ("frontend", types.SymbolKind.Class),
        ("embed", types.SymbolKind.Class),
        ("vit", types.SymbolKind.Class),
        ("vae", types.SymbolKind.Class),
        ("llm", types.SymbolKind.Class),
        ("dit", types.SymbolKind.Class),
        ("chat", types.SymbolKind.Function),
    ]
    vae = next(s for s in symbols if s.name == "vae")
    assert [c.name for c in vae.children] == ["encode", "decode"]
    assert vae.selection_range.start == position(text, "vae {", into=0)
