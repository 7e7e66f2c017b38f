"""The streaming detokenizer: token ids in one at a time, text deltas out, never half a character.

A byte-level token may end in the middle of a multi-byte UTF-8 character (an emoji is often
four byte tokens). Each id's bytes go through Python's incremental UTF-8 decoder, which emits
every complete character at once and holds back only a *valid, incomplete* prefix; bytes that
can never start a character are emitted as U+FFFD straight away, exactly where `decode` puts
one. So, for any ids:

    "".join(push(i) for i in ids) + finish() == tokenizer.decode(ids)

and every delta is a whole number of characters. `finish()` ends the stream: a prefix still
held (the ids stopped mid-character) becomes one U+FFFD, as in `decode`, and the detokenizer is
ready for a new stream. `pending` is the held prefix; a new detokenizer built with
`pending=` goes on where another stopped (how the role keeps its state between activations).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flowstd.tokenizer.core import TokenizerError

if TYPE_CHECKING:
    from flowstd.tokenizer.core import Tokenizer

_UTF8_DECODER = codecs.getincrementaldecoder("utf-8")
MAX_PENDING = 3  # the longest incomplete UTF-8 prefix: 3 bytes of a 4-byte character


class StreamDetokenizer:
    """Ids in (`push`, `extend`), whole-character text deltas out (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True, pending: bytes = b""):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._table = tokenizer.token_bytes_table
        self._skipped = tokenizer.special_id_set if skip_special_tokens else frozenset()
        self._decoder = _UTF8_DECODER(errors="replace")
        self.tokens = 0  # ids pushed since the stream began
        if pending:
            self._resume(pending)

    def _resume(self, pending: Any) -> None:
        if not isinstance(pending, (bytes, bytearray)) or len(pending) > MAX_PENDING:
            raise TokenizerError(f"pending must be the bytes of an incomplete character (at most {MAX_PENDING}), not {pending!r}")
        if self._decoder.decode(bytes(pending)) or self.pending != bytes(pending):
            raise TokenizerError(f"pending {bytes(pending)!r} is not the start of a UTF-8 character")

    @property
    def pending(self) -> bytes:
        """The bytes held back: the start of a character whose remaining bytes have not come."""
        return self._decoder.getstate()[0]

    def push(self, token_id: int) -> str:
        """Feed one id; the text it completes ("" while a character is still incomplete)."""
        token_id = self.tokenizer.check_id(token_id)
        self.tokens += 1
        if token_id in self._skipped:
            return ""
        return self._decoder.decode(self._table[token_id])

    def extend(self, ids: Iterable[int]) -> str:
        """Feed several ids; the text they complete, as one delta."""
        table, skipped = self._table, self._skipped
        checked = self.tokenizer.check_ids(ids)
        self.tokens += len(checked)
        return self._decoder.decode(b"".join(table[token_id] for token_id in checked if token_id not in skipped))

    def finish(self) -> str:
        """End the stream: a held prefix becomes U+FFFD (as `decode` reads it); start afresh."""
        tail = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        self.tokens = 0
        return tail
