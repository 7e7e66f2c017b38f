"""Choosing the next token from last-token logits: the framework's sampler, the specification an
engine's own `sample` must match.

`SamplingParams`: temperature 0 is greedy (the first index of the largest logit); otherwise the
logits are divided by the temperature, cut to the `top_k` largest (0: all), then to the smallest
set of most likely tokens whose probability reaches `top_p` (1.0: all), and one token is drawn.
`TokenSampler` draws with a torch.Generator of its own, seeded from `seed`: a request's tokens
depend only on its seed and its own logits, never on what else ran in the same batch, so seeded
outputs are reproducible one request at a time or batched.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import EngineError


def _torch() -> Any:
    import torch

    return torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None  # None: a random seed (outputs then differ run to run)

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, int | float) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise EngineError(f"sampling temperature must be a finite number >= 0 (0: greedy), not {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise EngineError(f"sampling top_k must be a whole number >= 0 (0: no cut), not {self.top_k!r}")
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise EngineError(f"sampling top_p must lie in (0, 1] (1: no cut), not {self.top_p!r}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63
        ):
            raise EngineError(f"sampling seed must be a whole number from 0 to 2**63 - 1, or None, not {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


class TokenSampler:
    """One request's sampler: its params and its own random stream.

    Every sampled token takes exactly one uniform draw from the stream, so a request can go on
    in another process: pass on `seed` (the one drawn when the params had none) and `draws`,
    and there `TokenSampler(SamplingParams(..., seed=seed)).skip(draws)` samples the next token
    as this one would (examples/pd_split: prefill samples the first token, decode the rest)."""

    def __init__(self, params: SamplingParams = GREEDY):
        if not isinstance(params, SamplingParams):
            raise EngineError(f"a sampler takes SamplingParams, not {type(params).__name__}")
        self.params = params
        self.generator = None
        self.seed: int | None = None  # the stream's seed (None: greedy, no stream)
        self.draws = 0  # tokens sampled from the stream so far
        if not params.greedy:
            self.seed = params.seed if params.seed is not None else secrets.randbits(63)
            self.generator = _torch().Generator().manual_seed(self.seed)

    def skip(self, draws: int) -> TokenSampler:
        """Advance the stream past `draws` tokens sampled elsewhere (nothing for greedy)."""
        if not isinstance(draws, int) or isinstance(draws, bool) or draws < 0:
            raise EngineError(f"draws to skip must be a whole number >= 0, not {draws!r}")
        if self.generator is not None and draws:
            _torch().rand((draws,), generator=self.generator, dtype=_torch().float64)
            self.draws += draws
        return self

    def __call__(self, logits: Any) -> int:
        torch = _torch()
        if not isinstance(logits, torch.Tensor) or logits.dim() != 1 or not len(logits):
            raise EngineError(f"a sampler takes one request's last-token logits (vocab,), not {logits!r:.60}")
        logits = logits.detach().to("cpu", torch.float32)
        if self.params.greedy:
            return int(torch.argmax(logits))
        # in float64, from the largest logit down: the top token scales to 0 and the others to
        # at most 0, so no temperature, however small, overflows into inf and NaN (1e-300 is greedy)
        logits = logits.double()
        scaled = (logits - logits.max()) / self.params.temperature
        order = torch.argsort(scaled, descending=True, stable=True)  # ties: the lower id first, every run
        ranked = scaled[order]
        if 0 < self.params.top_k < len(ranked):
            ranked = ranked[: self.params.top_k]
        probabilities = torch.softmax(ranked, dim=0)
        if self.params.top_p < 1.0:
            before = torch.cumsum(probabilities, dim=0) - probabilities  # mass of the tokens ranked above
            probabilities = probabilities[before < self.params.top_p]  # the first always stays
        cumulative = torch.cumsum(probabilities, dim=0)
        draw = torch.rand((), generator=self.generator, dtype=torch.float64) * float(cumulative[-1])
        self.draws += 1
        chosen = min(int(torch.searchsorted(cumulative, draw, right=True)), len(cumulative) - 1)
        return int(order[chosen])
