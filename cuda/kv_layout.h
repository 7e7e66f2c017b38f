// flowrt KV layout conversion: the launcher kv_layout.cu defines and kv_layout.cpp (the torch
// binding) calls. Plain C++ and the CUDA runtime only, so kv_layout.cu compiles with nvcc alone.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flowrt_kv {

enum Direction : int {
  kStacksToFlat = 0,  // gather: flat[flat_slots[i]][c] = stacks[c][stack_slots[i]]
  kFlatToStacks = 1,  // scatter: stacks[c][stack_slots[i]] = flat[flat_slots[i]][c]
};

// Copies `pages` pages between `chunks` block stacks and a flat page-major buffer, one launch
// for all (page, chunk) pairs. Every pointer is device memory (or memory the device can reach):
//   stack_ptrs[c]   the base address of block stack c, its slots `chunk_bytes` apart
//   stack_slots[i]  the stack slot of page i; flat_slots[i] its flat slot
//   flat            the flat buffer: slot s, chunk c at flat + s * chunks * chunk_bytes + c * chunk_bytes
// Sizes are bytes, so the element type does not matter. 16-byte vector copies are used when
// every stack base, `flat` and `chunk_bytes` are multiples of 16, byte copies otherwise.
cudaError_t launch_kv_layout(const std::int64_t* stack_ptrs, std::int64_t chunks, const std::int64_t* stack_slots,
                             char* flat, const std::int64_t* flat_slots, std::int64_t pages, std::int64_t chunk_bytes,
                             int direction, bool aligned16, cudaStream_t stream);

}  // namespace flowrt_kv
