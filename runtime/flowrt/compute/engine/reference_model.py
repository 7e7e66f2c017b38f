"""The reference engine's model: a tiny decoder-only transformer in PyTorch, and its dense forward,
the specification the paged engine (`reference.ReferenceEngine`) is tested against.

Llama-shaped: token embedding, then per layer RMSNorm -> attention (rotary position embedding,
grouped-query: `num_heads` query heads share `num_kv_heads` K/V heads) -> residual, RMSNorm ->
SwiGLU MLP -> residual; a final RMSNorm gives the hidden states, a linear head the logits.
Weights come from `seed` (a torch.Generator, no download), so every process that builds one
config gets the same model. Computation is float32; K/V are rounded to `kv_dtype` where they are
stored (the dense forward rounds them the same way, so paged and dense agree at any dtype).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import EngineError
from flowrt.params.layout import ITEM_BYTES, TORCH_DTYPES


def _torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError("the reference engine needs torch: pip install 'flowc[torch]'") from error
    return torch


@dataclass(frozen=True)
class ReferenceConfig:
    """The reference model's sizes; the defaults run a step in milliseconds on a CPU."""

    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = 0
    kv_dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        for what in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            value = getattr(self, what)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise EngineError(f"ReferenceConfig: {what} must be a whole number >= 1, not {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise EngineError(
                f"ReferenceConfig: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads} "
                f"(each K/V head serves a whole group of query heads)"
            )
        if self.head_dim % 2:
            raise EngineError(f"ReferenceConfig: head_dim must be even (rotary embedding rotates pairs), not {self.head_dim}")
        if self.kv_dtype not in ITEM_BYTES or self.kv_dtype in ("int8",):
            raise EngineError(
                f"ReferenceConfig: kv_dtype {self.kv_dtype!r} is not one of float32, bfloat16, float16, float8_e4m3"
            )


@dataclass
class DenseOutput:
    """A dense forward's result: logits (n, vocab) and final hidden states (n, hidden)."""

    logits: Any
    hidden: Any


@dataclass
class _Layer:
    attn_norm: Any
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    mlp_norm: Any
    w_gate: Any
    w_up: Any
    w_down: Any


class ReferenceModel:
    """The weights and the per-layer math, shared by the dense and the paged forward."""

    def __init__(self, config: ReferenceConfig):
        torch = _torch()
        self.config = config
        self.device = torch.device(config.device)
        self.kv_dtype = getattr(torch, TORCH_DTYPES.get(config.kv_dtype, config.kv_dtype))
        generator = torch.Generator().manual_seed(config.seed)
        c = config

        def normal(*shape: int, std: float) -> Any:
            return (torch.randn(*shape, generator=generator) * std).to(self.device)

        def norm_weight() -> Any:
            return (1.0 + 0.1 * torch.randn(c.hidden_size, generator=generator)).to(self.device)

        self.embedding = normal(c.vocab_size, c.hidden_size, std=1.0)
        self.layers = [
            _Layer(
                attn_norm=norm_weight(),
                wq=normal(c.hidden_size, c.num_heads * c.head_dim, std=c.hidden_size**-0.5),
                wk=normal(c.hidden_size, c.num_kv_heads * c.head_dim, std=c.hidden_size**-0.5),
                wv=normal(c.hidden_size, c.num_kv_heads * c.head_dim, std=c.hidden_size**-0.5),
                wo=normal(c.num_heads * c.head_dim, c.hidden_size, std=(c.num_heads * c.head_dim) ** -0.5),
                mlp_norm=norm_weight(),
                w_gate=normal(c.hidden_size, c.intermediate_size, std=c.hidden_size**-0.5),
                w_up=normal(c.hidden_size, c.intermediate_size, std=c.hidden_size**-0.5),
                w_down=normal(c.intermediate_size, c.hidden_size, std=c.intermediate_size**-0.5),
            )
            for _ in range(c.num_layers)
        ]
        self.final_norm = norm_weight()
        # logits with a spread of a few units: greedy choices are far from ties
        self.lm_head = normal(c.hidden_size, c.vocab_size, std=3.0 * c.hidden_size**-0.5)
        half = c.head_dim // 2
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))

    # ── the pieces ──

    def embed(self, token_ids: Any) -> Any:
        """Input embeddings (n, hidden) of int64 token ids (checked by the caller)."""
        return self.embedding.index_select(0, token_ids.to(self.device))

    def rope_tables(self, positions: Any) -> tuple[Any, Any]:
        """cos and sin (n, 1, head_dim/2) of the rotation at each position (float64 angles: exact
        for long positions, then float32)."""
        angles = positions.to("cpu", _torch().float64)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
        return cos.to(self.device), sin.to(self.device)

    @staticmethod
    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
        return _torch().cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    def rms_norm(self, x: Any, weight: Any) -> Any:
        return x * _torch().rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_eps) * weight

    def qkv(self, layer: int, x: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        """Query (n, heads, d), and key and value (n, kv_heads, d) rounded to the KV dtype."""
        c, weights = self.config, self.layers[layer]
        h = self.rms_norm(x, weights.attn_norm)
        q = (h @ weights.wq).view(-1, c.num_heads, c.head_dim)
        k = (h @ weights.wk).view(-1, c.num_kv_heads, c.head_dim)
        v = (h @ weights.wv).view(-1, c.num_kv_heads, c.head_dim)
        return self.rotate(q, cos, sin), self.stored(self.rotate(k, cos, sin)), self.stored(v)

    def stored(self, kv: Any) -> Any:
        """K or V as the cache holds it: rounded to the KV dtype (a no-op at float32)."""
        return kv if self.kv_dtype == kv.dtype else kv.to(self.kv_dtype).to(kv.dtype)

    def finish_layer(self, layer: int, x: Any, attention: Any) -> Any:
        """The rest of a layer after attention (n, heads, d): output projection, residual, MLP."""
        torch, weights = _torch(), self.layers[layer]
        x = x + attention.reshape(x.shape[0], -1) @ weights.wo
        h = self.rms_norm(x, weights.mlp_norm)
        return x + (torch.nn.functional.silu(h @ weights.w_gate) * (h @ weights.w_up)) @ weights.w_down

    def final_hidden(self, x: Any) -> Any:
        return self.rms_norm(x, self.final_norm)

    def logits(self, hidden: Any) -> Any:
        return hidden @ self.lm_head

    # ── the specification ──

    def dense_forward(
        self,
        token_ids: Sequence[int] | Any = None,
        embeddings: Any = None,
        *,
        positions: Sequence[int] | Any = None,
        full_attention_from: int | None = None,
    ) -> DenseOutput:
        """The whole sequence at once, no cache: what the paged engine must reproduce.

        Token i attends to tokens 0..i; with `full_attention_from=b`, tokens b.. attend to every
        token of the sequence (0: fully bidirectional; a cached causal context followed by
        bidirectional new tokens, as a denoiser's step over cached text)."""
        torch = _torch()
        if (token_ids is None) == (embeddings is None):
            raise EngineError("dense_forward(): give token_ids or embeddings, exactly one of the two")
        if token_ids is not None:
            ids = torch.as_tensor(token_ids, dtype=torch.int64)
            x = self.embed(ids)
        else:
            x = embeddings.to(self.device, torch.float32)
        n = x.shape[0]
        positions = torch.arange(n) if positions is None else torch.as_tensor(positions, dtype=torch.int64)
        cos, sin = self.rope_tables(positions)
        mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        if full_attention_from is not None:
            mask[full_attention_from:, :] = True
        for layer in range(self.config.num_layers):
            q, k, v = self.qkv(layer, x, cos, sin)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                attn_mask=mask,
                scale=1.0 / math.sqrt(self.config.head_dim),
                enable_gqa=True,
            )
            x = self.finish_layer(layer, x, out[0].transpose(0, 1))
        hidden = self.final_hidden(x)
        return DenseOutput(self.logits(hidden), hidden)
