"""A CPU stand-in for SGLang, for flowrt's tests only (tests/compute/engine/sglang_stand_in/README.md).

It has the few names flowrt.compute.engine.sglang_engine imports, with the semantics
shared/research/sglang-surface.md §1.1 reads in SGLang's attention backends: each layer stores the
new tokens' K/V at `out_cache_loc` in the pool's per-layer buffers, then request b attends over
the slots `req_to_token[req_pool_indices[b], :seq_lens[b]]`, causally after its prefix. The model
is flowrt's reference model. It shows the adapter's own code runs and keeps the engine contract
given those semantics; it says nothing about whether real SGLang keeps them.
"""

__version__ = "0.5.23"
