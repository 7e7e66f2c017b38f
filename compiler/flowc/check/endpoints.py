"""Which OpenAI endpoints a graph serves (`serves chat, images, speech, embeddings, realtime` in a graph;
docs/openai.md), and which of its fields each endpoint reads. One place decides it: the check
`Endpoints` (flowc.check.checks.graphs) reports a graph that cannot fill an endpoint it
declares, and codegen records the fields in bundle.json (`graphs.G.endpoints`), which is all the
runtime reads. A graph that declares no `serves` is served as a chat model when it can be one
(an OpenAI client could always drive such a graph), and by no other endpoint.

Every endpoint but `realtime` fills one entry, `Text` (the prompt, the input text, the last user
message) or `Json` (the whole request body), with one value when the call starts: never a
streaming entry (`placeholder stream`), whose frames come while the call runs. `realtime`
(/v1/realtime, a WebSocket) streams the client's audio into one streaming entry of type `Audio`
(`input`), and may fill one more entry, `Text` or `Json`, with the session's instructions or
settings when each call starts (`session`). What each endpoint reads of the outputs (the first
of the type, ordered streams before other streams before returns):

    chat        `text`: a Text output; `audio`: an Audio output, when the graph has one
                (sent as `message.audio` when the request asks for `modalities: ["audio"]`)
    images      `image`: an Image output (sent as a PNG)
    speech      `audio`: an Audio output (sent as a WAV file or raw PCM16)
    embeddings  `vector`: a Tensor output, else a Json or list output (one vector per input)
    realtime    `text`: a Text output (text or transcript deltas); `audio`: an Audio output, when
                the graph has one (audio deltas)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from flowc.check.model import GraphInfo, Program
from flowc.syntax import ast

ENTRY_TYPES = ("Text", "Json", "Any")
PATHS = {  # where each is served (flowrt.gateway)
    "chat": "/v1/chat/completions",
    "images": "/v1/images/generations",
    "speech": "/v1/audio/speech",
    "embeddings": "/v1/embeddings",
    "realtime": "/v1/realtime",
}


@dataclass(frozen=True)
class Needs:
    """One field an endpoint reads: its name in bundle.json, the types it takes (first match
    wins, in this order) and whether the graph may lack it."""

    key: str
    types: tuple[str, ...]
    optional: bool = False

    def takes(self, type_name: str) -> bool:
        return type_name in self.types or ("[]" in self.types and type_name.startswith("["))

    @property
    def described(self) -> str:
        shown = [f"`{t}`" if t != "[]" else "a list type" for t in self.types]
        return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


NEEDS: dict[str, tuple[Needs, ...]] = {
    "chat": (Needs("text", ("Text",)), Needs("audio", ("Audio",), optional=True)),
    "images": (Needs("image", ("Image",)),),
    "speech": (Needs("audio", ("Audio",)),),
    "embeddings": (Needs("vector", ("Tensor", "Json", "[]")),),
    "realtime": (Needs("text", ("Text",)), Needs("audio", ("Audio",), optional=True)),
}
REALTIME_INPUT = "Audio"  # the type of the streaming entry /v1/realtime sends the client's audio to


@dataclass(frozen=True)
class Problem:
    """Why a graph cannot serve an endpoint: `entry` (it does not take one Text or Json value),
    `output` (no output of a type the endpoint reads) or `elsewhere` (another check reports it)."""

    endpoint: str
    kind: str
    message: str
    hint: str | None = None  # the fix, where it is not the kind's usual one


def ranked_outputs(program: Program, graph: GraphInfo) -> list[tuple[str, str]]:
    """The graph's (field, type) outputs in the order endpoints look at them: ordered streams,
    other streams, returns (each in declaration order); a field no interface produces is left out."""
    streams = [s for s in graph.streams if s.ordered] + [s for s in graph.streams if not s.ordered]
    fields = [s.field.name.text for s in streams] + [r.name.text for r in graph.returns]
    outputs = []
    for name in fields:
        producers = program.field(name).producers
        if producers:
            outputs.append((name, str(program.type_of(producers[0].decl.type))))
    return outputs


def declared(graph: GraphInfo) -> tuple[str, ...]:
    return tuple(graph.config.get("serves", ()))


def serves_setting(graph: GraphInfo) -> ast.Setting | None:
    return next((s for s in graph.settings if s.key.text == "serves"), None)


def _entry_problem(program: Program, graph: GraphInfo, endpoint: str) -> Problem | None:
    entries = [e.text for e in graph.entries]
    if len(entries) != 1:
        return Problem(endpoint, "entry", f"it takes {len(entries)} entry values ({', '.join(entries) or 'none'}), not one")
    placeholder = program.placeholders.get(entries[0])
    if placeholder is None:  # E170 reports it: the check says nothing more
        return Problem(endpoint, "elsewhere", f"its entry `{entries[0]}` is not a placeholder")
    entry_type = str(program.type_of(placeholder.type))
    if placeholder.stream:
        return Problem(
            endpoint,
            "entry",
            f"its entry `{entries[0]}` streams (`placeholder stream`), and the endpoint gives it one value when the call starts",
            f"remove `stream` from `placeholder {entries[0]}` if one value is its whole input, or take `{endpoint}` out of `serves`",
        )
    if entry_type not in ENTRY_TYPES:
        return Problem(endpoint, "entry", f"its entry `{entries[0]}` is `{entry_type}`, not `Text` or `Json`")
    return None


def _realtime_entries(program: Program, graph: GraphInfo) -> dict[str, str] | Problem:
    """The entries /v1/realtime fills: `input`, the one streaming `Audio` entry, and `session`,
    one other entry (`Text` or `Json`) if the graph has one; or why it cannot."""
    endpoint, path = "realtime", PATHS["realtime"]
    entries = [e.text for e in graph.entries]
    placeholders = [program.placeholders.get(name) for name in entries]
    if any(p is None for p in placeholders):  # E170 reports it: the check says nothing more
        return Problem(endpoint, "elsewhere", "an entry is not a placeholder")
    streaming = [p for p in placeholders if p.stream]
    others = [p for p in placeholders if not p.stream]
    wanted = f"`placeholder stream audio_in: {REALTIME_INPUT}`"
    if len(streaming) != 1 or str(program.type_of(streaming[0].type)) != REALTIME_INPUT:
        shown = ", ".join(f"{p.name.text}: {program.type_of(p.type)}" for p in streaming) or "none"
        return Problem(
            endpoint,
            "entry",
            f"{path} streams the client's audio into one streaming `{REALTIME_INPUT}` entry, and its streaming entries are {shown}",
            f"give the graph one streaming entry of type {REALTIME_INPUT}, e.g. {wanted}, or take `realtime` out of `serves`",
        )
    fields = {"input": streaming[0].name.text}
    if len(others) > 1:
        shown = ", ".join(p.name.text for p in others)
        return Problem(
            endpoint,
            "entry",
            f"it takes {len(others)} entry values besides its audio ({shown}); {path} fills at most one, with the session's settings",
            "keep one entry besides the audio (Text: the session's instructions; Json: its settings), or take `realtime` out of `serves`",
        )
    if others:
        entry_type = str(program.type_of(others[0].type))
        if entry_type not in ENTRY_TYPES:
            return Problem(
                endpoint,
                "entry",
                f"its entry `{others[0].name.text}` is `{entry_type}`; {path} fills it with the session's instructions (`Text`) "
                "or settings (`Json`)",
                f"declare `{others[0].name.text}` `Text` or `Json`, or take `realtime` out of `serves`",
            )
        fields["session"] = others[0].name.text
    return fields


def fields_for(program: Program, graph: GraphInfo, endpoint: str) -> dict[str, str] | Problem:
    """The fields `endpoint` reads of `graph` ({"text": "token", ...}), or why it cannot serve it."""
    if endpoint == "realtime":
        found = _realtime_entries(program, graph)
        if isinstance(found, Problem):
            return found
        fields = found
    else:
        problem = _entry_problem(program, graph, endpoint)
        if problem is not None:
            return problem
        fields = {}
    outputs = ranked_outputs(program, graph)
    for need in NEEDS[endpoint]:
        found = next((name for name, type_name in outputs if need.takes(type_name)), None)
        if found is not None:
            fields[need.key] = found
        elif not need.optional:
            shown = ", ".join(f"{n}: {t}" for n, t in outputs) or "none"
            return Problem(endpoint, "output", f"it has no {need.described} output (its outputs: {shown})")
    return fields


def endpoints_of(program: Program, graph: GraphInfo) -> dict[str, dict[str, str]]:
    """What bundle.json records: each endpoint the graph serves with the fields it reads. A graph
    without `serves` gets `chat` when it can fill it."""
    wanted = declared(graph) or ("chat",)
    found = {endpoint: fields_for(program, graph, endpoint) for endpoint in wanted if endpoint in NEEDS}
    return {endpoint: fields for endpoint, fields in sorted(found.items()) if isinstance(fields, dict)}


def problems(program: Program, graph: GraphInfo) -> Iterator[Problem]:
    """Each endpoint the graph declares and cannot serve (where no other check says why)."""
    for endpoint in dict.fromkeys(declared(graph)):
        if endpoint in NEEDS:
            found = fields_for(program, graph, endpoint)
            if isinstance(found, Problem) and found.kind != "elsewhere":
                yield found
