"""The role of lib/embedding.flow: text to one vector on a real tiny model (docs/stdlib.md).

    Embedder.embed   embed_text -> embedding (the TextEmbedder's L2-normalised vector, a 1-D
                     float32 tensor) and embed_usage ({"prompt_tokens": the text's token count})

The text is tokenized with flowstd's tokenizer and cut to the model's `max_tokens` (512), as
embedding APIs truncate; the model comes from its seed (docs/models.md), so every replica builds
the same one and a text's vector is the same wherever it is computed. Outputs are untrained:
similar texts are not close, but every step of serving is real and deterministic.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from flowrt.errors import BadInput


class EmbeddingInputError(BadInput):
    """A text the embedder cannot take: the message names the fix."""


class Embedder:
    async def setup(self, ctx) -> None:
        self.model  # noqa: B018 - built now, not on the first call
        self.tokenizer  # noqa: B018

    @cached_property
    def model(self) -> Any:
        from flowstd.models import TextEmbedder, TextEmbedderConfig

        return TextEmbedder(TextEmbedderConfig(vocab_size=max(self.tokenizer.vocab_size, 1), seed=31)).eval()

    @cached_property
    def tokenizer(self) -> Any:
        from flowstd.tokenizer import Tokenizer

        return Tokenizer.load()

    def embed(self, ctx, embed_text):  # plain: the forward pass runs on the replica's thread
        text = embed_text.get("input") if isinstance(embed_text, dict) else embed_text  # (an OpenAI embeddings body)
        if not isinstance(text, str) or not text:
            raise EmbeddingInputError(f"the text to embed must be a non-empty string (`input`), not {type(text).__name__}")
        ids = self.tokenizer.encode(text)[: self.model.config.max_tokens] or [0]
        return {"embedding": self.model.embed(ids).clone(), "embed_usage": {"prompt_tokens": len(ids)}}
