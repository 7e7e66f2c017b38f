"""The SGLang adapter's pure half (flowrt.compute.engine.sglang_plan), on CPU, with no SGLang:
the mapping from flowrt's slot lists to req_to_token rows, out_cache_loc, seq_lens, extend
lengths and positions, checked on hand-written cases and end to end against the reference
engine: an emulation of what SGLang's attention backends do with those tensors (store new K/V at
out_cache_loc, attend over req_to_token[row, :seq_len], causal after the prefix), run on the
reference model's weights, must give what the reference engine gives. And the KV layout mapping
between flowrt's block stacks and SGLang's per-layer buffers; deterministic random weights."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch", reason="the SGLang step mapping works on torch tensors (the torch extra)")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flowrt.compute.engine import (  # noqa: E402
    CAPTURE_HIDDEN_ALL,
    CAPTURE_HIDDEN_LAST,
    CAPTURE_LOGITS,
    EngineError,
    ReferenceConfig,
    ReferenceEngine,
    StepBatch,
    StepRequest,
    kv_stacks,
)
from flowrt.compute.engine.sglang_plan import (  # noqa: E402
    CAPTURE_FULL,
    CAPTURE_LAST,
    CAPTURE_NULL,
    MODE_DECODE,
    MODE_EXTEND,
    MODEL_ENV,
    TINY_LLAMA,
    SGLangSettings,
    buffers_from_stacks,
    fill_req_to_token,
    kv_dtype_name,
    pages_from_buffers,
    pages_into_buffers,
    plan_step,
    reseed_parameters,
    stacks_from_buffers,
    tiny_model_dir,
    unpack_outputs,
)
from flowrt.compute.engine.steps import CheckedRequest, check_batch  # noqa: E402
from flowrt.params.tiers import DeviceTier  # noqa: E402

SPEC = ReferenceEngine(ReferenceConfig(vocab_size=97, seed=1)).describe()
ALL = frozenset({CAPTURE_LOGITS, CAPTURE_HIDDEN_ALL})


def checked(*requests: StepRequest, slot_count: int = 256) -> list[CheckedRequest]:
    return check_batch(StepBatch(list(requests)), SPEC, slot_count)


def plan(*requests: StepRequest, max_rows: int = 8, max_context: int = 64):
    return plan_step(checked(*requests), max_rows=max_rows, max_context=max_context)


# ── hand-written cases ──


def test_a_continued_prefill_beside_a_decode_maps_to_rows_out_cache_loc_and_extend_lengths():
    step = plan(
        StepRequest(token_ids=[5, 6, 7], slots=[40, 41, 12, 13, 14]),  # 2 cached, 3 new
        StepRequest(token_ids=[9], slots=[3, 2, 1, 90]),  # a decode over 3 cached
    )
    assert step.mode == MODE_EXTEND  # a batch with a 3-token request cannot run as a decode batch
    assert step.batch_size == 2
    assert step.rows.tolist() == [1, 2]  # row 0 is SGLang's padding row
    assert step.row_table.dtype == torch.int32
    assert step.row_table.tolist() == [[40, 41, 12, 13, 14], [3, 2, 1, 90, 0]]
    assert step.seq_lens.tolist() == [5, 4] and step.seq_lens_sum == 9
    assert step.out_cache_loc.tolist() == [12, 13, 14, 90]
    assert step.positions.tolist() == [2, 3, 4, 3]
    assert step.input_ids.tolist() == [5, 6, 7, 9]
    assert step.extend_prefix_lens.tolist() == [2, 3] and step.extend_prefix_lens_cpu == [2, 3]
    assert step.extend_seq_lens.tolist() == [3, 1] and step.extend_seq_lens_cpu == [3, 1]
    assert step.extend_prefix_lens.dtype == step.extend_seq_lens.dtype == step.extend_start_loc.dtype == torch.int32
    assert step.extend_start_loc.tolist() == [0, 3] and step.extend_num_tokens == 4
    assert step.last_token_index.tolist() == [2, 3]
    assert step.capture == CAPTURE_NULL and step.embedding_requests == ()


def test_single_id_tokens_run_as_a_decode_batch_and_embeddings_as_an_extend_batch():
    decode = plan(StepRequest(token_ids=[1], slots=[7, 8]), StepRequest(token_ids=[2], slots=[9], positions=[30]))
    assert decode.mode == MODE_DECODE
    assert decode.positions.tolist() == [1, 30]  # the request's positions, not seq_len - 1
    embedded = plan(StepRequest(token_ids=[1], slots=[7, 8]), StepRequest(embeddings=torch.zeros(1, SPEC.hidden_size), slots=[9]))
    assert embedded.mode == MODE_EXTEND  # SGLang's decode path ignores input_embeds
    assert embedded.embedding_requests == (1,)
    assert embedded.input_ids.tolist() == [1, 0]


@pytest.mark.parametrize(
    ("captures", "mode"),
    [
        ([{CAPTURE_LOGITS}], CAPTURE_NULL),
        ([{CAPTURE_LOGITS}, {CAPTURE_HIDDEN_LAST}], CAPTURE_LAST),
        ([{CAPTURE_HIDDEN_LAST}, {CAPTURE_HIDDEN_ALL}], CAPTURE_FULL),
    ],
)
def test_the_capture_mode_is_the_widest_any_request_asks_for(captures, mode):
    requests = [StepRequest(token_ids=[1, 2], slots=[2 * i, 2 * i + 1], capture=frozenset(c)) for i, c in enumerate(captures)]
    assert plan(*requests).capture == mode


def test_what_sglang_cannot_run_is_refused_naming_the_setting():
    with pytest.raises(EngineError, match=r"3 requests, the SGLang adapter has req_to_token rows for 2.*max_requests"):
        plan(*(StepRequest(token_ids=[1], slots=[i]) for i in range(3)), max_rows=2)
    with pytest.raises(EngineError, match="a context of 9 tokens does not fit SGLang's req_to_token rows of 8: .*context_length"):
        plan(StepRequest(token_ids=[1], slots=list(range(9))), max_context=8)
    with pytest.raises(EngineError, match="stores every new token's K/V"):
        plan_step(checked(StepRequest(token_ids=[1], slots=[3], write_kv=False)), max_rows=4, max_context=8)
    with pytest.raises(EngineError, match="causal attention only"):
        plan_step(checked(StepRequest(token_ids=[1], slots=[3], causal=False)), max_rows=4, max_context=8)
    (wide,) = checked(StepRequest(token_ids=[1], slots=[2**31]), slot_count=2**32)
    with pytest.raises(EngineError, match="int32 req_to_token"):
        plan_step([wide], max_rows=4, max_context=8)


def test_filling_req_to_token_changes_only_the_steps_rows():
    table = torch.full((6, 10), -7, dtype=torch.int32)
    step = plan(StepRequest(token_ids=[1, 2], slots=[4, 5, 6]), StepRequest(token_ids=[3], slots=[9, 8]))
    fill_req_to_token(table, step)
    assert table[1, :3].tolist() == [4, 5, 6] and table[2, :2].tolist() == [9, 8]
    assert (table[[0, 3, 4, 5]] == -7).all() and (table[1:3, 3:] == -7).all()  # rows beyond the slots: untouched
    with pytest.raises(EngineError, match=r"req_to_token is \(2, 10\); the step needs rows up to 2"):
        fill_req_to_token(torch.zeros(2, 10, dtype=torch.int32), step)
    with pytest.raises(EngineError, match="3 slots a row"):
        fill_req_to_token(torch.zeros(6, 2, dtype=torch.int32), step)


def test_outputs_come_back_per_request_from_full_or_last_hidden_states():
    requests = checked(
        StepRequest(token_ids=[1, 2, 3], slots=[0, 1, 2], capture=ALL | {CAPTURE_HIDDEN_LAST}),
        StepRequest(token_ids=[4, 5], slots=[3, 4], capture=frozenset({CAPTURE_HIDDEN_LAST})),
    )
    step = plan_step(requests, max_rows=4, max_context=8)
    logits = torch.arange(2 * 100, dtype=torch.bfloat16).view(2, 100)  # a padded vocabulary: 100 >= 97
    hidden = torch.arange(5 * 3, dtype=torch.float32).view(5, 3)
    first, second = unpack_outputs(step, requests, logits, hidden, vocab_size=97)
    assert first.logits.dtype == torch.float32 and first.logits.tolist() == list(range(97))
    assert first.hidden_all.tolist() == hidden[0:3].tolist() and first.hidden_last.tolist() == hidden[2].tolist()
    assert second.logits is None and second.hidden_all is None and second.hidden_last.tolist() == hidden[4].tolist()
    lone = checked(StepRequest(token_ids=[1, 2], slots=[0, 1], capture=frozenset({CAPTURE_HIDDEN_LAST})))
    (only,) = unpack_outputs(plan_step(lone, max_rows=2, max_context=4), lone, None, hidden[:1], 97)  # LAST: one row a request
    assert only.hidden_last.tolist() == hidden[0].tolist()
    with pytest.raises(EngineError, match=r"hidden states of shape \(4, 3\); capture mode full needs 5 rows"):
        unpack_outputs(step, requests, logits, hidden[:4], 97)
    with pytest.raises(EngineError, match=r"logits of shape \(2, 50\); the step needs \(2, 97\)"):
        unpack_outputs(step, requests, logits[:, :50], hidden, 97)


# ── end to end against the reference engine ──


def emulate_sglang(model, step, keys, values, req_to_token, input_embeds=None):
    """What an SGLang attention backend does with a ForwardBatch (as torch_native_backend.py):
    every layer stores the new tokens' K/V at out_cache_loc, then request b's queries attend over
    the slots req_to_token[rows[b], :seq_lens[b]], query i seeing keys up to prefix + i."""
    x = model.embed(step.input_ids) if input_embeds is None else input_embeds
    cos, sin = model.rope_tables(step.positions)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, cos, sin)
        keys[layer][step.out_cache_loc] = k.to(keys[layer].dtype)
        values[layer][step.out_cache_loc] = v.to(values[layer].dtype)
        out = torch.zeros_like(q)
        for b in range(step.batch_size):
            context = req_to_token[step.rows[b], : step.seq_lens[b]].long()
            start, new, prefix = int(step.extend_start_loc[b]), int(step.extend_seq_lens[b]), int(step.extend_prefix_lens[b])
            if step.mode == MODE_DECODE:  # a decode batch: one query, every listed key
                assert new == 1 and prefix == int(step.seq_lens[b]) - 1
            mask = torch.arange(len(context))[None, :] <= (prefix + torch.arange(new))[:, None]
            attended = torch.nn.functional.scaled_dot_product_attention(
                q[start : start + new].transpose(0, 1)[None],
                keys[layer][context].float().transpose(0, 1)[None],
                values[layer][context].float().transpose(0, 1)[None],
                attn_mask=mask,
                scale=1.0 / math.sqrt(model.config.head_dim),
                enable_gqa=True,
            )
            out[start : start + new] = attended[0].transpose(0, 1)
        x = model.finish_layer(layer, x, out)
    hidden = model.final_hidden(x)
    return model.logits(hidden[step.last_token_index]), hidden


@settings(max_examples=25, deadline=None)
@given(
    page_tokens=st.sampled_from([1, 3, 4, 16]),
    shapes=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 6), st.booleans()), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_the_mapping_run_as_sglang_runs_it_equals_the_reference_engine(page_tokens, shapes, seed):
    rng = random.Random(seed)
    config = ReferenceConfig(vocab_size=97, seed=1)
    engine = ReferenceEngine(config)
    pages = -(-sum(cached + new for cached, new, _ in shapes) // page_tokens) + 2
    layout = engine.describe().kv_layout("kv", page_tokens)
    ours, theirs = DeviceTier(layout, pages), DeviceTier(layout, pages)
    for stack in (*ours.stacks, *theirs.stacks):
        stack.fill_(float("nan"))
    engine.bind_kv(kv_stacks(ours))
    keys, values = buffers_from_stacks(theirs.stacks)  # SGLang's buffers: views of the other pool's stacks
    req_to_token = torch.zeros(8, 64, dtype=torch.int32)
    free = iter(rng.sample(range(pages * page_tokens), pages * page_tokens))
    requests = []
    for cached, new, embedded in shapes:
        slots = [next(free) for _ in range(cached + new)]
        tokens = [rng.randrange(97) for _ in range(cached + new)]
        if cached:  # the cached context, stored by an earlier step of both
            earlier = StepRequest(token_ids=tokens[:cached], slots=slots[:cached])
            engine.forward(StepBatch([earlier]))
            before = plan_step(checked(earlier), max_rows=7, max_context=64)
            fill_req_to_token(req_to_token, before)
            emulate_sglang(engine.model, before, keys, values, req_to_token)
        inputs = {"embeddings": engine.embed(tokens[cached:])} if embedded else {"token_ids": tokens[cached:]}
        requests.append(StepRequest(slots=slots, capture=ALL, **inputs))
    want = engine.forward(StepBatch(requests))
    batch = checked(*requests)
    step = plan_step(batch, max_rows=7, max_context=64)
    fill_req_to_token(req_to_token, step)
    embeds = None
    if step.embedding_requests:
        embeds = torch.cat([engine.embed(r.token_ids) if r.token_ids is not None else r.embeddings for r in batch])
    logits, hidden = emulate_sglang(engine.model, step, keys, values, req_to_token, embeds)
    got = unpack_outputs(step, batch, logits, hidden, vocab_size=97)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.allclose(a.logits, b.logits, atol=1e-4), f"request {i}: logits"
        assert torch.allclose(a.hidden_all, b.hidden_all, atol=1e-4), f"request {i}: hidden states"
    for mine, reference in zip(theirs.stacks, ours.stacks, strict=True):  # the same K/V, in the same slots
        assert torch.equal(torch.isnan(mine), torch.isnan(reference))
        assert torch.allclose(mine.nan_to_num(), reference.nan_to_num(), atol=1e-5)


# ── the KV layout ──


def test_sglang_buffers_are_zero_copy_views_of_the_block_stacks():
    layout = SPEC.kv_layout("kv", 4)
    tier = DeviceTier(layout, 6)
    keys, values = buffers_from_stacks(tier.stacks)
    assert len(keys) == len(values) == SPEC.num_layers
    assert tuple(keys[0].shape) == (24, SPEC.num_kv_heads, SPEC.head_dim)
    keys[1][4 * 5 + 2] = 3.0  # token slot 22 = page 5, row 2
    values[0][7] = -1.0  # page 1, row 3
    written = tier.stack("1", "k")
    assert (written[5, 2] == 3.0).all() and written.abs().sum() == 3.0 * SPEC.num_kv_heads * SPEC.head_dim
    assert (tier.stack("0", "v")[1, 3] == -1.0).all()
    back = stacks_from_buffers(keys, values, 4)
    assert all(b.data_ptr() == s.data_ptr() and b.shape == s.shape for b, s in zip(back, tier.stacks, strict=True))
    with pytest.raises(EngineError, match="not whole pages of 5 tokens"):
        stacks_from_buffers(keys, values, 5)
    with pytest.raises(EngineError, match="k, v pairs"):
        buffers_from_stacks(tier.stacks[:3])


def test_pages_read_from_sglang_buffers_are_the_pages_read_pages_gives():
    engine = ReferenceEngine(ReferenceConfig(vocab_size=97, seed=1))
    tier = DeviceTier(engine.describe().kv_layout("kv", 4), 8)
    engine.bind_kv(kv_stacks(tier))
    engine.forward(StepBatch([StepRequest(token_ids=list(range(12)), slots=[20, 21, 22, 23, 4, 5, 6, 7, 28, 29, 30, 31])]))
    keys, values = buffers_from_stacks(tier.stacks)
    data = pages_from_buffers(keys, values, [5, 1, 7], 4)
    assert torch.equal(data, engine.read_pages([5, 1, 7]))
    pages_into_buffers(keys, values, [0, 2, 3], 4, data)  # the inverse, written through the buffers
    assert torch.equal(engine.read_pages([0, 2, 3]), data)
    with pytest.raises(EngineError, match="data must be"):
        pages_into_buffers(keys, values, [0], 4, data)


def test_kv_dtype_names_and_refusals():
    assert [kv_dtype_name(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == ["float32", "bfloat16", "float16"]
    with pytest.raises(EngineError, match="kv_cache_dtype 'auto'"):
        kv_dtype_name(torch.float8_e5m2)


def test_reseeded_weights_are_deterministic_and_well_spread():
    def model():
        layers = torch.nn.ModuleDict(
            {
                "embed_tokens": torch.nn.Embedding(50, 32),
                "input_layernorm": torch.nn.LayerNorm(32),
                "qkv_proj": torch.nn.Linear(32, 96),
                "lm_head": torch.nn.Linear(32, 50, bias=False),
            }
        )
        return layers.to(torch.bfloat16)

    a, b = model(), model()
    assert reseed_parameters(a.named_parameters(), 3) == reseed_parameters(b.named_parameters(), 3) == 6
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(model().qkv_proj.weight, a.qkv_proj.weight)
    assert (a.input_layernorm.weight.float() - 1).abs().max() < 0.6 and a.input_layernorm.bias.abs().sum() == 0
    assert 0.5 < a.embed_tokens.weight.float().std() < 1.5
    assert 0.5 < a.qkv_proj.weight.float().std() * 32**0.5 < 1.5
    assert a.qkv_proj.bias.abs().sum() == 0
    c = model()
    reseed_parameters(c.named_parameters(), 4)
    assert not torch.equal(c.qkv_proj.weight, a.qkv_proj.weight)


# ── settings ──


def test_settings_come_from_the_environment_and_bad_values_are_named(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)
    with pytest.raises(EngineError, match=f"set {MODEL_ENV}=/path/to/a/hf/model"):
        SGLangSettings.from_env()
    monkeypatch.setenv(MODEL_ENV, "/models/qwen")
    monkeypatch.setenv("FLOWRT_SGLANG_ATTENTION_BACKEND", "flashinfer")
    monkeypatch.setenv("FLOWRT_SGLANG_MAX_REQUESTS", "8")
    monkeypatch.setenv("FLOWRT_SGLANG_MEM_FRACTION_STATIC", "0.3")
    monkeypatch.setenv("FLOWRT_SGLANG_RUN_SELF_TEST", "false")
    monkeypatch.setenv("FLOWRT_SGLANG_RANDOM_WEIGHTS_SEED", "7")
    settings = SGLangSettings.from_env(gpu_id=1)
    assert settings == SGLangSettings(
        model_path="/models/qwen",
        attention_backend="flashinfer",
        max_requests=8,
        mem_fraction_static=0.3,
        run_self_test=False,
        random_weights_seed=7,
        gpu_id=1,
    )
    assert hash(settings) == hash(SGLangSettings.from_env(gpu_id=1))  # one shared runner per settings
    monkeypatch.setenv("FLOWRT_SGLANG_MAX_REQUESTS", "many")
    with pytest.raises(EngineError, match="FLOWRT_SGLANG_MAX_REQUESTS='many': give int for the SGLang setting `max_requests`"):
        SGLangSettings.from_env()
    monkeypatch.setenv("FLOWRT_SGLANG_MAX_REQUESTS", "8")
    monkeypatch.setenv("FLOWRT_SGLANG_TRUST_REMOTE_CODE", "perhaps")
    with pytest.raises(EngineError, match="FLOWRT_SGLANG_TRUST_REMOTE_CODE='perhaps': give bool"):
        SGLangSettings.from_env()


def test_the_tiny_model_is_a_consistent_llama_config_written_once():
    import json

    folder = tiny_model_dir()
    assert tiny_model_dir() == folder
    config = json.loads((folder / "config.json").read_text())
    assert config == TINY_LLAMA and config["model_type"] == "llama"
    assert config["num_attention_heads"] * config["head_dim"] == config["hidden_size"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
