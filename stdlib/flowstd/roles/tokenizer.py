"""The roles of lib/tokenizer.flow, on flowstd's byte-level BPE tokenizer (flowstd.tokenizer).

    ChatTokenizer.tokenize       messages -> chat_tokens (the chat template's ids), chat_media
    TextTokenizer.tokenize       text -> text_tokens
    StreamDetokenizer.detokenize generated_tokens (one frame of ids) -> text_delta

Each loads the shared tokenizer in `setup`, so a missing `tokenizers` package stops the runtime
from opening with a message naming `pip install 'flowc[models]'` rather than failing calls.

The detokenizer runs once per frame of a token stream (`lb session`: one frame at a time, in
production order) and keeps the stream's unfinished character, at most 3 bytes, in the session
global `detokenizer_state`, tagged with the call it belongs to: a session runs one call at a
time, so a new call id means a new stream. A frame holding `<|eos|>` ends the stream there (what
is held becomes U+FFFD, as `decode` reads it). So the deltas of one call, joined, are
`decode(ids)` of its ids, skipping special tokens, whenever the ids end with `<|eos|>` or on a
whole character; a frame that completes no character yields nothing (no empty deltas).
"""

from __future__ import annotations

from typing import Any

from flowstd.tokenizer import Tokenizer, TokenizerError

STATE = "detokenizer_state"  # the global lib/tokenizer.flow declares for the detokenizer


class ChatTokenizer:
    async def setup(self, ctx) -> None:
        Tokenizer.load()

    async def tokenize(self, ctx, messages: Any) -> dict[str, Any]:
        prompt = Tokenizer.load().apply_chat_template(messages)
        return {"chat_tokens": prompt.ids, "chat_media": [placeholder.as_json() for placeholder in prompt.media]}


class TextTokenizer:
    async def setup(self, ctx) -> None:
        Tokenizer.load()

    async def tokenize(self, ctx, text: Any) -> dict[str, Any]:
        return {"text_tokens": Tokenizer.load().encode(text)}


class StreamDetokenizer:
    async def setup(self, ctx) -> None:
        Tokenizer.load()

    async def detokenize(self, ctx, generated_tokens: Any) -> dict[str, Any] | None:
        tokenizer = Tokenizer.load()
        ids = _frame_ids(tokenizer, generated_tokens)
        state = _state(ctx)
        pending = state.get("pending", b"") if state.get("call") == ctx.call_id else b""
        stream = tokenizer.stream_detokenizer(pending=pending)
        pieces = []
        start = 0
        for index, token_id in enumerate(ids):
            if token_id == tokenizer.eos_id:  # the stream ends here: flush what is held
                pieces.append(stream.extend(ids[start:index]))
                pieces.append(stream.finish())
                start = index + 1
        pieces.append(stream.extend(ids[start:]))
        state["call"], state["pending"] = ctx.call_id, stream.pending
        delta = "".join(pieces)
        return {"text_delta": delta} if delta else None


def _frame_ids(tokenizer: Tokenizer, value: Any) -> list[int]:
    """A frame's ids: one id, or a list of them (a step that produced several tokens)."""
    if isinstance(value, (list, tuple)):
        return tokenizer.check_ids(value, "generated_tokens")
    if isinstance(value, int) and not isinstance(value, bool):
        return [tokenizer.check_id(value, "generated_tokens")]
    if hasattr(value, "tolist"):  # a numpy array or torch tensor of ids
        listed = value.tolist()
        return tokenizer.check_ids(listed if isinstance(listed, list) else [listed], "generated_tokens")
    raise TokenizerError(f"generated_tokens must be a token id or a list of them, not {type(value).__name__}")


def _state(ctx) -> dict:
    state = ctx.globals.get(STATE)
    if state is None:
        raise TokenizerError(
            f"the stream detokenizer keeps its state in the session global `{STATE}`: "
            f"its role must declare `uses {STATE}` (lib/tokenizer.flow does)"
        )
    return state
