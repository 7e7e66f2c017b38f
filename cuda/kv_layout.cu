// flowrt KV layout conversion kernels: NHD block stacks <-> flat page-major pages.
//
// One block stack per (sub, slice) chunk holds `chunk_bytes` per slot; a flat page holds the
// `chunks` chunks of one slot back to back. A launch covers every (page, chunk) pair: a CUDA
// block takes one pair at a time (grid-stride) and its threads copy the chunk's bytes, as
// 16-byte vectors when everything is aligned to 16 bytes, else byte by byte. The element type
// never matters: float16, bfloat16, float32, float8 and int8 pages move the same way.
//
// Depends on the CUDA runtime only (no torch headers): `nvcc -c kv_layout.cu` builds it alone.
// The PyTorch implementation in flowrt/params/convert.py is the specification.

#include "kv_layout.h"

namespace flowrt_kv {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;

template <typename Word, int kDirection>
__global__ void kv_layout_kernel(const std::int64_t* __restrict__ stack_ptrs, std::int64_t chunks,
                                 const std::int64_t* __restrict__ stack_slots, char* __restrict__ flat,
                                 const std::int64_t* __restrict__ flat_slots, std::int64_t pages,
                                 std::int64_t chunk_bytes) {
  const std::int64_t words = chunk_bytes / static_cast<std::int64_t>(sizeof(Word));
  const std::int64_t pairs = pages * chunks;
  const std::int64_t page_bytes = chunks * chunk_bytes;
  for (std::int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const std::int64_t page = pair / chunks;
    const std::int64_t chunk = pair - page * chunks;
    char* stack_chunk = reinterpret_cast<char*>(stack_ptrs[chunk]) + stack_slots[page] * chunk_bytes;
    char* flat_chunk = flat + flat_slots[page] * page_bytes + chunk * chunk_bytes;
    const Word* src = reinterpret_cast<const Word*>(kDirection == kStacksToFlat ? stack_chunk : flat_chunk);
    Word* dst = reinterpret_cast<Word*>(kDirection == kStacksToFlat ? flat_chunk : stack_chunk);
    for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      dst[w] = src[w];
    }
  }
}

template <typename Word>
cudaError_t launch_words(const std::int64_t* stack_ptrs, std::int64_t chunks, const std::int64_t* stack_slots, char* flat,
                         const std::int64_t* flat_slots, std::int64_t pages, std::int64_t chunk_bytes, int direction,
                         cudaStream_t stream) {
  const std::int64_t pairs = pages * chunks;
  const unsigned blocks = static_cast<unsigned>(pairs < kMaxBlocks ? pairs : kMaxBlocks);
  if (direction == kStacksToFlat) {
    kv_layout_kernel<Word, kStacksToFlat>
        <<<blocks, kThreads, 0, stream>>>(stack_ptrs, chunks, stack_slots, flat, flat_slots, pages, chunk_bytes);
  } else {
    kv_layout_kernel<Word, kFlatToStacks>
        <<<blocks, kThreads, 0, stream>>>(stack_ptrs, chunks, stack_slots, flat, flat_slots, pages, chunk_bytes);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_kv_layout(const std::int64_t* stack_ptrs, std::int64_t chunks, const std::int64_t* stack_slots,
                             char* flat, const std::int64_t* flat_slots, std::int64_t pages, std::int64_t chunk_bytes,
                             int direction, bool aligned16, cudaStream_t stream) {
  if (pages <= 0 || chunks <= 0 || chunk_bytes <= 0) {
    return cudaSuccess;
  }
  if (direction != kStacksToFlat && direction != kFlatToStacks) {
    return cudaErrorInvalidValue;
  }
  if (aligned16 && chunk_bytes % 16 == 0) {
    return launch_words<uint4>(stack_ptrs, chunks, stack_slots, flat, flat_slots, pages, chunk_bytes, direction, stream);
  }
  return launch_words<unsigned char>(stack_ptrs, chunks, stack_slots, flat, flat_slots, pages, chunk_bytes, direction,
                                     stream);
}

}  // namespace flowrt_kv
