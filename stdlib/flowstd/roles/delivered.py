"""What the user received of an interrupted turn, in tokens, for the roles that generate on a
session's KV pages (docs/stdlib.md, "Barge-in"; docs/runtime.md, "Interrupting a call").

A role remembers each turn in its session's state (`remember`: the call, the history it was
given and the ids it generated, appended as they come). When a call interrupted that turn,
`ctx.interrupted` says how many frames of each streamed field its caller took; `delivered`
turns that into the generated ids the user received: `generated_tokens` frames are ids (one
frame, one id), and `text_delta` frames are what flowstd's stream detokenizer made of them (a
frame per id that completes text; lib/tokenizer.flow), so the k-th delta ends at the id that
completed it. `rolled_back` then gives the next turn's history with the interrupted reply as
those exact ids: the client's next request repeats the text it received, which the chat
template tokenizes again (possibly into other ids), so the run of ids that reads as that text
right after the interrupted turn's history is replaced by the ids delivered. The next turn's
history then starts with the interrupted turn's history and the delivered ids, whose full pages
the pool holds (the engine commits what a cancelled generation had made), and reuses exactly
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TURN_KEY = "flowstd_turn"  # where a role keeps its last turn in the session state of its KVCache global


def remember(state: Any, call_id: Any, history: list[int], generated: list[int]) -> None:
    """Keep this turn (`generated` is the list the role appends each new id to)."""
    if isinstance(state, dict):
        state[TURN_KEY] = {"call": call_id, "history": list(history), "generated": generated}


def delivered(tokenizer: Any, generated: list[int], frames: Mapping[str, int]) -> list[int]:
    """The ids of `generated` whose frames the caller took (`frames`: ctx.interrupted.frames)."""
    if "generated_tokens" in frames:
        return list(generated[: frames["generated_tokens"]])
    wanted = frames.get("text_delta", 0)
    if not wanted:
        return []
    stream = tokenizer.stream_detokenizer()
    deltas = 0
    for index, token_id in enumerate(generated):
        text = stream.extend([token_id]) if token_id != tokenizer.eos_id else stream.finish()
        if text:
            deltas += 1
            if deltas == wanted:
                return list(generated[: index + 1])
    return list(generated)


def rolled_back(tokenizer: Any, state: Any, interrupted: Any, history: list[int]) -> tuple[list[int], int | None]:
    """This turn's history, its interrupted predecessor's reply replaced by the ids the user
    received; and how many ids of it are that turn's history and delivered reply (None where
    this turn follows no interrupted turn of this role, or does not continue it)."""
    turn = state.get(TURN_KEY) if isinstance(state, dict) else None
    if interrupted is None or turn is None or turn["call"] != interrupted.call_id:
        return history, None
    before = turn["history"]
    if history[: len(before)] != before:
        return history, None
    kept = delivered(tokenizer, turn["generated"], interrupted.frames)
    text = tokenizer.decode(kept)
    rest = history[len(before) :]
    for length in range(len(rest) + 1):  # the shortest run of ids that reads as the text delivered
        if tokenizer.decode(rest[:length]) == text:
            return before + kept + rest[length:], len(before) + len(kept)
    return history, None


class SpokenTurns:
    """The voice thinker's turns, per session (its replica holds them: `lb session`), for
    rolling back an interrupted one to what the user received: the history the turn's reply
    follows, its ids, and which of them completed a piece of `reply` text. Its talker speaks
    FRAMES_PER_TOKEN frames a token, VOCODER_BLOCK_FRAMES a chunk, so each `speech` chunk the
    caller took is `tokens_per_chunk` ids heard; a caller that took no speech read the text."""

    def __init__(self, tokens_per_chunk: int, most: int = 256):
        self.tokens_per_chunk, self.most = tokens_per_chunk, most
        self.turns: dict[str, dict] = {}

    def step(self, session: str, interrupted: Any, reply_field: str = "reply") -> int | None:
        """Where this session's history is cut for the next turn (None: kept whole)."""
        turn = self.turns.get(session)
        if interrupted is None or turn is None or turn["call"] != interrupted.call_id or turn["history"] is None:
            return None
        frames = interrupted.frames
        if frames.get("speech"):
            heard = frames["speech"] * self.tokens_per_chunk
        else:
            texts = [i for i, made_text in enumerate(turn["texts"]) if made_text]
            wanted = frames.get(reply_field, 0)
            heard = texts[wanted - 1] + 1 if 0 < wanted <= len(texts) else (len(turn["texts"]) if wanted else 0)
        return turn["history"] + min(heard, len(turn["texts"]))

    def start(self, session: str, call_id: Any) -> dict:
        """A new turn's record: `history` is set once planned, `texts` grows a bool per id."""
        self.turns.pop(session, None)
        while len(self.turns) >= self.most:
            self.turns.pop(next(iter(self.turns)))
        turn = self.turns[session] = {"call": call_id, "history": None, "texts": []}
        return turn
