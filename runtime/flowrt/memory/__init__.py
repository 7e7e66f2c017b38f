"""flowrt.memory: the data plane of one machine (DESIGN §6, first half).

It owns the MemoryManager process (`manager`) and its keeper (`keeper`), the client each
process talks to it with (`client`), the Tmp Buffer Pool's bookkeeping (`pool`) and its slab in
shared memory (`slab`), tensors in frames (`tensors`: handles instead of bytes), weight sharing
and the kv_pool_barrier (`weights`), and what roles see as `ctx.memory` (`api`). The wire format
is `protocol`. It imports only flowrt.transport (sockets, codec) and the base modules; never
control, deploy or the gateway. Guide: docs/memory.md.
"""
