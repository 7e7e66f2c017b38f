"""The text embedder for retrieval-style use: token ids -> one L2-normalised vector, so the
cosine similarity of two texts is the dot product of their vectors. Token and learned position
embeddings, pre-norm transformer blocks, the mean over the tokens (padding masked out), an
optional projection, then normalisation. It takes ids, not text: a role pairs it with a
tokenizer whose vocabulary fits in `vocab_size`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flowstd.models.blocks import TransformerEncoder
from flowstd.models.common import ModelConfig, ModelInputError, SeededModel, Shape, as_tensor, shape_text


@dataclass(frozen=True, kw_only=True)
class TextEmbedderConfig(ModelConfig):
    vocab_size: int = 8192  # ids must be in [0, vocab_size)
    max_tokens: int = 512  # the longest sequence (learned positions)
    hidden: int = 128
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    output_dim: int | None = None  # a projection to this width before normalising; None: `hidden`

    def __post_init__(self) -> None:
        super().__post_init__()
        self._require_positive("vocab_size", "max_tokens", "hidden", "depth", "heads", "mlp_ratio")
        self._require_divisible("hidden", "heads")
        if self.output_dim is not None:
            self._require_positive("output_dim")

    @property
    def output_width(self) -> int:
        return self.hidden if self.output_dim is None else self.output_dim


class TextEmbedder(SeededModel):
    """token ids (tokens,) -> (output_width,) float32 of unit L2 norm."""

    model_name = "text_embedder"
    config_type = TextEmbedderConfig

    def __init__(self, config: TextEmbedderConfig | None = None) -> None:
        super().__init__(config)
        config = self.config
        with self.seeded_weights():
            self.tokens = nn.Embedding(config.vocab_size, config.hidden)
            self.positions = nn.Parameter(torch.zeros(config.max_tokens, config.hidden))
            self.encoder = TransformerEncoder(config.hidden, config.depth, config.heads, config.mlp_ratio)
            self.projection = None if config.output_dim is None else nn.Linear(config.hidden, config.output_dim)

    def token_ids(self, ids: Any) -> torch.Tensor:
        """int64 (tokens,) from a list of ints or an integer array, checked against the config."""
        config = self.config
        expected = f"a non-empty list or 1-D integer array of at most {config.max_tokens} token ids in [0, {config.vocab_size})"
        if isinstance(ids, (list, tuple)):
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ModelInputError(f"the text embedder takes {expected}; the list holds a non-int")
            ids = torch.tensor(ids, dtype=torch.int64)
        ids = as_tensor(ids, "token ids", expected)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool or ids.dim() != 1:
            raise ModelInputError(f"the text embedder takes {expected}; got {shape_text(ids)}")
        if not 0 < ids.shape[0] <= config.max_tokens:
            raise ModelInputError(f"the text embedder takes {expected}; got {ids.shape[0]} ids")
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= config.vocab_size:
            raise ModelInputError(f"token ids must be in [0, {config.vocab_size}); got ids from {low} to {high}")
        return ids.to(self.device, torch.int64)

    @torch.inference_mode()
    def embed(self, ids: Any) -> torch.Tensor:
        """(output_width,) unit vector of one sequence of token ids."""
        ids = self.token_ids(ids)
        return self(ids[None], torch.ones_like(ids, dtype=torch.bool)[None])[0]

    @torch.inference_mode()
    def embed_batch(self, sequences: Sequence[Any]) -> torch.Tensor:
        """(len(sequences), output_width): sequences of any lengths, padded and masked (each row
        is its sequence's `embed`, up to the rounding of batched arithmetic)."""
        if isinstance(sequences, (torch.Tensor, str, bytes)) or not isinstance(sequences, Sequence) or not sequences:
            raise ModelInputError("embed_batch takes a non-empty list of token id sequences")
        rows = [self.token_ids(ids) for ids in sequences]
        longest = max(row.shape[0] for row in rows)
        ids = torch.zeros(len(rows), longest, dtype=torch.int64, device=self.device)
        mask = torch.zeros(len(rows), longest, dtype=torch.bool, device=self.device)
        for index, row in enumerate(rows):
            ids[index, : row.shape[0]] = row
            mask[index, : row.shape[0]] = True
        return self(ids, mask)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids (batch, tokens) int64, mask (batch, tokens) bool (True: a real token) -> (batch, output_width)."""
        x = self.tokens(ids) + self.positions[: ids.shape[1]]
        x = self.encoder(x, mask)
        weights = mask.to(x.dtype)[:, :, None]
        pooled = (x * weights).sum(dim=1) / weights.sum(dim=1)
        if self.projection is not None:
            pooled = self.projection(pooled)
        return F.normalize(pooled, dim=-1)

    def _shapes(self) -> tuple[dict[str, str], dict[str, Shape], dict[str, str]]:
        config = self.config
        inputs = {"ids": f"int (tokens,), 1 <= tokens <= {config.max_tokens}, ids in [0, {config.vocab_size})"}
        return inputs, {"embedding": (config.output_width,)}, {}
