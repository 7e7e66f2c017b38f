"""A tiny DiT denoiser on the LLM path (Omni-Flow §5, DESIGN §7): its latent tokens attend, in
every layer, to the LLM's cached text K/V of that layer, read from the pool's block stacks by
slot id, and to each other; it stores nothing.

`DitModel` (weights from `seed`, no download):

- patchify: a VAE latent (C, h, w), with an optional image condition latent of the same shape
  concatenated on channels (zeros without one), is cut into p x p patches, each a token
  projected to `hidden_size`;
- conditioning: a sinusoidal timestep embedding through an MLP, plus the LLM's final hidden state
  projected to `hidden_size`: one vector `c` per request;
- `num_layers` blocks with adaLN modulation (shift, scale and gate of each sub-block from `c`):
  attention whose queries, keys and values have the LLM's K/V shape (`num_kv_heads`, `head_dim`,
  rotary positions after the text), then a GELU MLP;
- a final modulated LayerNorm and a linear head back to patches, unpatchified to the predicted
  velocity (C, h, w) of flow matching.

`DitEngine` is that model behind the engine adapter contract, bound to the LLM's pool: its
`EngineSpec` has the LLM's `num_layers`, `num_kv_heads`, `head_dim` and `kv_dtype` (a global that
holds the LLM's KV holds what it reads). A step's requests are `DenoiseRequest`s: `embeddings` the
patch tokens, `slots` the cached text context, `condition` the vector `c`, `causal=False`,
`write_kv=False`; the attention is planned exactly as the reference engine's
(`reference.plan_attention`): the context gathered from the stacks by its listed slots, the
latent tokens' own K/V appended where they were computed, one masked attention call per layer for
the whole batch. `dense_forward` (text K/V given as tensors) is the specification.

`DitSampler.sample(...)`: Euler steps of flow matching (x_t = (1 - t) x_0 + t noise, the model
predicts noise - x_0) from seeded noise at t = 1 to a latent at t = 0.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import (
    CAPTURE_HIDDEN_ALL,
    CAPTURE_HIDDEN_LAST,
    FEATURE_BIDIRECTIONAL,
    FEATURE_EMBEDDINGS,
    FEATURE_HIDDEN,
    FEATURE_NO_WRITE,
    EngineError,
    EngineSpec,
    StepBatch,
    StepRequest,
    StepResult,
)
from flowrt.compute.engine.kvbinding import BoundKV, StackedKVEngine
from flowrt.compute.engine.reference import gather_and_attend, plan_attention
from flowrt.compute.engine.reference_model import _torch
from flowrt.compute.engine.steps import check_batch
from flowrt.params.layout import ITEM_BYTES, TORCH_DTYPES

DIT_FEATURES = frozenset({FEATURE_EMBEDDINGS, FEATURE_BIDIRECTIONAL, FEATURE_NO_WRITE, FEATURE_HIDDEN})


@dataclass(frozen=True)
class DitConfig:
    """The DiT's sizes. `num_layers`, `num_kv_heads`, `head_dim` and `kv_dtype` must be the LLM's
    (`DitConfig.matching(llm_spec)` copies them); `condition_size` is the LLM's hidden size."""

    latent_channels: int = 4
    patch_size: int = 2
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    condition_size: int = 64
    mlp_ratio: int = 2
    frequency_size: int = 32
    rope_theta: float = 10000.0
    seed: int = 0
    kv_dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        for what in (
            "latent_channels",
            "patch_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "condition_size",
            "mlp_ratio",
            "frequency_size",
        ):
            value = getattr(self, what)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise EngineError(f"DitConfig: {what} must be a whole number >= 1, not {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise EngineError(
                f"DitConfig: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads} "
                f"(each K/V head serves a whole group of query heads)"
            )
        if self.head_dim % 2 or self.frequency_size % 2:
            raise EngineError("DitConfig: head_dim and frequency_size must be even (rotary and sinusoidal pairs)")
        if self.kv_dtype not in ITEM_BYTES or self.kv_dtype == "int8":
            raise EngineError(f"DitConfig: kv_dtype {self.kv_dtype!r} is not one of float32, bfloat16, float16, float8_e4m3")

    @classmethod
    def matching(cls, llm: EngineSpec, **settings: Any) -> DitConfig:
        """A config whose K/V shape is the LLM's `llm` (its describe()), conditioned on its hidden
        states; `settings` choose the rest (num_heads defaults to twice the K/V heads)."""
        shared = {
            "num_layers": llm.num_layers,
            "num_kv_heads": llm.num_kv_heads,
            "head_dim": llm.head_dim,
            "kv_dtype": llm.kv_dtype,
            "condition_size": llm.hidden_size,
            "device": llm.device,
        }
        clash = sorted(name for name in settings if name in shared and settings[name] != shared[name])
        if clash:
            raise EngineError(f"DitConfig.matching: {clash} must be the LLM's ({ {name: shared[name] for name in clash} })")
        settings = {**shared, **settings}
        settings.setdefault("num_heads", 2 * llm.num_kv_heads)
        return cls(**settings)


@dataclass
class _Block:
    modulation: Any  # (hidden, 6 * hidden): shift, scale, gate of attention and MLP
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    w_in: Any
    w_out: Any


class DitModel:
    """The weights and the math, shared by the dense and the paged forward."""

    def __init__(self, config: DitConfig):
        torch = _torch()
        c = self.config = config
        self.device = torch.device(c.device)
        self.kv_dtype = getattr(torch, TORCH_DTYPES.get(c.kv_dtype, c.kv_dtype))
        generator = torch.Generator().manual_seed(c.seed)

        def normal(*shape: int, std: float) -> Any:
            return (torch.randn(*shape, generator=generator) * std).to(self.device)

        patch_in = 2 * c.latent_channels * c.patch_size**2  # the noisy latent and the image condition
        attention = c.num_heads * c.head_dim
        self.patch_embed = normal(patch_in, c.hidden_size, std=patch_in**-0.5)
        self.time_in = normal(c.frequency_size, c.hidden_size, std=c.frequency_size**-0.5)
        self.time_out = normal(c.hidden_size, c.hidden_size, std=c.hidden_size**-0.5)
        self.condition_in = normal(c.condition_size, c.hidden_size, std=c.condition_size**-0.5)
        # modulations of a few tenths: the conditioning steers the output without swamping it
        self.blocks = [
            _Block(
                modulation=normal(c.hidden_size, 6 * c.hidden_size, std=0.3 * c.hidden_size**-0.5),
                wq=normal(c.hidden_size, attention, std=c.hidden_size**-0.5),
                wk=normal(c.hidden_size, c.num_kv_heads * c.head_dim, std=c.hidden_size**-0.5),
                wv=normal(c.hidden_size, c.num_kv_heads * c.head_dim, std=c.hidden_size**-0.5),
                wo=normal(attention, c.hidden_size, std=attention**-0.5),
                w_in=normal(c.hidden_size, c.mlp_ratio * c.hidden_size, std=c.hidden_size**-0.5),
                w_out=normal(c.mlp_ratio * c.hidden_size, c.hidden_size, std=(c.mlp_ratio * c.hidden_size) ** -0.5),
            )
            for _ in range(c.num_layers)
        ]
        self.final_modulation = normal(c.hidden_size, 2 * c.hidden_size, std=0.3 * c.hidden_size**-0.5)
        self.head = normal(c.hidden_size, c.latent_channels * c.patch_size**2, std=c.hidden_size**-0.5)
        half = c.head_dim // 2
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))

    # ── latents and conditioning ──

    def check_latent(self, latent: Any, what: str = "latent") -> tuple[int, int]:
        torch, c = _torch(), self.config
        if not isinstance(latent, torch.Tensor) or latent.dim() != 3 or latent.shape[0] != c.latent_channels:
            got = tuple(latent.shape) if isinstance(latent, torch.Tensor) else type(latent).__name__
            raise EngineError(f"the DiT takes a {what} tensor ({c.latent_channels}, h, w), not {got}")
        h, w = int(latent.shape[1]), int(latent.shape[2])
        if h % c.patch_size or w % c.patch_size:
            raise EngineError(f"the DiT's {what} is {h}x{w}; h and w must be multiples of patch_size {c.patch_size}")
        return h, w

    def patchify(self, latent: Any, image_condition: Any = None) -> Any:
        """Patch tokens (h/p * w/p, hidden) of a latent (C, h, w), row-major patch order."""
        torch, c = _torch(), self.config
        h, w = self.check_latent(latent)
        if image_condition is None:
            image_condition = torch.zeros_like(latent)
        elif tuple(image_condition.shape) != tuple(latent.shape):
            raise EngineError(
                f"the DiT's image condition is {tuple(image_condition.shape)}; it must be the latent's shape {tuple(latent.shape)}"
            )
        x = torch.cat([latent, image_condition.to(latent.device, latent.dtype)]).to(self.device, torch.float32)
        p = c.patch_size
        patches = x.view(2 * c.latent_channels, h // p, p, w // p, p).permute(1, 3, 0, 2, 4).reshape((h // p) * (w // p), -1)
        return patches @ self.patch_embed

    def unpatchify(self, patches: Any, h: int, w: int) -> Any:
        """The inverse of patchify's cut: (tokens, C * p * p) -> (C, h, w)."""
        c, p = self.config, self.config.patch_size
        return patches.view(h // p, w // p, c.latent_channels, p, p).permute(2, 0, 3, 1, 4).reshape(c.latent_channels, h, w)

    def condition(self, t: float, llm_hidden: Any) -> Any:
        """The conditioning vector (hidden,) of timestep t in [0, 1] and the LLM's final hidden state."""
        torch, c = _torch(), self.config
        if not isinstance(llm_hidden, torch.Tensor) or tuple(llm_hidden.shape) != (c.condition_size,):
            got = tuple(llm_hidden.shape) if isinstance(llm_hidden, torch.Tensor) else type(llm_hidden).__name__
            raise EngineError(f"the DiT is conditioned on one LLM hidden state ({c.condition_size},), not {got}")
        half = c.frequency_size // 2
        frequencies = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        angles = 1000.0 * float(t) * frequencies
        features = torch.cat([angles.cos(), angles.sin()]).to(self.device)
        time = torch.nn.functional.silu(features @ self.time_in) @ self.time_out
        return time + llm_hidden.to(self.device, torch.float32) @ self.condition_in

    # ── the per-layer math ──

    def rope_tables(self, positions: Any) -> tuple[Any, Any]:
        angles = positions.to("cpu", _torch().float64)[:, None] * self.inv_freq[None, :]
        return angles.cos().float()[:, None, :].to(self.device), angles.sin().float()[:, None, :].to(self.device)

    @staticmethod
    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
        return _torch().cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    def modulations(self, layer: int, conditions: Any) -> list[Any]:
        """Per row: shift, scale, gate of attention, then of the MLP (each (rows, hidden))."""
        return list((_torch().nn.functional.silu(conditions) @ self.blocks[layer].modulation).chunk(6, dim=-1))

    @staticmethod
    def modulate(x: Any, shift: Any, scale: Any) -> Any:
        normed = _torch().nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)
        return normed * (1 + scale) + shift

    def qkv(self, layer: int, x: Any, mods: list[Any], cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        """Queries (n, heads, d); keys and values (n, kv_heads, d), rounded as the LLM's cache holds K/V."""
        c, block = self.config, self.blocks[layer]
        h = self.modulate(x, mods[0], mods[1])
        q = self.rotate((h @ block.wq).view(-1, c.num_heads, c.head_dim), cos, sin)
        k = self.rotate((h @ block.wk).view(-1, c.num_kv_heads, c.head_dim), cos, sin)
        v = (h @ block.wv).view(-1, c.num_kv_heads, c.head_dim)
        return q, self.stored(k), self.stored(v)

    def stored(self, kv: Any) -> Any:
        return kv if self.kv_dtype == kv.dtype else kv.to(self.kv_dtype).to(kv.dtype)

    def finish_layer(self, layer: int, x: Any, attention: Any, mods: list[Any]) -> Any:
        block = self.blocks[layer]
        x = x + mods[2] * (attention.reshape(x.shape[0], -1) @ block.wo)
        h = self.modulate(x, mods[3], mods[4])
        return x + mods[5] * (_torch().nn.functional.gelu(h @ block.w_in) @ block.w_out)

    def final_hidden(self, x: Any, conditions: Any) -> Any:
        shift, scale = (_torch().nn.functional.silu(conditions) @ self.final_modulation).chunk(2, dim=-1)
        return self.modulate(x, shift, scale)

    def velocity(self, hidden: Any, h: int, w: int) -> Any:
        """The predicted velocity (C, h, w) from the final hidden states of a latent's tokens."""
        return self.unpatchify(hidden @ self.head, h, w)

    # ── the specification ──

    def dense_forward(self, tokens: Any, condition: Any, text_keys: Sequence[Any], text_values: Sequence[Any]) -> Any:
        """Final hidden states (n, hidden) of patch tokens (n, hidden) under `condition` (hidden,),
        attending to the text K/V of each layer ((m, kv_heads, d) per layer, as cached: after
        rotary) and to each other. The tokens take positions m .. m+n-1."""
        torch, c = _torch(), self.config
        if len(text_keys) != c.num_layers or len(text_values) != c.num_layers:
            raise EngineError(f"dense_forward(): give the text K and V of each of the {c.num_layers} layers")
        x = tokens.to(self.device, torch.float32)
        m, n = int(text_keys[0].shape[0]), x.shape[0]
        cos, sin = self.rope_tables(torch.arange(m, m + n))
        conditions = condition.to(self.device, torch.float32)[None, :].expand(n, -1)
        for layer in range(c.num_layers):
            mods = self.modulations(layer, conditions)
            q, k, v = self.qkv(layer, x, mods, cos, sin)
            keys = torch.cat([text_keys[layer].to(self.device, torch.float32), k])
            values = torch.cat([text_values[layer].to(self.device, torch.float32), v])
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                keys.transpose(0, 1)[None],
                values.transpose(0, 1)[None],
                scale=1.0 / math.sqrt(c.head_dim),
                enable_gqa=True,
            )
            x = self.finish_layer(layer, x, out[0].transpose(0, 1), mods)
        return self.final_hidden(x, conditions)


@dataclass(frozen=True)
class DenoiseRequest(StepRequest):
    """One DiT request of a step: a StepRequest (embeddings = patch tokens, slots = the cached text
    context, causal=False, write_kv=False) plus `condition`, the vector (hidden,) its blocks are
    modulated by (`DitModel.condition`)."""

    condition: Any = None
    causal: bool = False
    write_kv: bool = False
    capture: frozenset[str] = frozenset({CAPTURE_HIDDEN_ALL})


class DitEngine(StackedKVEngine):
    """The DiT behind the adapter contract, reading the LLM's K/V (see the module docstring)."""

    unbound_hint = "call bind_kv(stacks) with the LLM's pool first"

    def __init__(self, config: DitConfig | None = None, **settings: Any):
        if config is not None and settings:
            raise EngineError("DitEngine: give a DitConfig or settings (hidden_size=..., ...), not both")
        self.config = config if config is not None else DitConfig(**settings)
        self.model = DitModel(self.config)
        c = self.config
        self._spec = EngineSpec(
            name="dit",
            vocab_size=1,  # no vocabulary: inputs are latent patches, given as embeddings
            hidden_size=c.hidden_size,
            num_layers=c.num_layers,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            kv_dtype=c.kv_dtype,
            device=c.device,
            features=DIT_FEATURES,
        )
        self._kv: BoundKV | None = None

    def check_llm(self, llm: EngineSpec) -> None:
        """Raise unless this DiT reads the K/V `llm` writes (same layers, K/V heads, head_dim, dtype)."""
        wrong = [
            f"{what} {getattr(self._spec, what)} (the LLM has {getattr(llm, what)})"
            for what in ("num_layers", "num_kv_heads", "head_dim", "kv_dtype")
            if getattr(self._spec, what) != getattr(llm, what)
        ]
        if wrong:
            raise EngineError(
                f"the DiT cannot read the K/V of engine `{llm.name}`: "
                + ", ".join(wrong)
                + "; build it with DitConfig.matching()"
            )

    def embed(self, token_ids: Any) -> Any:
        raise EngineError("the DiT takes no token ids: give patch tokens as embeddings (DitModel.patchify)")

    def forward(self, batch: StepBatch) -> list[StepResult]:
        torch = _torch()
        kv = self._kv
        checked = check_batch(batch, self._spec, None if kv is None else kv.slot_count)
        assert kv is not None
        for i, (request, check) in enumerate(zip(batch.requests, checked, strict=True)):
            condition = getattr(request, "condition", None)
            if not isinstance(request, DenoiseRequest) or not isinstance(condition, torch.Tensor):
                raise EngineError(f"request {i} of the step: the DiT takes DenoiseRequest values with a condition tensor")
            if tuple(condition.shape) != (self.config.hidden_size,):
                raise EngineError(f"request {i} of the step: condition must be ({self.config.hidden_size},)")
            if check.write_kv or check.causal:
                raise EngineError(f"request {i} of the step: a denoiser step is causal=False, write_kv=False (it stores nothing)")
            if check.capture - {CAPTURE_HIDDEN_ALL, CAPTURE_HIDDEN_LAST}:
                raise EngineError(f"request {i} of the step: the DiT gives hidden states only; capture {{'hidden_all'}}")
        model, device = self.model, self.model.device
        with torch.no_grad():
            x = torch.cat([check.embeddings.to(device, torch.float32) for check in checked])
            counts = torch.tensor([check.new_tokens for check in checked], device=device)
            conditions = torch.stack([request.condition.to(device, torch.float32) for request in batch.requests])
            conditions = conditions.repeat_interleave(counts, dim=0)
            cos, sin = model.rope_tables(torch.cat([check.positions for check in checked]))
            plan = plan_attention(checked, device)
            for layer in range(self.config.num_layers):
                mods = model.modulations(layer, conditions)
                q, k, v = model.qkv(layer, x, mods, cos, sin)
                x = model.finish_layer(layer, x, self._attend(plan, q, k, v, kv.keys[layer], kv.values[layer]), mods)
            hidden = model.final_hidden(x, conditions)
        results, start = [], 0
        for check in checked:
            end = start + check.new_tokens
            results.append(
                StepResult(
                    hidden_all=hidden[start:end].clone() if CAPTURE_HIDDEN_ALL in check.capture else None,
                    hidden_last=hidden[end - 1].clone() if CAPTURE_HIDDEN_LAST in check.capture else None,
                )
            )
            start = end
        return results

    def _attend(self, plan: Any, q: Any, k: Any, v: Any, key_slots: Any, value_slots: Any) -> Any:
        """Gather each request's cached context by slot, append its own fresh K/V, attend (no writes)."""
        c = self.config
        return gather_and_attend(plan, q, k, v, key_slots, value_slots, c.num_heads, c.num_kv_heads, c.head_dim)


StepRunner = Callable[[StepRequest], Awaitable[StepResult]]


class DitSampler:
    """Flow-matching Euler sampling with a `DitEngine` (see the module docstring). `batcher`: a
    ContinuousBatcher of that engine (concurrent samples then share steps); None: direct forwards."""

    def __init__(self, engine: DitEngine, *, batcher: Any = None):
        if not isinstance(engine, DitEngine):
            raise EngineError(f"DitSampler takes a DitEngine, not {type(engine).__name__}")
        if batcher is not None and batcher.engine is not engine:
            raise EngineError("DitSampler: the batcher drives another engine; give the sampler the batcher's engine")
        self.engine = engine
        self.batcher = batcher

    async def _run(self, request: DenoiseRequest) -> StepResult:
        if self.batcher is not None:
            return await self.batcher.step(request, None)
        return self.engine.forward(StepBatch([request]))[0]

    async def velocity(self, latent: Any, t: float, context_slots: Any, llm_hidden: Any, image_condition: Any = None) -> Any:
        """One model evaluation: the predicted velocity (C, h, w) of `latent` at time t."""
        model = self.engine.model
        h, w = model.check_latent(latent)
        request = DenoiseRequest(
            embeddings=model.patchify(latent, image_condition),
            slots=context_slots,
            condition=model.condition(t, llm_hidden),
        )
        result = await self._run(request)
        return model.velocity(result.hidden_all, h, w)

    async def sample(
        self,
        context_slots: Any,
        llm_hidden: Any,
        *,
        size: tuple[int, int] = (8, 8),
        steps: int = 4,
        seed: int = 0,
        image_condition: Any = None,
    ) -> Any:
        """A latent (C, h, w): `steps` Euler steps from seeded noise at t = 1 to t = 0, attending
        to the text K/V in `context_slots` and conditioned on `llm_hidden` (the LLM's last hidden
        state) and `image_condition` (a VAE latent of the same size, or None)."""
        torch = _torch()
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise EngineError(f"DitSampler.sample: steps is a whole number >= 1, not {steps!r}")
        if image_condition is not None and tuple(image_condition.shape[1:]) != tuple(size):
            size = tuple(int(side) for side in image_condition.shape[1:])  # an edit keeps its source's size
        c = self.engine.config
        generator = torch.Generator().manual_seed(int(seed))
        latent = torch.randn(c.latent_channels, *size, generator=generator).to(self.engine.model.device)
        with torch.no_grad():
            for i in range(steps):
                t = 1.0 - i / steps
                latent = latent - (1.0 / steps) * await self.velocity(latent, t, context_slots, llm_hidden, image_condition)
        return latent
