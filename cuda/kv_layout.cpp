// The torch binding of the KV layout conversion (kv_layout.cu): checks the tensors, gathers the
// block stacks' addresses into a device array, and launches on torch's current stream.
// Built by flowrt.params.convert with torch.utils.cpp_extension.load, only where CUDA is.
//
//   stacks_to_flat(stacks: list[Tensor], stack_slots: Tensor, flat: Tensor, flat_slots: Tensor)
//   flat_to_stacks(flat: Tensor, flat_slots: Tensor, stacks: list[Tensor], stack_slots: Tensor)
//
// stacks: contiguous (S, T, H, D) tensors of one dtype on one CUDA device; flat: a contiguous
// (P, len(stacks), T, H, D) tensor of that dtype on that device; slots: int64 indices on it.

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "kv_layout.h"

namespace {

void run(std::vector<torch::Tensor>& stacks, const torch::Tensor& stack_slots, torch::Tensor& flat,
         const torch::Tensor& flat_slots, int direction) {
  TORCH_CHECK(!stacks.empty(), "kv_layout: no block stacks");
  TORCH_CHECK(flat.is_cuda() && flat.is_contiguous(), "kv_layout: the flat pages must be a contiguous CUDA tensor");
  TORCH_CHECK(flat.dim() == 5 && flat.size(1) == static_cast<int64_t>(stacks.size()),
              "kv_layout: the flat pages must be (slots, chunks, page_tokens, heads, head_dim)");
  TORCH_CHECK(stack_slots.scalar_type() == torch::kInt64 && flat_slots.scalar_type() == torch::kInt64,
              "kv_layout: slots must be int64");
  TORCH_CHECK(stack_slots.numel() == flat_slots.numel(), "kv_layout: one stack slot per flat slot");
  TORCH_CHECK(stack_slots.device() == flat.device() && flat_slots.device() == flat.device(),
              "kv_layout: slots must be on the flat pages' device");
  const auto chunk_elements = flat.size(2) * flat.size(3) * flat.size(4);
  const int64_t chunk_bytes = chunk_elements * flat.element_size();
  std::vector<int64_t> addresses;
  addresses.reserve(stacks.size());
  bool aligned16 = reinterpret_cast<uintptr_t>(flat.data_ptr()) % 16 == 0 && chunk_bytes % 16 == 0;
  for (const auto& stack : stacks) {
    TORCH_CHECK(stack.device() == flat.device() && stack.is_contiguous() && stack.scalar_type() == flat.scalar_type(),
                "kv_layout: every block stack must be contiguous, of the flat pages' dtype, on their device");
    TORCH_CHECK(stack.dim() == 4 && stack.size(1) * stack.size(2) * stack.size(3) == chunk_elements,
                "kv_layout: a block stack's pages must match the flat pages' chunks");
    const auto address = reinterpret_cast<uintptr_t>(stack.data_ptr());
    aligned16 = aligned16 && address % 16 == 0;
    addresses.push_back(static_cast<int64_t>(address));
  }
  const c10::cuda::CUDAGuard guard(flat.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  // the caching allocator is stream-ordered: freeing this array after the launch is safe
  auto stack_ptrs = torch::tensor(addresses, torch::dtype(torch::kInt64)).to(flat.device(), /*non_blocking=*/true);
  auto stack_index = stack_slots.contiguous();
  auto flat_index = flat_slots.contiguous();
  const cudaError_t error = flowrt_kv::launch_kv_layout(
      stack_ptrs.data_ptr<int64_t>(), static_cast<int64_t>(stacks.size()), stack_index.data_ptr<int64_t>(),
      static_cast<char*>(flat.data_ptr()), flat_index.data_ptr<int64_t>(), stack_slots.numel(), chunk_bytes, direction,
      aligned16, stream.stream());
  TORCH_CHECK(error == cudaSuccess, "kv_layout: the kernel did not launch: ", cudaGetErrorString(error));
}

void stacks_to_flat(std::vector<torch::Tensor> stacks, torch::Tensor stack_slots, torch::Tensor flat,
                    torch::Tensor flat_slots) {
  run(stacks, stack_slots, flat, flat_slots, flowrt_kv::kStacksToFlat);
}

void flat_to_stacks(torch::Tensor flat, torch::Tensor flat_slots, std::vector<torch::Tensor> stacks,
                    torch::Tensor stack_slots) {
  run(stacks, stack_slots, flat, flat_slots, flowrt_kv::kFlatToStacks);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flowrt KV layout conversion: NHD block stacks <-> flat page-major pages (cuda/kv_layout.cu)";
  m.def("stacks_to_flat", &stacks_to_flat, "gather pages from the block stacks into flat slots");
  m.def("flat_to_stacks", &flat_to_stacks, "scatter flat slots into the block stacks");
}
