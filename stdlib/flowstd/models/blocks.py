"""The layers the transformer encoders share (vision, audio, text embedding): multi-head
self-attention, a pre-norm transformer block, a stack of them with a final norm, and sinusoidal
positions. Bidirectional attention only (these are encoders); padding is masked by the caller."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (batch, tokens, hidden); key_mask: (batch, tokens) bool, True where a token is real."""
        batch, tokens, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(attended.transpose(1, 2).reshape(batch, tokens, hidden))


class TransformerBlock(nn.Module):
    """Pre-norm: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden)
        self.attention = SelfAttention(hidden, heads)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, mlp_ratio * hidden), nn.GELU(), nn.Linear(mlp_ratio * hidden, hidden))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), key_mask)
        return x + self.mlp(self.mlp_norm(x))


class TransformerEncoder(nn.Module):
    """`depth` pre-norm blocks and the final LayerNorm that pre-norm stacks need."""

    def __init__(self, hidden: int, depth: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TransformerBlock(hidden, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, key_mask)
        return self.norm(x)


def sinusoidal_positions(length: int, hidden: int, device: torch.device | None = None) -> torch.Tensor:
    """(length, hidden) fixed positions of "Attention Is All You Need": no length limit, no weights."""
    position = torch.arange(length, dtype=torch.float32, device=device)[:, None]
    rate = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / hidden))
    table = torch.zeros(length, hidden, device=device)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: hidden // 2])
    return table
