"""The SGLang adapter's pure half: everything about driving SGLang's ModelRunner that needs no
SGLang, so it is tested on any CPU (docs/engines.md, "SGLang adapter").

It owns:

- the pin (`SGLANG_VERSION`, the one SGLang release the adapter is written against) and the
  version check (`installed_sglang_version`, `check_sglang_version`, `require_sglang`). The check
  never imports sglang: it reads the installed distribution's metadata (or, for a source tree on
  the path, its `version.py` as text), so a missing or mismatched SGLang is reported before any
  of its (CUDA-bound) modules load;
- the step mapping (`plan_step`): checked requests (steps.check_batch) -> what a hand-built
  `ForwardBatch` holds: one `req_to_token` row per request holding the slots of its whole context
  (`req_pool_indices`, the rows' contents), `out_cache_loc` (the new tokens' slots), `seq_lens`,
  `extend_prefix_lens` / `extend_seq_lens` / `extend_start_loc`, positions, input ids, the forward
  mode and the hidden-state capture mode; `fill_req_to_token` writes the rows into the table and
  `unpack_outputs` turns SGLang's logits and hidden states back into `StepResult`s;
- the KV layout mapping: flowrt's block stacks (slots, page_tokens, heads, head_dim) <-> SGLang's
  per-layer K and V buffers (token slots, heads, head_dim), zero-copy both ways
  (`buffers_from_stacks`, `stacks_from_buffers`), and whole pages out of and into such buffers in
  the flat page order of L2 and L3 (`pages_from_buffers`, `pages_into_buffers`);
- `SGLangSettings`: how to start SGLang (model, dtype, attention backend, rows, ...), from
  FLOWRT_SGLANG_* variables; `TINY_LLAMA` / `tiny_model_dir`, a tiny Llama config to run SGLang
  on without a download, and `reseed_parameters`, deterministic random weights for a model
  loaded with dummy weights.

Slot ids cross unchanged: flowrt's token slot s is row s of SGLang's K/V buffers, because the
buffers *are* views of flowrt's stacks. SGLang keeps slot 0 (and req_to_token row 0) as a target
for the padding tokens of CUDA-graph batches; the adapter runs no CUDA graphs and never pads, so
slot 0 is an ordinary slot, and the start-up self-test checks a canary there survives.

It must not import sglang (sglang_engine.py alone does), nor any flowrt module outside
flowrt.compute.engine and flowrt.params.layout; torch is imported only when a function runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrt.compute.engine.adapter import CAPTURE_HIDDEN_ALL, CAPTURE_HIDDEN_LAST, CAPTURE_LOGITS, EngineError, StepResult

SGLANG_VERSION = "0.5.23"  # the release shared/research/sglang-surface.md was read against
SGLANG_REQUIREMENT = f"sglang=={SGLANG_VERSION}"
PIP_FIX = "pip install 'flowc[sglang]'"  # the extra pins SGLANG_REQUIREMENT
ANY_VERSION_ENV = "FLOWRT_SGLANG_ANY_VERSION"  # "1": warn on another SGLang instead of refusing (bumping the pin)
SLOT_LIMIT = 2**31  # req_to_token holds int32 slot ids

# ── the version check ──


class SGLangVersionError(ImportError):
    """SGLang is missing, or is another release than the adapter is written against."""


_VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def installed_sglang_version() -> str | None:
    """The installed SGLang's version, None when there is none; never imports sglang."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():  # a source tree on the path: no metadata
        version_file = Path(folder) / "version.py"
        if version_file.is_file():
            found = _VERSION_LINE.search(version_file.read_text(errors="replace"))
            if found:
                return found.group(1)
    return "unknown"


def check_sglang_version(installed: str | None, *, any_version: bool = False) -> str | None:
    """Raise SGLangVersionError unless `installed` is the pinned release; with `any_version`, warn
    instead (for bumping the pin). Returns a warning text, or None."""
    python = sys.executable
    if installed is None:
        raise SGLangVersionError(
            f"flowrt's SGLang adapter needs SGLang {SGLANG_VERSION} ({SGLANG_REQUIREMENT}), and this Python ({python}) "
            f"has no SGLang installed. SGLang runs on CUDA only: on a CUDA machine run `{PIP_FIX}`"
        )
    if installed == SGLANG_VERSION:
        return None
    text = (
        f"flowrt's SGLang adapter is written against SGLang {SGLANG_VERSION} (required: {SGLANG_REQUIREMENT}) "
        f"but SGLang {installed} is installed in {python}; SGLang's internals change from release to release. "
        f"Fix: `{PIP_FIX}` (or `pip install '{SGLANG_REQUIREMENT}'`)"
    )
    if any_version:
        return text + f" [{ANY_VERSION_ENV}=1: going on anyway; the start-up self-test decides]"
    raise SGLangVersionError(text + f", or set {ANY_VERSION_ENV}=1 to try this release while bumping the pin")


def require_sglang() -> str:
    """Check the installed SGLang before anything imports it; returns its version."""
    installed = installed_sglang_version()
    warning = check_sglang_version(installed, any_version=os.environ.get(ANY_VERSION_ENV, "") == "1")
    if warning is not None:
        warnings.warn(warning, stacklevel=2)
    assert installed is not None
    return installed


# ── one step ──


def _torch() -> Any:
    import torch

    return torch


MODE_EXTEND, MODE_DECODE = "extend", "decode"
CAPTURE_NULL, CAPTURE_LAST, CAPTURE_FULL = "null", "last", "full"  # SGLang's CaptureHiddenMode, by name


@dataclass(frozen=True)
class SGLangStep:
    """One flowrt step as SGLang's ModelRunner takes it. CPU tensors; the engine moves them.

    Tokens of the step are those of every request, request after request (T in all)."""

    mode: str  # MODE_EXTEND, or MODE_DECODE (every request one new token, given as an id)
    batch_size: int
    rows: Any  # (B,) int64: each request's req_to_token row (req_pool_indices)
    row_table: Any  # (B, width) int32: row b's slots (its whole context), zero after seq_lens[b]
    seq_lens: Any  # (B,) int64: context lengths, new tokens included
    out_cache_loc: Any  # (T,) int64: the new tokens' slots, where SGLang writes their K/V
    positions: Any  # (T,) int64
    input_ids: Any  # (T,) int64; zeros for requests given embeddings
    embedding_requests: tuple[int, ...]  # requests whose new inputs are embeddings
    extend_prefix_lens: Any  # (B,) int32: cached tokens before each request's new ones
    extend_seq_lens: Any  # (B,) int32: new tokens per request
    extend_start_loc: Any  # (B,) int32: where each request's new tokens begin among the T
    last_token_index: Any  # (B,) int64: each request's last new token among the T
    capture: str  # CAPTURE_NULL / _LAST / _FULL

    @property
    def seq_lens_sum(self) -> int:
        return int(self.seq_lens.sum())

    @property
    def extend_num_tokens(self) -> int:
        return int(self.extend_seq_lens.sum())

    @property
    def extend_prefix_lens_cpu(self) -> list[int]:
        return self.extend_prefix_lens.tolist()

    @property
    def extend_seq_lens_cpu(self) -> list[int]:
        return self.extend_seq_lens.tolist()


def plan_step(checked: Sequence[Any], *, max_rows: int, max_context: int, first_row: int = 1) -> SGLangStep:
    """The step for checked requests (steps.CheckedRequest), rows `first_row ..` of a table of
    `max_rows` usable rows and `max_context` slots per row. Refuses, naming the setting to
    change, what SGLang's kernels cannot run: more requests than rows, a context longer than a
    row, a slot id beyond int32, steps that store nothing or attend bidirectionally."""
    torch = _torch()
    if not checked:
        raise EngineError("forward(): the step has no requests")
    count = len(checked)
    if count > max_rows:
        raise EngineError(
            f"the step has {count} requests, the SGLang adapter has req_to_token rows for {max_rows}: split the step, "
            f"or start the engine with more rows (max_requests / FLOWRT_SGLANG_MAX_REQUESTS)"
        )
    lengths, news, prefixes = [], [], []
    for i, request in enumerate(checked):
        where = f"request {i} of the step"
        if not request.write_kv:
            raise EngineError(
                f"{where}: the SGLang adapter stores every new token's K/V; give the new tokens slots (write_kv=True)"
            )
        if not request.causal:
            raise EngineError(f"{where}: the SGLang adapter runs causal attention only (causal=True)")
        length = len(request.slots)
        if length > max_context:
            raise EngineError(
                f"{where}: a context of {length} tokens does not fit SGLang's req_to_token rows of {max_context}: "
                f"start the engine with a longer context_length"
            )
        if length and int(request.slots.max()) >= SLOT_LIMIT:
            raise EngineError(f"{where}: slot {int(request.slots.max())} does not fit SGLang's int32 req_to_token table")
        lengths.append(length)
        news.append(request.new_tokens)
        prefixes.append(length - request.new_tokens)
    width = max(lengths)
    table = torch.zeros(count, width, dtype=torch.int32)
    for b, request in enumerate(checked):
        table[b, : lengths[b]] = request.slots.to(torch.int32)
    new = torch.tensor(news, dtype=torch.int64)
    starts = torch.cumsum(new, 0) - new
    embedding_requests = tuple(i for i, request in enumerate(checked) if request.token_ids is None)
    ids = [
        request.token_ids if request.token_ids is not None else torch.zeros(request.new_tokens, dtype=torch.int64)
        for request in checked
    ]
    decode = not embedding_requests and all(n == 1 for n in news)
    wanted = set().union(*(request.capture for request in checked))
    capture = CAPTURE_FULL if CAPTURE_HIDDEN_ALL in wanted else CAPTURE_LAST if CAPTURE_HIDDEN_LAST in wanted else CAPTURE_NULL
    return SGLangStep(
        mode=MODE_DECODE if decode else MODE_EXTEND,
        batch_size=count,
        rows=torch.arange(first_row, first_row + count, dtype=torch.int64),
        row_table=table,
        seq_lens=torch.tensor(lengths, dtype=torch.int64),
        out_cache_loc=torch.cat([request.slots[p:] for request, p in zip(checked, prefixes, strict=True)]).to(torch.int64),
        positions=torch.cat([request.positions for request in checked]).to(torch.int64),
        input_ids=torch.cat(ids).to(torch.int64),
        embedding_requests=embedding_requests,
        extend_prefix_lens=torch.tensor(prefixes, dtype=torch.int32),
        extend_seq_lens=new.to(torch.int32),
        extend_start_loc=starts.to(torch.int32),
        last_token_index=starts + new - 1,
        capture=capture,
    )


def fill_req_to_token(req_to_token: Any, step: SGLangStep) -> None:
    """Write the step's rows into SGLang's req_to_token table (any device), in place: the
    attention backends hold that very tensor. Only the step's rows change."""
    torch = _torch()
    rows, width = req_to_token.shape
    if int(step.rows.max()) >= rows or step.row_table.shape[1] > width:
        raise EngineError(
            f"req_to_token is ({rows}, {width}); the step needs rows up to {int(step.rows.max())} and "
            f"{step.row_table.shape[1]} slots a row: start the engine with more rows or a longer context_length"
        )
    index = step.rows.to(req_to_token.device)
    req_to_token[index, : step.row_table.shape[1]] = step.row_table.to(req_to_token.device, torch.int32)


def unpack_outputs(step: SGLangStep, checked: Sequence[Any], logits: Any, hidden: Any, vocab_size: int) -> list[StepResult]:
    """Each request's captures from SGLang's outputs: `logits` (B, >= vocab) last-token rows,
    `hidden` final hidden states, all tokens' (T, hidden) or the last token's (B, hidden), or
    None. Copies, as float32. Raises when the shapes are not what the step asked for (a sign
    SGLang's outputs changed)."""
    torch = _torch()
    tokens = int(step.extend_seq_lens.sum())
    wants_logits = any(CAPTURE_LOGITS in request.capture for request in checked)
    if wants_logits and (
        logits is None or logits.dim() != 2 or logits.shape[0] != step.batch_size or logits.shape[1] < vocab_size
    ):
        got = None if logits is None else tuple(logits.shape)
        raise EngineError(f"SGLang returned next-token logits of shape {got}; the step needs ({step.batch_size}, {vocab_size})")
    if step.capture != CAPTURE_NULL:
        rows = tokens if step.capture == CAPTURE_FULL else step.batch_size
        if hidden is None or hidden.dim() != 2 or hidden.shape[0] != rows:
            got = None if hidden is None else tuple(hidden.shape)
            raise EngineError(f"SGLang returned hidden states of shape {got}; capture mode {step.capture} needs {rows} rows")
    results = []
    for b, request in enumerate(checked):
        start = int(step.extend_start_loc[b])
        end = start + int(step.extend_seq_lens[b])
        result = StepResult()
        if CAPTURE_LOGITS in request.capture:
            result.logits = logits[b, :vocab_size].to(torch.float32).clone()
        if CAPTURE_HIDDEN_LAST in request.capture:
            row = end - 1 if step.capture == CAPTURE_FULL else b
            result.hidden_last = hidden[row].to(torch.float32).clone()
        if CAPTURE_HIDDEN_ALL in request.capture:
            result.hidden_all = hidden[start:end].to(torch.float32).clone()
        results.append(result)
    return results


# ── KV layout: flowrt's block stacks <-> SGLang's per-layer buffers ──


def buffers_from_stacks(stacks: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """SGLang's per-layer K and V buffers (token slots, heads, head_dim) as zero-copy views of
    flowrt's block stacks, given in `KVLayout.chunks()` order (layer-major, then k, v)."""
    if len(stacks) % 2:
        raise EngineError(f"block stacks come in k, v pairs per layer; got {len(stacks)}")
    flat = []
    for stack in stacks:
        if stack.dim() != 4 or not stack.is_contiguous():
            raise EngineError(
                f"a block stack is a contiguous (slots, page_tokens, heads, head_dim) tensor, not {tuple(stack.shape)}"
            )
        flat.append(stack.view(stack.shape[0] * stack.shape[1], stack.shape[2], stack.shape[3]))
    return flat[0::2], flat[1::2]


def stacks_from_buffers(keys: Sequence[Any], values: Sequence[Any], page_tokens: int) -> list[Any]:
    """The inverse view: per-layer buffers (token slots, heads, head_dim) as block stacks of
    `page_tokens`-token pages, in chunks() order. A buffer must hold whole pages (an SGLang pool
    of `size` tokens and page size p has size + p rows: whole pages when page_tokens is p)."""
    if len(keys) != len(values):
        raise EngineError(f"{len(keys)} key buffers but {len(values)} value buffers; give one of each per layer")
    stacks = []
    for layer, pair in enumerate(zip(keys, values, strict=True)):
        for name, buffer in zip("kv", pair, strict=True):
            if buffer.dim() != 3 or not buffer.is_contiguous():
                raise EngineError(f"layer {layer} {name}: a buffer is a contiguous (slots, heads, head_dim) tensor")
            if buffer.shape[0] % page_tokens:
                raise EngineError(
                    f"layer {layer} {name}: {buffer.shape[0]} token slots are not whole pages of {page_tokens} tokens"
                )
            stacks.append(buffer.view(buffer.shape[0] // page_tokens, page_tokens, buffer.shape[1], buffer.shape[2]))
    return stacks


def page_token_index(pages: Iterable[int], page_tokens: int, device: Any = "cpu") -> Any:
    """(n, page_tokens) int64: the token slots of each page."""
    torch = _torch()
    pages = torch.as_tensor(list(pages), dtype=torch.int64)
    return (pages[:, None] * page_tokens + torch.arange(page_tokens)).to(device)


def pages_from_buffers(keys: Sequence[Any], values: Sequence[Any], pages: Sequence[int], page_tokens: int) -> Any:
    """Whole pages of per-layer buffers as (n, chunks, page_tokens, heads, head_dim), chunks in
    KVLayout.chunks() order: what `read_pages` gives, read straight from SGLang-shaped buffers."""
    torch = _torch()
    index = page_token_index(pages, page_tokens, keys[0].device)
    chunks = [buffer[index] for layer in zip(keys, values, strict=True) for buffer in layer]  # each (n, pt, h, d)
    return torch.stack(chunks, dim=1)


def pages_into_buffers(keys: Sequence[Any], values: Sequence[Any], pages: Sequence[int], page_tokens: int, data: Any) -> None:
    """The inverse of pages_from_buffers: write (n, chunks, page_tokens, heads, head_dim)."""
    index = page_token_index(pages, page_tokens, keys[0].device)
    buffers = [buffer for layer in zip(keys, values, strict=True) for buffer in layer]
    expected = (len(index), len(buffers), page_tokens, *keys[0].shape[1:])
    if tuple(data.shape) != expected:
        raise EngineError(f"pages_into_buffers(): data must be {expected}, not {tuple(data.shape)}")
    for chunk, buffer in enumerate(buffers):
        buffer[index.flatten()] = data[:, chunk].reshape(-1, *buffer.shape[1:]).to(buffer.device, buffer.dtype)


def kv_dtype_name(dtype: Any) -> str:
    """flowrt's name of a torch dtype SGLang stores K/V in; refuses what flowrt's pages cannot hold."""
    torch = _torch()
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    if dtype not in names:
        raise EngineError(
            f"SGLang stores this model's K/V as {dtype}; the adapter binds float32, bfloat16 or float16 K/V: "
            f"start it with kv_cache_dtype 'auto' and a model dtype of one of those"
        )
    return names[dtype]


# ── settings ──

MODEL_ENV = "FLOWRT_SGLANG_MODEL"


@dataclass(frozen=True)
class SGLangSettings:
    """How to start SGLang for flowrt. `from_env` reads FLOWRT_SGLANG_<SETTING> for each."""

    model_path: str
    dtype: str = "auto"  # the model's dtype ("bfloat16", "float16", "float32", or its config's)
    attention_backend: str = "triton"  # any of SGLang's that reads req_to_token (triton, flashinfer, fa3, torch_native)
    max_requests: int = 64  # req_to_token rows: requests a step may hold
    context_length: int | None = None  # slots per row (None: the model's)
    pool_tokens: int = 4096  # SGLang's own K/V pool, unused once bound (kept small)
    mem_fraction_static: float = 0.6
    load_format: str = "auto"  # "dummy": no weights read (random ones with random_weights_seed)
    random_weights_seed: int | None = None
    gpu_id: int = 0
    trust_remote_code: bool = False
    run_self_test: bool = True

    @classmethod
    def from_env(cls, **overrides: Any) -> SGLangSettings:
        """Settings from FLOWRT_SGLANG_MODEL and FLOWRT_SGLANG_<SETTING> (e.g. _ATTENTION_BACKEND,
        _MAX_REQUESTS), then `overrides`; a value that does not parse is refused, naming it."""
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):
            variable = MODEL_ENV if item.name == "model_path" else f"FLOWRT_SGLANG_{item.name.upper()}"
            text = os.environ.get(variable)
            if text is None:
                continue
            kind = str(item.type)
            try:
                if "bool" in kind:
                    if text.strip().lower() not in ("1", "0", "true", "false", "yes", "no"):
                        raise ValueError(text)
                    values[item.name] = text.strip().lower() in ("1", "true", "yes")
                elif "int" in kind:
                    values[item.name] = int(text)
                elif "float" in kind:
                    values[item.name] = float(text)
                else:
                    values[item.name] = text
            except ValueError:
                raise EngineError(
                    f"{variable}={text!r}: give {kind.replace(' | None', '')} for the SGLang setting `{item.name}`"
                ) from None
        values.update(overrides)
        if not values.get("model_path"):
            raise EngineError(
                f"the SGLang adapter needs a model: set {MODEL_ENV}=/path/to/a/hf/model (a local directory; "
                f"or use sglang_engine:tiny_factory, a random-weight tiny Llama)"
            )
        return cls(**values)


TINY_LLAMA = {  # a Llama small enough to start in seconds; weights are drawn, never downloaded
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_model_dir() -> Path:
    """A directory holding TINY_LLAMA's config.json (the same path for the same config)."""
    text = json.dumps(TINY_LLAMA, indent=1, sort_keys=True)
    folder = Path(tempfile.gettempdir()) / f"flowrt-sglang-tiny-llama-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(text)
    return folder


# ── random weights for a dummy-loaded model ──


def reseed_parameters(named_parameters: Iterable[tuple[str, Any]], seed: int) -> int:
    """Give a model deterministic random weights, in place (every process gets the same): norm
    weights 1 + 0.1 N(0, 1), embeddings N(0, 1), the output head N(0, 1) * 3 / sqrt(in), other
    matrices N(0, 1) / sqrt(in), other vectors (biases) 0. Logits then spread over a few units,
    like the reference engine's, so greedy choices are far from ties. Returns how many tensors
    were set. Parameters are visited in name order (the draw does not depend on module order)."""
    torch = _torch()
    generator = torch.Generator().manual_seed(seed)
    count = 0
    with torch.no_grad():
        for name, parameter in sorted(named_parameters, key=lambda item: item[0]):
            shape = tuple(parameter.shape)
            if len(shape) == 1 and "norm" in name and name.endswith("weight"):
                value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
            elif len(shape) == 1:  # biases, norm biases included
                value = torch.zeros(shape)
            elif "embed" in name:
                value = torch.randn(shape, generator=generator)
            elif "lm_head" in name:
                value = torch.randn(shape, generator=generator) * (3.0 / shape[-1] ** 0.5)
            else:
                value = torch.randn(shape, generator=generator) / shape[-1] ** 0.5
            parameter.copy_(value.to(parameter.device, parameter.dtype))
            count += 1
    return count
