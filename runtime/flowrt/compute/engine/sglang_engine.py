"""The SGLang adapter: flowrt's engine contract (adapter.py) over SGLang's ModelRunner, with
framework-owned slots (DESIGN §7; docs/engines.md, "SGLang adapter"). The one module of flowrt
that imports SGLang; pinned to SGLang `sglang_plan.SGLANG_VERSION`.

Importing it checks the installed SGLang first, without importing it (`require_sglang`): no
SGLang, or another release, raises ImportError naming the installed and the required versions
and the pip command. Then it imports SGLang's modules; one that moved raises ImportError saying so.

How it drives SGLang (the runner-level route of shared/research/sglang-surface.md §5):

- `SharedRunner` builds one ModelRunner per process and settings (tp 1, page size 1 so any slot
  order works, no CUDA graphs, no radix cache, no scheduler: nothing of SGLang allocates or frees
  a slot), then runs the start-up self-test (selftest.py) on it.
- `SGLangEngine.bind_kv(stacks)` points the runner's `MHATokenToKVPool` K/V buffers at views of
  flowrt's block stacks (zero-copy: a stack viewed (slots * page_tokens, heads, head_dim) is one
  layer's buffer), so SGLang's attention reads and writes the pool's pages themselves.
- `forward` checks the step (steps.check_batch), maps it (sglang_plan.plan_step), writes each
  request's slot list into a `req_to_token` row of its own, builds a `ForwardBatch` by hand
  (`out_cache_loc` = the new tokens' slots) and calls `ModelRunner.forward`; sampling is flowrt's.
  Steps of single id tokens run as DECODE batches, the rest as EXTEND (SGLang's eager decode
  path ignores `input_embeds`).

Features: hidden states; embeddings for bfloat16 models (SGLang casts `input_embeds` to
bfloat16). Not bidirectional steps nor steps that store nothing (SGLang's attention mode is fixed
per layer, and it writes every new token's K/V).

Bootstrapping a ModelRunner outside SGLang's scheduler follows `sglang.bench_one_batch` (SGLang's
own driver of a bare ModelRunner) and is the most version-bound part: `_bootstrap`. It has been
written against the SGLang sources and never run (no GPU in the sessions that wrote it).
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowrt.compute.engine.adapter import FEATURE_EMBEDDINGS, FEATURE_HIDDEN, EngineError, EngineSpec, StepBatch, StepResult
from flowrt.compute.engine.kvbinding import BoundKV, StackedKVEngine
from flowrt.compute.engine.selftest import SelfTestError, self_test
from flowrt.compute.engine.sglang_plan import (
    CAPTURE_FULL,
    CAPTURE_LAST,
    MODE_DECODE,
    PIP_FIX,
    SGLANG_VERSION,
    SGLangSettings,
    SGLangStep,
    fill_req_to_token,
    kv_dtype_name,
    plan_step,
    require_sglang,
    reseed_parameters,
    tiny_model_dir,
    unpack_outputs,
)
from flowrt.compute.engine.steps import as_index_tensor, check_batch

INSTALLED_VERSION = require_sglang()  # before any SGLang import: a clear error, not a CUDA one

import torch  # noqa: E402 - after the check: SGLang's torch, not a reason to blame SGLang

try:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import PortArgs, ServerArgs
except ImportError as error:  # an SGLang whose modules moved (or a stand-in without them)
    raise ImportError(
        f"SGLang {INSTALLED_VERSION} is installed but `{getattr(error, 'name', None) or error}` could not be imported "
        f"({error}); flowrt's SGLang adapter is written against SGLang {SGLANG_VERSION}'s module layout"
    ) from error


def _optional(module: str, name: str) -> Any:
    """An SGLang helper whose place or existence varies by release; None where absent."""
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return None


def _bootstrap(settings: SGLangSettings) -> Any:
    """A ModelRunner outside SGLang's scheduler, as `sglang.bench_one_batch.load_model` makes one
    (SGLang's own standalone driver), with flowrt's settings. The version-bound part."""
    wanted = {
        "model_path": settings.model_path,
        "dtype": settings.dtype,
        "device": "cuda",
        "tp_size": 1,
        "page_size": 1,  # token-granular req_to_token: any slot order, any flowrt page size
        "attention_backend": settings.attention_backend,
        "disable_cuda_graph": True,  # graphs copy into static buffers and pad with slot 0
        "disable_piecewise_cuda_graph": True,
        "disable_radix_cache": True,
        "disable_overlap_schedule": True,
        "skip_tokenizer_init": True,
        "max_running_requests": settings.max_requests,
        "max_total_tokens": settings.pool_tokens,
        "mem_fraction_static": settings.mem_fraction_static,
        "load_format": settings.load_format,
        "context_length": settings.context_length,
        "trust_remote_code": settings.trust_remote_code,
        "base_gpu_id": settings.gpu_id,
    }
    known = {item.name for item in dataclasses.fields(ServerArgs)} if dataclasses.is_dataclass(ServerArgs) else None
    known = known or set(getattr(ServerArgs, "__struct_fields__", ())) or set(wanted)
    server_args = ServerArgs(**{key: value for key, value in wanted.items() if key in known and value is not None})
    if hasattr(server_args, "resolve_once"):  # 0.5.2x: derived settings resolve here, not in __post_init__
        server_args.resolve_once()
    for module, name in (
        ("sglang.srt.entrypoints.engine", "_set_envs_and_config"),
        ("sglang.srt.layers.moe", "initialize_moe_config"),
        ("sglang.srt.layers.quantization.fp8_utils", "initialize_fp8_gemm_config"),
        ("sglang.srt.layers.quantization.fp4_utils", "initialize_fp4_gemm_config"),
    ):
        helper = _optional(module, name)
        if helper is not None:
            helper(server_args)
    publish = _optional("sglang.srt.runtime_context", "publish")  # the process-wide config of 0.5.2x
    if publish is not None:
        ranks = _optional("sglang.srt.runtime_context", "SpawnRanks")
        options = {"role": "scheduler"}
        if ranks is not None and "ranks" in inspect.signature(publish).parameters:
            options["ranks"] = ranks(world_rank=0, gpu_id=settings.gpu_id)
        publish(server_args, **options)
    port_args = PortArgs.init_new(server_args)
    arguments = {
        "model_config": ModelConfig.from_server_args(server_args),
        "mem_fraction_static": server_args.mem_fraction_static,
        "gpu_id": settings.gpu_id,
        "tp_rank": 0,
        "tp_size": 1,
        "moe_ep_rank": 0,
        "moe_ep_size": 1,
        "pp_rank": 0,
        "pp_size": 1,
        "nccl_port": port_args.nccl_port,
        "server_args": server_args,
    }
    accepted = inspect.signature(ModelRunner.__init__).parameters
    runner = ModelRunner(**{key: value for key, value in arguments.items() if key in accepted})
    if getattr(runner, "token_to_kv_pool", None) is None and hasattr(runner, "alloc_memory_pool"):
        runner.alloc_memory_pool()
    if getattr(runner, "attn_backend", None) is None and hasattr(runner, "init_backends"):
        runner.init_backends()
    return runner


class SharedRunner:
    """One ModelRunner and what the engines on it share: its req_to_token table, its K/V pool
    (whose buffers each engine points at its own stacks before its step) and the spec."""

    def __init__(self, settings: SGLangSettings):
        self.settings = settings
        self.runner = _bootstrap(settings)
        self.lock = threading.Lock()
        pool = self.runner.token_to_kv_pool
        if type(pool) is not MHATokenToKVPool:
            raise EngineError(
                f"the SGLang adapter binds plain multi-head attention K/V (MHATokenToKVPool); "
                f"{settings.model_path} gets a {type(pool).__name__} (MLA, sliding-window and hybrid models are not supported)"
            )
        if settings.random_weights_seed is not None:
            reseed_parameters(self.runner.model.named_parameters(), settings.random_weights_seed)
        self.pool = pool
        self.req_to_token = self.runner.req_to_token_pool.req_to_token
        self.first_row = 1  # row 0: SGLang's padding row
        self.max_rows = min(
            self.req_to_token.shape[0] - self.first_row, int(getattr(self.runner.req_to_token_pool, "size", 1 << 30))
        )
        self.max_context = int(self.req_to_token.shape[1])
        config = self.runner.model_config
        model_dtype = getattr(self.runner, "dtype", None) or getattr(config, "dtype", None)
        features = {FEATURE_HIDDEN} | ({FEATURE_EMBEDDINGS} if model_dtype == torch.bfloat16 else set())
        device = str(getattr(self.runner, "device", "cuda"))
        device = f"cuda:{settings.gpu_id}" if device == "cuda" else device
        self.spec = EngineSpec(
            name=f"sglang-{INSTALLED_VERSION}:{Path(settings.model_path).name}",
            vocab_size=int(config.vocab_size),
            hidden_size=int(config.hidden_size),
            num_layers=int(pool.layer_num),
            num_kv_heads=int(pool.head_num),
            head_dim=int(pool.head_dim),
            kv_dtype=kv_dtype_name(pool.dtype),
            device=device,
            max_positions=min(self.max_context, int(getattr(config, "context_len", self.max_context))),
            features=frozenset(features),
        )
        self.tolerance = (1e-3, 1e-3) if pool.dtype == torch.float32 else (5e-2, 1e-1)  # activations in the model dtype
        if settings.run_self_test:
            try:
                self_test(SGLangEngine(self), what=f"the SGLang {INSTALLED_VERSION} adapter on {settings.model_path}")
            except SelfTestError as error:
                hint = (
                    f"the adapter is written for SGLang {SGLANG_VERSION}: a bug in it, to report with this message"
                    if INSTALLED_VERSION == SGLANG_VERSION
                    else f"SGLang {INSTALLED_VERSION} is not the release the adapter is written for: `{PIP_FIX}`"
                )
                raise SelfTestError(f"{error} ({hint})") from error

    def install(self, bound: BoundKV) -> None:
        """Point the pool's per-layer buffers at `bound`'s stacks (SGLang reads them per call)."""
        self.pool.k_buffer = list(bound.keys)
        self.pool.v_buffer = list(bound.values)
        for name, buffers in (("k_data_ptrs", bound.keys), ("v_data_ptrs", bound.values)):
            old = getattr(self.pool, name, None)  # cached pointers some SGLang copy kernels use
            if isinstance(old, torch.Tensor):
                setattr(self.pool, name, torch.tensor([b.data_ptr() for b in buffers], dtype=old.dtype, device=old.device))

    def forward_batch(self, step: SGLangStep, input_embeds: Any) -> Any:
        """A ForwardBatch for `step`, built by hand (ForwardBatch.init_new wants a ScheduleBatch)."""
        device = self.req_to_token.device
        mode = ForwardMode.DECODE if step.mode == MODE_DECODE else ForwardMode.EXTEND
        capture = {CAPTURE_FULL: CaptureHiddenMode.FULL, CAPTURE_LAST: CaptureHiddenMode.LAST}.get(
            step.capture, CaptureHiddenMode.NULL
        )
        seq_lens = step.seq_lens.to(device)
        values: dict[str, Any] = {
            "forward_mode": mode,
            "batch_size": step.batch_size,
            "input_ids": step.input_ids.to(device),
            "req_pool_indices": step.rows.to(device),
            "seq_lens": seq_lens,
            "orig_seq_lens": seq_lens,
            "out_cache_loc": step.out_cache_loc.to(device),
            "seq_lens_sum": step.seq_lens_sum,
            "seq_lens_cpu": step.seq_lens.clone(),
            "positions": step.positions.to(device),
            "input_embeds": input_embeds,
            "capture_hidden_mode": capture,
            "return_hidden_states_before_norm": False,
            "return_logprob": False,
            "global_forward_mode": mode,
            "is_extend_in_batch": mode == ForwardMode.EXTEND,
            "lora_ids": [None] * step.batch_size,
            "rids": [f"flowrt-{i}" for i in range(step.batch_size)],
            "global_num_token_non_padded_cpu": len(step.input_ids),
            # releases <= 0.5.8 carried the pools on the batch
            "req_to_token_pool": self.runner.req_to_token_pool,
            "token_to_kv_pool": self.pool,
            "attn_backend": getattr(self.runner, "attn_backend", None),
        }
        algorithm = _optional("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm")
        if algorithm is not None and hasattr(algorithm, "NONE"):
            values["spec_algorithm"] = algorithm.NONE
        if mode == ForwardMode.EXTEND:
            values.update(
                extend_num_tokens=step.extend_num_tokens,
                extend_seq_lens=step.extend_seq_lens.to(device),
                extend_prefix_lens=step.extend_prefix_lens.to(device),
                extend_start_loc=step.extend_start_loc.to(device),
                extend_prefix_lens_cpu=step.extend_prefix_lens_cpu,
                extend_seq_lens_cpu=step.extend_seq_lens_cpu,
                extend_logprob_start_lens_cpu=step.extend_seq_lens_cpu,  # no input logprobs
            )
        fields = {item.name: item for item in dataclasses.fields(ForwardBatch)}
        required = {
            name
            for name, item in fields.items()
            if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(values))
        if missing:
            raise EngineError(
                f"SGLang {INSTALLED_VERSION}'s ForwardBatch requires {missing}, which the adapter (written for "
                f"{SGLANG_VERSION}) does not set"
            )
        batch = ForwardBatch(**{name: value for name, value in values.items() if name in fields})
        translator = getattr(self.runner, "kv_index_translator", None)
        if translator is not None and hasattr(translator, "rebind_write_loc"):
            translator.rebind_write_loc(batch)  # virtual -> physical slot ids: the identity on an MHA pool
        return batch


_RUNNERS: dict[SGLangSettings, SharedRunner | BaseException] = {}
_RUNNERS_LOCK = threading.Lock()


def shared_runner(settings: SGLangSettings) -> SharedRunner:
    """The process's runner for `settings` (a process holds one: SGLang's distributed set-up is
    process-wide), built and self-tested on first use. A runner that failed to start fails again
    with the same error, unbuilt (a second start in one process would fail on SGLang's set-up)."""
    with _RUNNERS_LOCK:
        if settings not in _RUNNERS:
            if _RUNNERS:
                raise EngineError(
                    f"this process already runs SGLang with {next(iter(_RUNNERS)).model_path}; SGLang sets up one model "
                    f"runner per process: start another process for {settings.model_path}"
                )
            try:
                _RUNNERS[settings] = SharedRunner(settings)
            except BaseException as error:
                _RUNNERS[settings] = error
                raise
        runner = _RUNNERS[settings]
        if isinstance(runner, BaseException):
            raise EngineError(f"the SGLang adapter failed to start earlier in this process: {runner}") from runner
        return runner


class SGLangEngine(StackedKVEngine):
    """flowrt's engine contract on a shared SGLang ModelRunner (see the module docstring). Cheap
    to make: engines on one runner differ only in the stacks they are bound to."""

    unbound_hint = "call bind_kv(stacks) with the pool's block stacks first"

    def __init__(self, shared: SharedRunner):
        self.shared = shared
        self._spec = shared.spec
        self._kv = None
        self.conformance_tolerance = shared.tolerance

    def bind_kv(self, stacks: Any) -> None:
        bound = BoundKV(self._spec, stacks)
        if bound.slot_count >= 2**31:
            raise EngineError(f"{bound.slot_count} token slots do not fit SGLang's int32 slot ids; bind fewer pages")
        self._kv = bound

    def embed(self, token_ids: Sequence[int] | Any) -> Any:
        ids = as_index_tensor(token_ids, "token_ids", "embed()")
        vocab = self._spec.vocab_size
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise EngineError(f"embed(): token ids must lie in 0..{vocab - 1}")
        with torch.no_grad():
            return self.shared.runner.model.get_input_embeddings()(ids.to(self.shared.req_to_token.device))

    def forward(self, batch: StepBatch) -> list[StepResult]:
        checked = check_batch(batch, self._spec, None if self._kv is None else self._kv.slot_count)
        shared = self.shared
        step = plan_step(checked, max_rows=shared.max_rows, max_context=shared.max_context, first_row=shared.first_row)
        with shared.lock, torch.no_grad():
            input_embeds = None
            if step.embedding_requests:
                device, dtype = shared.req_to_token.device, torch.bfloat16
                input_embeds = torch.cat(
                    [
                        self.embed(request.token_ids).to(dtype)
                        if request.token_ids is not None
                        else request.embeddings.to(device, dtype)
                        for request in checked
                    ]
                )
            shared.install(self.bound)
            fill_req_to_token(shared.req_to_token, step)
            output = shared.runner.forward(shared.forward_batch(step, input_embeds))
            output = getattr(output, "logits_output", output)
            output = output[0] if isinstance(output, tuple) else output
            return unpack_outputs(step, checked, output.next_token_logits, output.hidden_states, self._spec.vocab_size)


def open_engine(model_path: str, **settings: Any) -> SGLangEngine:
    """An unbound engine on `model_path` (a local Hugging Face model directory)."""
    return SGLangEngine(shared_runner(SGLangSettings(model_path=model_path, **settings)))


def factory() -> SGLangEngine:
    """The conformance suite's factory: the model of FLOWRT_SGLANG_MODEL, settings from
    FLOWRT_SGLANG_<SETTING> (SGLangSettings)."""
    return SGLangEngine(shared_runner(SGLangSettings.from_env()))


def tiny_factory() -> SGLangEngine:
    """The conformance suite's factory with no model to download: TINY_LLAMA through SGLang,
    dummy-loaded, then given seeded random weights (sglang_plan.reseed_parameters)."""
    overrides = {"model_path": str(tiny_model_dir()), "load_format": "dummy", "random_weights_seed": 0}
    return SGLangEngine(shared_runner(SGLangSettings.from_env(**overrides)))
