"""The content of a session's sequence for prefix matching (docs/prefix.md): segments, and the
page keys over them.

A sequence is a list of segments, each a run of positions the LLM reads:
- `TextSegment`: token ids.
- `MediaSegment`: the positions an encoder's output fills (an image, an audio clip, a generated
  image): its modality, the 16-byte content hash of its payload, and its length in tokens, known
  once the encoder ran.

The page keys are flowrt.compute.hashing's chained page hashes over the sequence's token ids,
where a media position holds a placeholder id and a page that holds media positions mixes in
an *extra* describing them, so the same text with another image never gives the same key:

    extra(page) = content_hash(span || span || ...)   one span per media run in the page, in order
    span        = uint32 LE start, stop (positions within the page), offset (of `start` within
                  its payload's tokens) || the payload's 16-byte content hash
                  || uint32 LE len(modality) || modality as UTF-8

Spans name their positions, so a text token equal to the placeholder is never mistaken for a
media position, and the offset tells the same image twice in a row from one image. A sequence of
text only gives exactly `hashing.page_hashes(tokens, page_tokens)`, the keys `KVSession.keys`
makes, so text-only drivers and this module agree.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.compute.hashing import DIGEST_SIZE, ROOT, HashError, content_hash, page_hashes
from flowrt.errors import BadInput, FlowrtError

TEXT = "text"  # the modality name of text segments and their frames


class PrefixError(FlowrtError, ValueError):
    """Prefix matching was given something it cannot use (a bad step, segment, hash or hidden state)."""


class StepError(PrefixError, BadInput):
    """A `step` the session's history cannot honour: the client's to fix (a 400, raised in a role)."""


@dataclass(frozen=True, slots=True)
class TextSegment:
    """A run of text token ids."""

    tokens: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def modality(self) -> str:
        return TEXT


@dataclass(frozen=True, slots=True)
class MediaSegment:
    """`length` positions filled by the encoding of one payload (`content`: its content hash)."""

    modality: str
    content: bytes
    length: int


Segment = TextSegment | MediaSegment


@dataclass(frozen=True, slots=True)
class Placed:
    """A segment at its place in a sequence: positions offset .. offset+length."""

    segment: Segment
    offset: int

    @property
    def end(self) -> int:
        return self.offset + self.segment.length


def text_segment(tokens: Any) -> TextSegment:
    """A TextSegment of `tokens` (ints in [0, 2**32)), checked."""
    if isinstance(tokens, str | bytes | bytearray):
        raise PrefixError(f"a text segment holds token ids, not {type(tokens).__name__}: tokenize the text first")
    try:
        values = tuple(operator.index(token) for token in _as_list(tokens))
    except TypeError:
        raise PrefixError(f"a text segment holds token ids (ints), not {tokens!r:.80}") from None
    bad = next((i for i, token in enumerate(values) if not 0 <= token < 2**32), None)
    if bad is not None:
        raise PrefixError(f"text token {bad} is {values[bad]}, not a token id: token ids are ints in [0, 2**32)")
    if not values:
        raise PrefixError("a text segment is empty: leave it out of the request (every segment holds at least one token)")
    return TextSegment(values)


def _as_list(tokens: Any) -> list:
    if hasattr(tokens, "tolist"):  # numpy arrays and torch tensors
        tokens = tokens.tolist()
    return list(tokens)


def media_segment(modality: Any, content: Any, length: Any) -> MediaSegment:
    """A MediaSegment, checked: a modality name, a 16-byte content hash (bytes or 32 hex digits)
    and a length >= 1."""
    if not isinstance(modality, str) or not modality or modality == TEXT:
        raise PrefixError(f"a media segment's modality is a name such as 'image' or 'audio' (not 'text'), not {modality!r}")
    if content is None:
        raise PrefixError(
            f"the {modality} segment has no content hash: give its payload (hashed for you) or "
            f"content=flowrt.compute.hashing.content_hash(payload_bytes)"
        )
    if isinstance(content, str):
        try:
            content = bytes.fromhex(content)
        except ValueError:
            raise PrefixError(f"the {modality} segment's content hash {content!r} is not hex (32 hex digits)") from None
    if not isinstance(content, bytes | bytearray) or len(content) != DIGEST_SIZE:
        raise PrefixError(
            f"the {modality} segment's content hash must be {DIGEST_SIZE} bytes (content_hash(payload)), not {content!r:.60}"
        )
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise PrefixError(
            f"the {modality} segment's length is {length!r}: a media segment holds at least one position "
            f"(the rows of its encoder's output)"
        )
    return MediaSegment(modality, bytes(content), length)


def place(segments: Iterable[Segment], start: int = 0) -> list[Placed]:
    """The segments one after the other from position `start`."""
    placed = []
    offset = start
    for segment in segments:
        placed.append(Placed(segment, offset))
        offset += segment.length
    return placed


def token_ids(segments: Iterable[Segment], placeholder: int) -> list[int]:
    """The id of every position: text tokens, and `placeholder` at media positions."""
    ids: list[int] = []
    for segment in segments:
        if isinstance(segment, TextSegment):
            ids.extend(segment.tokens)
        else:
            ids.extend([placeholder] * segment.length)
    return ids


def page_extras(placed: Sequence[Placed], page_tokens: int, first_page: int, stop_page: int) -> dict[int, bytes]:
    """page -> extra (the module docstring's encoding) for the pages first_page..stop_page-1
    that hold media positions."""
    spans: dict[int, list[bytes]] = {}
    low, high = first_page * page_tokens, stop_page * page_tokens
    for item in placed:
        segment = item.segment
        if not isinstance(segment, MediaSegment) or item.end <= low or item.offset >= high:
            continue
        name = segment.modality.encode()
        for page in range(max(item.offset, low) // page_tokens, (min(item.end, high) - 1) // page_tokens + 1):
            begin = max(item.offset, page * page_tokens)
            stop = min(item.end, (page + 1) * page_tokens)
            head = struct.pack("<III", begin - page * page_tokens, stop - page * page_tokens, begin - item.offset)
            spans.setdefault(page, []).append(head + segment.content + struct.pack("<I", len(name)) + name)
    return {page: content_hash(b"".join(parts)) for page, parts in spans.items()}


def chain_keys(
    ids: Sequence[int],
    placed: Sequence[Placed],
    page_tokens: int,
    *,
    first_page: int = 0,
    parent: bytes | str | None = None,
) -> list[str]:
    """The keys of the full pages first_page.. of a sequence whose position ids are `ids` (all of
    them, from position 0) and whose segments are `placed`; `parent`: page first_page-1's key
    (None: the chain's root, hashing.ROOT unless the caller roots it elsewhere)."""
    stop_page = len(ids) // page_tokens
    if first_page >= stop_page:
        return []
    extras = page_extras(placed, page_tokens, first_page, stop_page)
    relative = {page - first_page: extra for page, extra in extras.items()}
    try:
        return page_hashes(ids[first_page * page_tokens :], page_tokens, parent=parent, extras=relative)
    except HashError as error:
        raise PrefixError(str(error)) from None


def sequence_keys(segments: Sequence[Segment], page_tokens: int, *, placeholder: int = 0, root: bytes = ROOT) -> list[str]:
    """The page keys of a whole sequence, computed from scratch (what `History` keeps up to date
    as the sequence grows and is cut)."""
    return chain_keys(token_ids(segments, placeholder), place(segments), page_tokens, parent=root)
