"""The role of lib/llm.flow: a text LLM that generates on the session's KV pages (docs/stdlib.md).

    Llm.generate    chat_tokens (lib/tokenizer.flow's chat template ids) & messages (the request)
                    -> stream generated_tokens (one id per frame), then generation (the counts)

The model is flowrt's `ReferenceEngine` (docs/engines.md): a tiny Llama-shaped transformer whose
weights come from a seed, so every process builds the same model and nothing is downloaded. Its
vocabulary is the flowstd tokenizer's; its layers, K/V heads, head size and K/V dtype are read
from the `global kv: KVCache` lib/llm.flow imports from lib/kvcache.flow (the cache must hold
exactly the model's K/V, so the global sizes the model; copies of llm.flow and kvcache.flow beside
a pipeline may change it; a setting the model cannot take is refused in `setup`, naming it).
`check_kv_fits` is the same check for roles whose model has a fixed shape (flowstd's multimodal
and voice LLMs): it names the global's shape, the model's and the settings to change.

Each process builds one engine and one `ContinuousBatcher` per pool, shared by the role's
replicas there, so concurrent sessions share forward steps. Each call runs `PagedGenerator` on
`ctx.kv("kv")`: the full pages of the history the pool already holds (turn 1's prompt and reply,
when turn 2 repeats them) are reused, only the rest is prefilled, and the pages this call fills
are committed for the next turn. The counts (`reused_tokens`, `computed_tokens`, ...) come back
as the `generation` field. A turn that follows one its call interrupted (`ctx.interrupted`,
docs/runtime.md) takes that turn's reply as the ids whose frames its caller took
(flowstd.roles.delivered), so it reuses exactly the pages of what the user received.

Sampling is greedy unless the request (an OpenAI body in `messages`) says otherwise:
`temperature`, `top_p`, `seed`, `max_completion_tokens` / `max_tokens`. Greedy and seeded runs
are deterministic on a CPU, batched or alone, with or without reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine import (
    ContinuousBatcher,
    EngineError,
    EngineSpec,
    PagedGenerator,
    ReferenceConfig,
    ReferenceEngine,
    SamplingParams,
    kv_stacks,
)
from flowrt.errors import BadInput, FlowrtError
from flowrt.params.layout import KVLayout
from flowstd.roles.delivered import remember, rolled_back
from flowstd.tokenizer import Tokenizer

KV = "kv"  # the KVCache global lib/kvcache.flow declares and the llm role uses
DEFAULT_MAX_TOKENS = 32  # generated tokens when the request sets no max_completion_tokens / max_tokens
MODEL_SEED = 0  # the reference weights' seed: every process builds the same model
QUERY_HEADS_PER_KV_HEAD = 2  # grouped-query attention, as in the engine's default shape
KV_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3")  # what the reference engine stores


class LlmError(FlowrtError, ValueError):
    """A request or a `global kv` the llm role cannot serve; the message names the fix."""


class LlmRequestError(LlmError, BadInput):
    """A request the llm role cannot serve (its sampling parameters or token ids): the caller's
    to fix, so the gateway answers 400 (flowrt.BadInput)."""


@dataclass
class SharedModel:
    """One process's engine for one pool: the engine, its batcher and its generator."""

    engine: ReferenceEngine
    batcher: ContinuousBatcher
    generator: PagedGenerator
    pool: Any = None  # the pool the engine's K/V live in, once bound

    def bind(self, kv: Any) -> None:
        """Bind the engine to the stacks of `kv`'s pool, for roles that drive the engine's steps
        themselves (the generator binds on its own; binding the same stacks twice is harmless)."""
        if self.pool is kv.pool:
            return
        if self.pool is not None:
            raise LlmError(f"this process's model is bound to the pool of global `{self.pool.layout.name}`; use one pool")
        self.engine.describe().check_layout(kv.layout)
        self.engine.bind_kv(kv_stacks(kv))
        self.pool = kv.pool


# per deployment's params plane (a process may open several deployments, e.g. in tests): its models by global
_MODELS: weakref.WeakKeyDictionary[Any, dict[str, SharedModel]] = weakref.WeakKeyDictionary()


def model_config(layout: KVLayout, vocab_size: int) -> ReferenceConfig:
    """The reference model whose K/V exactly fill pages of `layout`; refuses a global the model
    cannot have, naming the setting to change."""
    wrong = []
    if tuple(layout.slice_names) != ("k", "v"):
        wrong.append(f"`slices [k, v]` (it has {list(layout.slice_names)}): an attention layer stores K and V")
    if layout.head_dim < 2 or layout.head_dim % 2:
        wrong.append(f"an even `head_dim` such as 16 (it has {layout.head_dim}): rotary embedding turns pairs of dimensions")
    if layout.dtype not in KV_DTYPES:
        wrong.append(f"`dtype` to one of {', '.join(KV_DTYPES)} (it has {layout.dtype})")
    if wrong:
        raise LlmError(
            f"global `{layout.name}` cannot hold the llm role's K/V: it declares {layout_text(layout)}; the model takes "
            f"its layers, heads and head_dim from the global, and needs `slices [k, v]`, an even `head_dim` and a "
            f"`dtype` of {', '.join(KV_DTYPES)}: set " + "; ".join(wrong)
        )
    query_heads = QUERY_HEADS_PER_KV_HEAD * layout.heads
    hidden = query_heads * layout.head_dim
    return ReferenceConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=len(layout.sub_names),
        num_heads=query_heads,
        num_kv_heads=layout.heads,
        head_dim=layout.head_dim,
        intermediate_size=2 * hidden,
        kv_dtype=layout.dtype,
        seed=MODEL_SEED,
    )


def layout_text(layout: KVLayout) -> str:
    """A KV layout's shape as a global's settings say it: `layers 2, heads 2, head_dim 16, ...`."""
    return (
        f"layers {len(layout.sub_names)}, slices {_setting_text(tuple(layout.slice_names))}, heads {layout.heads}, "
        f"head_dim {layout.head_dim}, page_tokens {layout.page_tokens}, dtype {layout.dtype}"
    )


def check_kv_fits(ctx, spec: EngineSpec, *, page_tokens: int, model: str, name: str = KV) -> KVLayout | None:
    """In a role's `setup`: refuse a `global NAME: KVCache` whose pages cannot hold the K/V of the
    fixed-shape model `spec` (flowstd's multimodal and voice LLMs), naming the global's shape, the
    model's and the settings to change, so the deployment does not start rather than failing at
    the first call. Returns the layout (None where the process has no pools)."""
    layout = kv_layout(ctx, name)
    if layout is None:
        return None
    wanted = spec.kv_layout(name, page_tokens)
    fixes = [
        f"`{setting} {_setting_text(need)}`"
        for setting, have, need in (
            ("layers", len(layout.sub_names), len(wanted.sub_names)),
            ("slices", tuple(layout.slice_names), tuple(wanted.slice_names)),
            ("heads", layout.heads, wanted.heads),
            ("head_dim", layout.head_dim, wanted.head_dim),
            ("page_tokens", layout.page_tokens, wanted.page_tokens),
            ("dtype", layout.dtype, wanted.dtype),
        )
        if have != need
    ]
    if fixes:
        raise LlmError(
            f"global `{name}` does not fit {model}: the global's pages are {layout_text(layout)}; the model's K/V "
            f"need {layout_text(wanted)}. Set {', '.join(fixes)} in `global {name}` (flowstd's lib/kvcache.flow "
            f"declares this shape)"
        )
    return layout


def engines_for(cache: Any, kv: Any, spec: EngineSpec, page_tokens: int, make: Any) -> Any:
    """The engines `make(kv)` bound to `kv`'s pool, kept in `cache` (a weak dict by pool: a
    deployment's pool lives as long as the deployment), refusing a global of the wrong shape
    when they are first made (flowstd's multimodal and voice roles)."""
    engines = cache.get(kv.pool)
    if engines is None:
        spec.check_layout(kv.layout)  # names each setting of the global to change
        if kv.layout.page_tokens != page_tokens:
            raise EngineError(f"global `{kv.layout.name}`: set `page_tokens {page_tokens}` (it has {kv.layout.page_tokens})")
        engines = cache[kv.pool] = make(kv)
    return engines


def _setting_text(value: Any) -> str:
    return f"[{', '.join(value)}]" if isinstance(value, tuple) else str(value)


def kv_layout(ctx, name: str = KV) -> KVLayout | None:
    """The layout of the KVCache global `name` this process's deployment declares (None where the
    process has no pools: `ctx.kv` then says why at the first call)."""
    params = getattr(ctx.memory, "params", None)
    if params is None:
        return None
    spec = params.globals.get(name)
    if spec is None:
        raise LlmError(
            f"role `{ctx.role}` generates on the KV pool of `global {name}: KVCache`, and the flow declares none: add "
            f"`import kvcache` (flowstd's `global kv`) or `global {name}: KVCache {{ layers 2  heads 2  head_dim 16  "
            f"dtype float32 }}` to the pipeline"
        )
    return KVLayout.from_global(name, spec)


def shared_model(ctx, name: str = KV) -> SharedModel | None:
    """This process's model for the pool of global `name`, built on first use (None: no pools here)."""
    layout = kv_layout(ctx, name)
    if layout is None:
        return None
    models = _MODELS.setdefault(ctx.memory.params, {})
    model = models.get(name)
    if model is None:
        engine = ReferenceEngine(model_config(layout, Tokenizer.load().vocab_size))
        engine.describe().check_layout(layout)  # the engine's own check: the sizes above fit by construction
        batcher = ContinuousBatcher(engine)
        model = models[name] = SharedModel(engine, batcher, PagedGenerator(engine, batcher=batcher))
    return model


def sampling_request(request: Any, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> tuple[SamplingParams, int]:
    """The sampling parameters and token budget a request asks for: an OpenAI request body (a
    dict) may set temperature, top_p, seed and max_completion_tokens / max_tokens; a list of
    messages or a string sets nothing (greedy, the default budget)."""
    if not isinstance(request, Mapping):
        return SamplingParams(), default_max_tokens
    temperature = _number(request, "temperature", 0.0, 0.0, 2.0)
    top_p = _number(request, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise LlmRequestError("top_p is 0: no token could be drawn; give a number above 0 and at most 1")
    seed = request.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise LlmRequestError(f"seed must be a whole number from 0 to 2**63 - 1, not {seed!r}")
    budget = request.get("max_completion_tokens", request.get("max_tokens"))
    if budget is None:
        budget = default_max_tokens
    elif not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise LlmRequestError(f"max_completion_tokens / max_tokens must be a whole number >= 1, not {budget!r}")
    return SamplingParams(temperature=temperature, top_p=top_p, seed=seed), budget


def _number(request: Mapping, key: str, default: float, low: float, high: float) -> float:
    value = request.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise LlmRequestError(f"{key} must be a number from {low:g} to {high:g}, not {value!r}")
    return float(value)


def token_ids(value: Any, field: str, vocab_size: int) -> list[int]:
    """A list of token ids, each in the vocabulary; the error names the field."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not value:
        raise LlmRequestError(f"{field} must be a non-empty list of token ids, not {type(value).__name__}")
    try:
        ids = [operator.index(token) for token in value]
    except TypeError:
        raise LlmRequestError(f"{field} must hold token ids (whole numbers); one is a {type(value[0]).__name__}") from None
    bad = next((token for token in ids if not 0 <= token < vocab_size), None)
    if bad is not None:
        raise LlmRequestError(f"{field} holds {bad}, outside the vocabulary of {vocab_size} tokens")
    return ids


async def stream_generation(generate) -> AsyncIterator[int | Any]:
    """Run `generate(on_token)` as a task and yield each token as it comes, then the task's
    result. Closing the iterator (the call was cancelled, or a client stopped reading) cancels
    the generation, which releases its pages."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()
    task = asyncio.ensure_future(generate(queue.put_nowait))
    task.add_done_callback(lambda _: queue.put_nowait(done))
    try:
        while (item := await queue.get()) is not done:
            yield item
        yield task.result()  # raises what the generation raised
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Llm:
    async def setup(self, ctx) -> None:
        self.tokenizer = Tokenizer.load()
        shared_model(ctx)  # build the engine now: a bad `global kv` stops the runtime from opening

    async def generate(self, ctx, chat_tokens: Any, messages: Any) -> AsyncIterator[dict[str, Any]]:
        history = token_ids(chat_tokens, "chat_tokens", self.tokenizer.vocab_size)
        sampling, budget = sampling_request(messages)
        kv = ctx.kv(KV)  # raises, naming the fix, where this process has no pools
        model = shared_model(ctx)
        state = ctx.globals.get(KV)  # the session's state of `global kv`: this role's last turn (flowstd.roles.delivered)
        history, _ = rolled_back(self.tokenizer, state, ctx.interrupted, history)
        generated: list[int] = []
        remember(state, ctx.call_id, history, generated)

        async def run(on_token):
            async with kv:
                return await model.generator.generate(
                    kv, history, max_new_tokens=budget, sampling=sampling, stop={self.tokenizer.eos_id}, on_token=on_token
                )

        try:
            async for item in stream_generation(run):
                if isinstance(item, int):
                    generated.append(item)
                    yield {"generated_tokens": [item]}
                else:
                    result = item
        except EngineError as error:
            raise LlmError(f"generation failed: {error}") from None
        yield {
            "generation": {
                "prompt_tokens": result.prompt_tokens,
                "reused_tokens": result.reused_tokens,
                "computed_tokens": result.computed_tokens,
                "generated_tokens": len(generated),
                "completion_tokens": len(generated),  # (OpenAI's name: /v1/chat/completions reports it as usage)
                "committed_pages": result.committed_pages,
                "finish_reason": "stop" if generated and generated[-1] == self.tokenizer.eos_id else "length",
            }
        }
