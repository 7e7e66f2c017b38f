"""flowstd.roles.delivered: the ids a user received of an interrupted turn, from the frames its
caller took (docs/stdlib.md, "Barge-in"), and the next turn's history rolled back to them."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers", reason="flowstd's tokenizer needs `tokenizers`: pip install 'flowc[models]'")

from flowrt.control.interrupts import Interrupted  # noqa: E402
from flowstd.roles.delivered import TURN_KEY, delivered, remember, rolled_back  # noqa: E402
from flowstd.tokenizer import Tokenizer  # noqa: E402

TEXT = "café 🙂 ok"  # é: two byte tokens, 🙂: four: a text delta comes only once a character is whole


def test_text_deltas_map_to_the_ids_that_completed_them():
    tokenizer = Tokenizer.load()
    ids = tokenizer.encode(TEXT)
    stream = tokenizer.stream_detokenizer()
    deltas = [(index, text) for index, token in enumerate(ids) if (text := stream.extend([token]))]
    assert len(deltas) < len(ids)  # some ids complete no character
    for taken, (index, _) in enumerate(deltas, start=1):
        kept = delivered(tokenizer, ids, {"text_delta": taken})
        assert kept == ids[: index + 1]
        assert tokenizer.decode(kept) == "".join(text for _, text in deltas[:taken])
    assert delivered(tokenizer, ids, {"generated_tokens": 3}) == ids[:3]
    assert delivered(tokenizer, ids, {}) == []


def test_the_next_history_takes_the_delivered_ids_in_place_of_the_text_tokenized_again():
    tokenizer = Tokenizer.load()
    before = tokenizer.encode("<prompt>")
    generated = tokenizer.encode(TEXT)
    state: dict = {}
    remember(state, 7, before, generated)
    assert state[TURN_KEY]["call"] == 7
    heard = delivered(tokenizer, generated, {"text_delta": 4})
    again = tokenizer.encode(tokenizer.decode(heard))  # the client's copy of the text, tokenized anew
    question = tokenizer.encode(" and then?")
    history, kept = rolled_back(tokenizer, state, Interrupted(7, "chat", {"text_delta": 4}), before + again + question)
    assert history == before + heard + question and kept == len(before) + len(heard)
    # another call's record, no record, or a history that does not continue the turn: as it is
    other = before + again + question
    assert rolled_back(tokenizer, state, Interrupted(8, "chat", {"text_delta": 4}), other) == (other, None)
    assert rolled_back(tokenizer, state, None, other) == (other, None)
    assert rolled_back(tokenizer, state, Interrupted(7, "chat", {"text_delta": 4}), question) == (question, None)
