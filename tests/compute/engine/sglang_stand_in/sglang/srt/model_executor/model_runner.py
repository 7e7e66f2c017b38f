"""Stand-in: a ModelRunner whose forward runs flowrt's reference model with SGLang's slot
semantics (the package docstring), reading the pool's buffers and req_to_token at call time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from flowrt.compute.engine.reference_model import ReferenceConfig, ReferenceModel
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode


@dataclass
class LogitsProcessorOutput:
    next_token_logits: Any
    hidden_states: Any = None


@dataclass
class ModelRunnerOutput:
    logits_output: LogitsProcessorOutput
    can_run_graph: bool


class StandInModel:
    """The reference model, its weights seen as named parameters (shared storage)."""

    def __init__(self, hf: dict):
        heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
        self.reference = ReferenceModel(
            ReferenceConfig(
                vocab_size=hf["vocab_size"],
                hidden_size=hf["hidden_size"],
                num_layers=hf["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=hf.get("head_dim", hf["hidden_size"] // heads),
                intermediate_size=hf["intermediate_size"],
            )
        )

    def named_parameters(self):
        model = self.reference
        yield "model.embed_tokens.weight", torch.nn.Parameter(model.embedding, requires_grad=False)
        for i, layer in enumerate(model.layers):
            for name, tensor in vars(layer).items():
                label = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}.get(name, name)
                yield f"model.layers.{i}.{label}.weight", torch.nn.Parameter(tensor, requires_grad=False)
        yield "model.norm.weight", torch.nn.Parameter(model.final_norm, requires_grad=False)
        yield "lm_head.weight", torch.nn.Parameter(model.lm_head, requires_grad=False)

    def get_input_embeddings(self):
        return lambda ids: self.reference.embed(ids).to(torch.bfloat16)  # the model's dtype


class ModelRunner:
    def __init__(self, model_config, mem_fraction_static, gpu_id, tp_rank, tp_size, nccl_port, server_args):
        hf = model_config.hf
        self.device = "cpu"
        self.model_config = model_config
        self.dtype = getattr(torch, model_config.dtype_name)
        self.model = StandInModel(hf)
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim", hf["hidden_size"] // heads)
        self.req_to_token_pool = ReqToTokenPool(server_args.max_running_requests, model_config.context_len)
        self.token_to_kv_pool = MHATokenToKVPool(
            server_args.max_total_tokens, 1, self.dtype, hf["num_key_value_heads"], head_dim, hf["num_hidden_layers"]
        )
        self.attn_backend = "stand-in"

    @torch.no_grad()
    def forward(self, batch) -> ModelRunnerOutput:
        model, pool = self.model.reference, self.token_to_kv_pool
        table = self.req_to_token_pool.req_to_token
        if batch.input_embeds is not None:
            x = batch.input_embeds.bfloat16().float()  # SGLang casts input_embeds to bfloat16
        else:
            x = model.embed(batch.input_ids).to(self.dtype).float()
        cos, sin = model.rope_tables(batch.positions)
        count = batch.batch_size
        if batch.forward_mode.is_decode():
            new = torch.ones(count, dtype=torch.int64)
            assert batch.extend_seq_lens is None
        else:
            new = batch.extend_seq_lens.long()
            assert new.sum() == batch.extend_num_tokens and (batch.extend_prefix_lens + new == batch.seq_lens).all()
        starts = torch.cumsum(new, 0) - new
        for layer in range(model.config.num_layers):
            q, k, v = model.qkv(layer, x, cos, sin)
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
            out = torch.zeros_like(q)
            for b in range(count):
                context = table[batch.req_pool_indices[b], : batch.seq_lens[b]].long()
                start, n = int(starts[b]), int(new[b])
                prefix = int(batch.seq_lens[b]) - n
                mask = torch.arange(len(context))[None, :] <= (prefix + torch.arange(n))[:, None]
                attended = torch.nn.functional.scaled_dot_product_attention(
                    q[start : start + n].transpose(0, 1)[None],
                    pool.get_key_buffer(layer)[context].float().transpose(0, 1)[None],
                    pool.get_value_buffer(layer)[context].float().transpose(0, 1)[None],
                    attn_mask=mask,
                    scale=1.0 / math.sqrt(model.config.head_dim),
                    enable_gqa=True,
                )
                out[start : start + n] = attended[0].transpose(0, 1)
            x = model.finish_layer(layer, x, out)
        hidden = model.final_hidden(x)
        last = starts + new - 1
        captured = {CaptureHiddenMode.FULL: hidden, CaptureHiddenMode.LAST: hidden[last]}.get(batch.capture_hidden_mode)
        logits = model.logits(hidden[last])
        return ModelRunnerOutput(LogitsProcessorOutput(logits, captured), can_run_graph=False)
