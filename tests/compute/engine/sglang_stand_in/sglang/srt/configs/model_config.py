"""Stand-in: a model's shape, read from its config.json."""

from __future__ import annotations

import json
from pathlib import Path


class ModelConfig:
    def __init__(self, hf: dict, context_length: int | None, dtype: str):
        self.hf = hf
        self.vocab_size = hf["vocab_size"]
        self.hidden_size = hf["hidden_size"]
        self.num_hidden_layers = hf["num_hidden_layers"]
        self.context_len = context_length or hf["max_position_embeddings"]
        self.dtype_name = hf.get("torch_dtype", "float32") if dtype == "auto" else dtype

    @classmethod
    def from_server_args(cls, server_args) -> ModelConfig:
        hf = json.loads((Path(server_args.model_path) / "config.json").read_text())
        return cls(hf, server_args.context_length, server_args.dtype)
