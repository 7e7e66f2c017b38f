"""flowstd's byte-level BPE tokenizer: the Python API the text roles (flowstd.roles.tokenizer) use.

    from flowstd.tokenizer import Tokenizer

    tokenizer = Tokenizer.load()                      # the shipped vocabulary, loaded once
    ids = tokenizer.encode("a red cat")               # decode(encode(s)) == s for any string
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    stream = tokenizer.stream_detokenizer()           # push ids, get whole-character deltas

Importing this package needs neither `tokenizers` nor torch; loading the tokenizer needs
`tokenizers` (`pip install 'flowc[models]'`) and says so when it is missing. The vocabulary is
trained by `python -m flowstd.tokenizer.train` (docs/stdlib.md).
"""

from flowstd.tokenizer.chat import ChatPrompt, ChatTemplateError, MediaPlaceholder
from flowstd.tokenizer.core import SPECIAL_TOKENS, Tokenizer, TokenizerError, TokenizerUnavailable
from flowstd.tokenizer.stream import StreamDetokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "ChatPrompt",
    "ChatTemplateError",
    "MediaPlaceholder",
    "StreamDetokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerUnavailable",
]
