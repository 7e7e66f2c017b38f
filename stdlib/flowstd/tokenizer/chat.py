"""The chat template: OpenAI-style messages to token ids, with the media placeholders' positions.

    <|bos|> <|ROLE|> content <|eos|> <|ROLE|> content <|eos|> ... <|assistant|>

Each message is its role's marker, its content, and `<|eos|>`; the prompt ends with
`<|assistant|>` (the model's turn) unless `add_generation_prompt=False`. Roles: `system` (and
`developer`, OpenAI's newer name for it), `user`, `assistant`. Content is a string, or a list of
parts: `{"type": "text", "text": ...}` (and `refusal`, an assistant's text) are encoded as plain
text, each part on its own; `{"type": "image_url", "image_url": ...}` becomes one `<|image|>`
token and `{"type": "input_audio", "input_audio": ...}` one `<|audio|>` token. Each placeholder
comes back with its position in the ids and the part's payload, so a multimodal pipeline can
encode the media and splice their embeddings in at that position (one placeholder stands for
however many rows the encoder gives).

`messages` may also be an OpenAI request body (`{"messages": [...], ...}`, what the OpenAI
endpoint hands a graph whose entry is `Json`) or a bare string (one user message).
`chat_parts` gives the same messages as checked parts, for readers of their media.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from flowstd.tokenizer.core import TokenizerError, check_text

if TYPE_CHECKING:
    from flowstd.tokenizer.core import Tokenizer

ROLE_TOKENS = {"system": "<|system|>", "developer": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
TEXT_PARTS = {"text": "text", "refusal": "refusal"}  # part type -> the key holding its text
MEDIA_PARTS = {"image_url": ("image", "<|image|>"), "input_audio": ("audio", "<|audio|>")}  # part type -> (kind, token)
MEDIA_TOKENS = dict(MEDIA_PARTS.values())  # kind -> token


class ChatTemplateError(TokenizerError):
    """Messages the chat template cannot take; the message names the offending message or part."""


@dataclass(frozen=True)
class MediaPlaceholder:
    """One image or audio part of the messages: `ids[position]` is its `<|image|>` or
    `<|audio|>` token; `source` is the part's payload as given (`image_url`'s or `input_audio`'s
    value); `message` and `part` index it in the messages."""

    kind: str
    position: int
    message: int
    part: int
    source: Any

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChatPrompt:
    """The template's token ids and its media placeholders, in position order."""

    ids: list[int]
    media: list[MediaPlaceholder]


def chat_messages(value: Any) -> list[dict[str, Any]]:
    """The list of messages in `value`: a list, a request body holding `messages`, or a string."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, dict):
        if "messages" not in value:
            keys = ", ".join(sorted(map(str, value))) or "none"
            raise ChatTemplateError(f"chat messages: an object must hold `messages` (an OpenAI request body); its keys: {keys}")
        value = value["messages"]
    if not isinstance(value, list):
        raise ChatTemplateError(f"chat messages must be a list of {{role, content}} objects, not {type(value).__name__}")
    if not value:
        raise ChatTemplateError("chat messages: the list is empty; give at least one {role, content} message")
    return value


@dataclass(frozen=True)
class ChatPart:
    """One piece of a message's content, in order: `kind` "text" (`value` the text: a string
    content, a text or refusal part) or "image"/"audio" (`value` the part's `image_url` or
    `input_audio` payload as given); `where` names it in the messages."""

    message: int
    part: int | None  # None: the message's content was a string
    role: str
    kind: str
    value: Any

    @property
    def where(self) -> str:
        return f"messages[{self.message}]" + (".content" if self.part is None else f".content[{self.part}]")


def chat_parts(messages: Any) -> list[ChatPart]:
    """Every message's content as parts, checked as the chat template checks them (the frontends
    of flowstd's multimodal and voice modules read OpenAI bodies with it)."""
    parts: list[ChatPart] = []
    for index, message in enumerate(chat_messages(messages)):
        parts.extend(_message_parts(message, index, _role(message, f"messages[{index}]")))
    return parts


def apply_chat_template(tokenizer: Tokenizer, messages: Any, *, add_generation_prompt: bool = True) -> ChatPrompt:
    ids = [tokenizer.bos_id]
    media: list[MediaPlaceholder] = []
    for index, message in enumerate(chat_messages(messages)):
        role = _role(message, f"messages[{index}]")
        ids.append(tokenizer.special_ids[ROLE_TOKENS[role]])
        for part in _message_parts(message, index, role):
            if part.kind == "text":
                ids.extend(tokenizer.encode(part.value))
            else:
                media.append(MediaPlaceholder(part.kind, len(ids), index, part.part, part.value))
                ids.append(tokenizer.special_ids[MEDIA_TOKENS[part.kind]])
        ids.append(tokenizer.eos_id)
    if add_generation_prompt:
        ids.append(tokenizer.assistant_id)
    return ChatPrompt(ids, media)


def _role(message: Any, where: str) -> str:
    if not isinstance(message, dict):
        raise ChatTemplateError(f"{where} must be a {{role, content}} object, not {_kind(message)}")
    role = message.get("role")
    if role not in ROLE_TOKENS:
        known = ", ".join(ROLE_TOKENS)
        raise ChatTemplateError(f"{where}.role is {role!r}; the chat template knows {known} (tool messages are not supported)")
    return role


def _message_parts(message: dict, index: int, role: str) -> list[ChatPart]:
    where = f"messages[{index}]"
    content = message.get("content")
    if content is None and role == "assistant":
        return []  # an assistant turn that only called tools
    if isinstance(content, str):
        check_text(content, f"{where}.content", ChatTemplateError)
        return [ChatPart(index, None, role, "text", content)]
    if not isinstance(content, list):
        raise ChatTemplateError(f"{where}.content must be a string or a list of parts, not {_kind(content)}")
    return [_part(part, index, part_index, role) for part_index, part in enumerate(content)]


def _part(part: Any, index: int, part_index: int, role: str) -> ChatPart:
    where = f"messages[{index}].content[{part_index}]"
    if not isinstance(part, dict):
        raise ChatTemplateError(f"{where} must be a part object with a `type`, not {_kind(part)}")
    kind = part.get("type")
    if kind in TEXT_PARTS:
        key = TEXT_PARTS[kind]
        check_text(part.get(key), f"{where}.{key}", ChatTemplateError)
        return ChatPart(index, part_index, role, "text", part[key])
    if kind in MEDIA_PARTS:
        if part.get(kind) is None:
            raise ChatTemplateError(f"{where} has type `{kind}` but no `{kind}` payload")
        return ChatPart(index, part_index, role, MEDIA_PARTS[kind][0], part[kind])
    known = ", ".join([*TEXT_PARTS, *MEDIA_PARTS])
    raise ChatTemplateError(f"{where}.type is {kind!r}; the chat template takes {known}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
