"""flowrt.params: the Global Params Pool (shared/DESIGN.md §6, Omni-Flow §4.1).

Paged storage for KV caches and other per-token state, over three tiers: L1 the role
process's device tensors (CUDA where present, else CPU), L2 host shared memory (visible to
every process of the machine), L3 files on local disk (memory-mapped). Its layers, each a
module of its own:

- `layout`: what one parameter is (sub_names x slice_names chunks of page_tokens x heads x
  head_dim) and its layout id; the contract every other layer shares.
- `tiers`: the physical pages of each tier, zero-copy views, and cross-tier copies that move
  contiguous runs of slots as single segments (FlowKV), counting the copies.
- `convert`: the NHD block-stack (device) <-> flat page-major (host, disk) conversion; its
  PyTorch implementation is the specification, cuda/ holds the CUDA kernel.
- `sketch`, `lru`, `slots`: the slot engine (TinyLFU frequency sketch, the four-level
  frequency-aware LRU, per-slot trackers, in-flight deduplication, copy-on-write).
- `meta`: the metadata stores (embedded and Redis), one interface.

It may import flowrt.memory (the shared-memory files of L2) and flowrt's base modules; never
control, deploy, gateway or compute.
"""
