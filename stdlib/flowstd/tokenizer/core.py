"""The byte-level BPE tokenizer: loading the shipped vocabulary, encoding text, decoding ids.

Encoding runs Hugging Face `tokenizers` (Rust) on the trained `tokenizer.json` shipped beside
this module. Decoding does not need it: every id maps to the bytes it stands for (a learned
token to its UTF-8 bytes through GPT-2's byte-to-character table, a special token to its text),
and a sequence decodes to those bytes joined and read as UTF-8, each malformed sequence read as
one U+FFFD (Python's `errors="replace"`, which substitutes maximal subparts exactly as Rust's
`from_utf8_lossy` that `tokenizers` uses). The streaming detokenizer (`stream.py`) reads the
same table, so its deltas add up to `decode` of the same ids.

Plain text never becomes a special token: `encode("<|user|>")` spells the characters out, so a
user's message cannot forge the chat template's markers.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from flowrt.errors import BadInput, FlowrtError

if TYPE_CHECKING:
    from flowstd.tokenizer.chat import ChatPrompt
    from flowstd.tokenizer.stream import StreamDetokenizer

# The chat template's markers, in id order: they take ids 0..7, before the 256 byte tokens.
SPECIAL_TOKENS = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|image|>",
    "<|audio|>",
)
INSTALL_HINT = "pip install 'flowc[models]'"
SHOWN_CHARACTERS = 40  # of an offending string quoted in an error message


class TokenizerError(BadInput):
    """Input the tokenizer cannot take (not a string, a lone surrogate, an id out of range, a
    malformed chat message); the message names the place and what fits. A `BadInput`: raised
    in a role, the call's answer is a 400 (the caller's text is what to fix)."""


class TokenizerUnavailable(FlowrtError, RuntimeError):
    """The tokenizer cannot be loaded: `tokenizers` is not installed, or the vocabulary file is
    missing or not a flowstd tokenizer."""


def default_path() -> Path:
    """The trained vocabulary shipped with flowstd (package data, so a wheel carries it)."""
    return Path(str(resources.files("flowstd.tokenizer").joinpath("tokenizer.json")))


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character: the byte-level alphabet the BPE
    vocabulary is spelled in (printable Latin-1 stands for itself, the rest is shifted past 255)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


_CHARACTER_TO_BYTE = {character: byte for byte, character in bytes_to_unicode().items()}


def require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise TokenizerUnavailable(
            f"the flowstd tokenizer needs Hugging Face `tokenizers`, which is not installed: {INSTALL_HINT}"
        ) from None
    return tokenizers


def _shown(text: str) -> str:
    return repr(text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS] + "...")


def check_text(text: Any, what: str = "the text", error_class: type[TokenizerError] | None = None) -> bytes:
    """`text` as UTF-8, or a TokenizerError (or `error_class`) saying why it is not encodable text."""
    error_class = error_class or TokenizerError
    if not isinstance(text, str):
        raise error_class(f"{what} must be a string, not {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise error_class(
            f"{what} holds a lone surrogate U+{code:04X} at character {error.start} of {_shown(text)}; "
            "only well-formed Unicode can be encoded (decode bytes with errors='replace' first)"
        ) from None


class Tokenizer:
    """A byte-level BPE tokenizer: `Tokenizer.load()` gives the shipped one (loaded once).

    `encode(text)` -> ids, `decode(ids)` -> text, `apply_chat_template(messages)` -> a
    `ChatPrompt`, `stream_detokenizer()` -> a `StreamDetokenizer`. The special tokens' ids are
    attributes (`bos_id`, `eos_id`, ..., `image_id`, `audio_id`) and `special_ids` maps each
    special token's text to its id.
    """

    def __init__(self, backend: Any, source: str = "<memory>"):
        self._backend = backend
        self.source = source
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        special = {}
        for token in SPECIAL_TOKENS:
            token_id = backend.token_to_id(token)
            if token_id is None:
                raise TokenizerUnavailable(f"{source} is not a flowstd tokenizer: it has no special token {token}")
            special[token] = token_id
        self.special_ids: Mapping[str, int] = MappingProxyType(special)
        self.pad_id, self.bos_id, self.eos_id = special["<|pad|>"], special["<|bos|>"], special["<|eos|>"]
        self.system_id, self.user_id, self.assistant_id = special["<|system|>"], special["<|user|>"], special["<|assistant|>"]
        self.image_id, self.audio_id = special["<|image|>"], special["<|audio|>"]
        self.special_id_set = frozenset(special.values())
        self.token_bytes_table: tuple[bytes, ...] = self._token_bytes(backend, source)
        # the chat template and the roles must never see a user's "<|user|>" as the marker
        backend.encode_special_tokens = True

    @classmethod
    def load(cls, path: str | Path | None = None) -> Tokenizer:
        """The tokenizer of `path` (default: the one shipped with flowstd), loaded once per path
        per process; later calls return the same object."""
        return _load(str(Path(path).resolve()) if path is not None else str(default_path()))

    @classmethod
    def from_json(cls, text: str, source: str = "<memory>") -> Tokenizer:
        """A tokenizer from the text of a `tokenizer.json` (not cached)."""
        tokenizers = require_tokenizers()
        try:
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as error:  # noqa: BLE001 - the Rust parser raises plain Exception
            raise TokenizerUnavailable(f"{source} is not a tokenizer file tokenizers can read: {error}") from None
        return cls(backend, source)

    @staticmethod
    def _token_bytes(backend: Any, source: str) -> tuple[bytes, ...]:
        table = []
        for token_id in range(backend.get_vocab_size(with_added_tokens=True)):
            token = backend.id_to_token(token_id)
            if token is None:
                raise TokenizerUnavailable(f"{source} is not a flowstd tokenizer: id {token_id} has no token")
            if token in SPECIAL_TOKENS:
                table.append(token.encode("utf-8"))
                continue
            try:
                table.append(bytes(_CHARACTER_TO_BYTE[character] for character in token))
            except KeyError:
                raise TokenizerUnavailable(
                    f"{source} is not a byte-level tokenizer: token {token_id} ({token!r}) is outside the byte alphabet"
                ) from None
        return tuple(table)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, source={self.source!r})"

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, no special tokens added or recognised; `decode` gives `text` back."""
        check_text(text)
        if not text:
            return []
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """`encode` of each text, run in parallel by the Rust side."""
        texts = list(texts)
        for index, text in enumerate(texts):
            check_text(text, f"text {index}")
        return [encoding.ids for encoding in self._backend.encode_batch(texts, add_special_tokens=False)]

    def check_ids(self, ids: Iterable[Any], what: str = "token ids") -> list[int]:
        """`ids` as a list of ints in the vocabulary, or a TokenizerError naming the first bad one."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TokenizerError(f"{what} must be a list of integers, not {type(ids).__name__}")
        checked = []
        for index, value in enumerate(ids):
            checked.append(self.check_id(value, f"{what}[{index}]"))
        return checked

    def check_id(self, value: Any, what: str = "token id") -> int:
        if isinstance(value, bool):
            raise TokenizerError(f"{what} must be an integer, not a boolean")
        try:
            token_id = operator.index(value)  # ints, numpy and torch integers; not floats
        except TypeError:
            raise TokenizerError(f"{what} must be an integer, not {type(value).__name__}") from None
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"{what} is {token_id}, outside the vocabulary (0 to {self.vocab_size - 1})")
        return token_id

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (a special token: its text)."""
        return self.token_bytes_table[self.check_id(token_id)]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """The text of `ids`. Special tokens are left out unless `skip_special_tokens=False`;
        bytes that are not valid UTF-8 read as U+FFFD, one per malformed sequence."""
        table, skipped = self.token_bytes_table, self.special_id_set if skip_special_tokens else frozenset()
        data = b"".join(table[token_id] for token_id in self.check_ids(ids) if token_id not in skipped)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Any, *, add_generation_prompt: bool = True) -> ChatPrompt:
        """OpenAI-style chat messages as ids, with where each image and audio placeholder sits."""
        from flowstd.tokenizer.chat import apply_chat_template

        return apply_chat_template(self, messages, add_generation_prompt=add_generation_prompt)

    def stream_detokenizer(self, *, skip_special_tokens: bool = True, pending: bytes = b"") -> StreamDetokenizer:
        """A detokenizer fed one id at a time whose text deltas are always whole characters;
        `pending` (another one's `pending`) goes on where that one stopped."""
        from flowstd.tokenizer.stream import StreamDetokenizer

        return StreamDetokenizer(self, skip_special_tokens=skip_special_tokens, pending=pending)


@functools.lru_cache(maxsize=8)
def _load(path: str) -> Tokenizer:
    tokenizers = require_tokenizers()
    if not Path(path).is_file():
        raise TokenizerUnavailable(f"no tokenizer file at {path}: regenerate it with `python -m flowstd.tokenizer.train`")
    try:
        backend = tokenizers.Tokenizer.from_file(path)
    except Exception as error:  # noqa: BLE001 - the Rust parser raises plain Exception
        raise TokenizerUnavailable(f"{path} is not a tokenizer file tokenizers can read: {error}") from None
    return Tokenizer(backend, path)
