"""Stand-in: the request -> token-slot table and the per-layer K/V buffers."""

from __future__ import annotations

import os

import torch

# "1": the pool keeps using the buffers it allocated, whatever its k_buffer / v_buffer are set to
# later (as a release caching its buffers at start-up would): flowrt's binding then does not take
IGNORE_REBIND = os.environ.get("STAND_IN_IGNORE_REBIND") == "1"


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: str = "cpu"):
        self.size = size
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device)  # row 0: padding


class MHATokenToKVPool:
    def __init__(self, size: int, page_size: int, dtype, head_num: int, head_dim: int, layer_num: int, device: str = "cpu"):
        self.size, self.page_size, self.dtype = size, page_size, dtype
        self.head_num, self.head_dim, self.layer_num, self.start_layer = head_num, head_dim, layer_num, 0
        shape = (size + page_size, head_num, head_dim)  # the first page: the padding target
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self._own = (self.k_buffer, self.v_buffer)

    def _buffers(self):
        return self._own if IGNORE_REBIND else (self.k_buffer, self.v_buffer)

    def get_key_buffer(self, layer_id: int):
        return self._buffers()[0][layer_id - self.start_layer]

    def get_value_buffer(self, layer_id: int):
        return self._buffers()[1][layer_id - self.start_layer]

    def set_kv_buffer(self, layer_id: int, loc, cache_k, cache_v) -> None:
        keys, values = self._buffers()
        keys[layer_id - self.start_layer][loc] = cache_k.to(self.dtype)
        values[layer_id - self.start_layer][loc] = cache_v.to(self.dtype)
