"""flowrt.compute.engine: the model engines behind flowrt, and how flowrt drives them (DESIGN §7,
docs/engines.md).

It owns:

- `adapter`: the engine adapter contract (`EngineAdapter`: describe, bind_kv, embed, forward one
  step on framework-chosen token slots, copy_slots, read/write pages, optional sample, close) and
  the values crossing it (`EngineSpec`, `StepRequest`, `StepBatch`, `StepResult`);
- `steps`: checking a step against the contract before any K/V is touched (every engine's);
- `kvbinding`: the pool's L1 block stacks as an engine binds them (`kv_stacks`, `BoundKV`);
- `reference_model`, `reference`: the reference engine, a tiny Llama-shaped transformer in
  PyTorch with paged attention over the bound stacks, and its dense forward (the specification);
- `sampling`: greedy and seeded temperature / top-k / top-p sampling, per request;
- `batcher`: continuous batching of concurrent requests' steps on one event loop;
- `driver`: paged generation on a `KVSession` (prefix reuse, prefill, decode, commit);
- `selftest`: the start-up self-test any engine can run against the contract (canaries, split
  prefill, decode, embeddings, batching);
- `sglang_plan`: the SGLang adapter's pure half (the pin and version check, flowrt steps ->
  SGLang's req_to_token rows / out_cache_loc / extend lengths, the KV layout views, settings);
- `sglang_engine`: the SGLang adapter itself, the one module that imports SGLang; it is not
  imported here (only by whoever uses it: `pip install 'flowc[sglang]'`, CUDA only).

It imports flowrt.params (layouts, the pool, sessions), flowrt.compute.hashing and flowrt's base
modules; never control, transport, registry, gateway or deploy. torch is imported when an engine
is built or run, not when this package is imported. An engine for another framework (SGLang)
lives in a module of its own that alone imports that framework, and this package never imports it.
"""

from flowrt.compute.engine.adapter import (
    CAPTURE_HIDDEN_ALL,
    CAPTURE_HIDDEN_LAST,
    CAPTURE_LOGITS,
    CAPTURES,
    EngineAdapter,
    EngineError,
    EngineSpec,
    StepBatch,
    StepRequest,
    StepResult,
    token_slots,
)
from flowrt.compute.engine.batcher import ContinuousBatcher
from flowrt.compute.engine.dit import DenoiseRequest, DitConfig, DitEngine, DitModel, DitSampler
from flowrt.compute.engine.driver import Generation, PagedGenerator
from flowrt.compute.engine.kvbinding import BoundKV, kv_stacks
from flowrt.compute.engine.planned import PlacedContext, PlannedGeneration, PlannedGenerator, place_context
from flowrt.compute.engine.reference import ReferenceEngine
from flowrt.compute.engine.reference_model import ReferenceConfig, ReferenceModel
from flowrt.compute.engine.sampling import GREEDY, SamplingParams, TokenSampler

__all__ = [
    "CAPTURES",
    "CAPTURE_HIDDEN_ALL",
    "CAPTURE_HIDDEN_LAST",
    "CAPTURE_LOGITS",
    "GREEDY",
    "BoundKV",
    "ContinuousBatcher",
    "DenoiseRequest",
    "DitConfig",
    "DitEngine",
    "DitModel",
    "DitSampler",
    "EngineAdapter",
    "EngineError",
    "EngineSpec",
    "Generation",
    "PagedGenerator",
    "PlacedContext",
    "PlannedGeneration",
    "PlannedGenerator",
    "ReferenceConfig",
    "ReferenceEngine",
    "ReferenceModel",
    "SamplingParams",
    "StepBatch",
    "StepRequest",
    "StepResult",
    "TokenSampler",
    "kv_stacks",
    "place_context",
    "token_slots",
]
