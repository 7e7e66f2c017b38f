"""Stand-in: the server arguments the adapter sets, and the port arguments."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerArgs:
    model_path: str
    dtype: str = "auto"
    device: str = "cpu"  # the stand-in runs where a test can: flowrt asks for cuda, the stand-in ignores it
    tp_size: int = 1
    page_size: int = 1
    attention_backend: str = "triton"
    disable_cuda_graph: bool = False
    disable_radix_cache: bool = False
    skip_tokenizer_init: bool = False
    max_running_requests: int = 16
    max_total_tokens: int = 1024
    mem_fraction_static: float = 0.8
    load_format: str = "auto"
    context_length: int | None = None
    trust_remote_code: bool = False
    base_gpu_id: int = 0

    def __post_init__(self):
        assert self.page_size == 1 and self.tp_size == 1 and self.disable_cuda_graph and self.disable_radix_cache
        self.device = "cpu"


@dataclass
class PortArgs:
    nccl_port: int

    @classmethod
    def init_new(cls, server_args: ServerArgs) -> PortArgs:
        return cls(nccl_port=0)
