// Fuzz target: tensors as a caller (or the Python module's DLPack import) can hand them to pmoe,
// with any dtype, device, rank, extents and strides, including negative, zero and huge ones, and
// a null or real data pointer. Building the view must throw pmoe::Error or give a Tensor whose
// numel, nbytes, contiguity and shape text are computed without overflow or crash; passing it as
// any one argument of AllToAll::dispatch/combine or SimpleMoe::forward (1 rank) must throw
// pmoe::Error unless it is exactly what that argument takes.
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "fuzz_input.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::fuzz {
namespace {

// Extents and strides as a DLPack producer may send them: mostly small, sometimes hostile.
int64_t extent(FuzzInput& in) {
  switch (in.range(0, 9)) {
    case 0: return -int64_t(in.range(1, 3));
    case 1: return int64_t(1) << in.range(31, 62);
    default: return in.range(0, 6);
  }
}

int64_t stride(FuzzInput& in) {
  switch (in.range(0, 9)) {
    case 0: return -int64_t(in.range(1, 3));
    case 1: return int64_t(1) << in.range(31, 62);
    case 2: return 0;
    default: return in.range(1, 24);
  }
}

}  // namespace
}  // namespace pmoe::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pmoe::fuzz::init_fuzzing();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pmoe;
  using namespace pmoe::fuzz;
  FuzzInput in(data, size);
  // Backing memory far larger than any small view needs; views whose reach exceeds it are only
  // built, never read, since every one of them must be refused before a read.
  static std::vector<std::byte> memory(1 << 16);
  const DType dtype = in.pick({DType::f32, DType::bf16, DType::f16, DType::f8e4m3, DType::i32});
  const Device device = in.chance(32) ? Device::cuda(in.range(0, 1)) : Device::cpu();
  const int ndim = in.range(0, 5);
  int64_t shape[8] = {}, strides[8] = {};
  for (int d = 0; d < ndim; ++d) {
    shape[d] = extent(in);
    strides[d] = stride(in);
  }
  const bool row_major = in.chance(160);
  if (row_major) {  // most real arrays are contiguous
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      strides[d] = s;
      if (shape[d] > 0 && shape[d] < (1 << 20) && s < (int64_t(1) << 40)) s *= shape[d];
    }
  }
  void* ptr = in.chance(16) ? nullptr : memory.data();
  Tensor t;
  try {
    t = Tensor(ptr, dtype, ndim, shape, strides, device);
  } catch (const Error&) {
    return 0;  // refused at construction: fine
  }
  // Whatever was accepted must answer these without undefined behaviour, and its element count
  // must be the true one (computed here in 128 bits, in numel()'s order).
  __int128 exact = ndim == 0 ? (ptr ? 1 : 0) : 1;
  for (int d = 0; d < ndim && exact <= INT64_MAX; ++d) exact *= shape[d];
  if (exact > INT64_MAX || exact * __int128(dtype_size(dtype)) > INT64_MAX)
    fuzz_bug("a tensor whose byte count overflows int64 was accepted: " + t.shape_str());
  if (t.numel() != int64_t(exact)) fuzz_bug("numel() is wrong for " + t.shape_str());
  (void)t.numel();
  (void)t.nbytes();
  (void)t.is_contiguous();
  (void)t.shape_str();
  const bool fits = t.numel() >= 0 && t.nbytes() <= memory.size() && t.is_contiguous() &&
                    t.device() == Device::cpu() && ptr != nullptr;

  // One AllToAll and one SimpleMoe of fixed shapes; the fuzzed tensor replaces one argument.
  AllToAllConfig cfg;
  cfg.max_tokens = 4;
  cfg.num_experts = 2;
  cfg.top_k = 2;
  cfg.hidden_dim = 3;
  cfg.in_dtype = DType::bf16;
  cfg.out_dtype = DType::f32;
  const int slot = in.range(0, 9);
  const auto outcomes = run_collective(1, [&](Communicator& comm) {
    if (slot <= 6) {
      AllToAll a2a(comm, cfg);
      Buffer x(DType::bf16, {2, 3}), indices(DType::i32, {2, 2}), counts(DType::i32, {2}),
          expert_x(DType::bf16, {2, 4, 3}), expert_y(DType::f32, {2, 4, 3}),
          weights(DType::f32, {2, 2}), y(DType::f32, {2, 3});
      indices.data<int32_t>()[1] = 1;
      indices.data<int32_t>()[3] = 1;
      Tensor args[7] = {x, indices, counts, expert_x, expert_y, weights, y};
      if (fits) std::memset(ptr, 0, t.nbytes());  // a view that may be read holds zeros
      args[slot] = t;
      a2a.dispatch(args[0], Tensor(), args[1], args[2], args[3], Tensor());
      a2a.combine(args[4], args[1], args[5], args[6]);
    } else {
      MoeConfig mc;
      mc.hidden_dim = 3;
      mc.ffn_dim = 4;
      mc.num_experts = 2;
      mc.top_k = 1;
      SimpleMoe layer(mc, 4);
      Buffer x(DType::f32, {2, 3}), y(DType::f32, {2, 3});
      if (fits) std::memset(ptr, 0, t.nbytes());
      if (slot == 7) layer.forward(t, y);
      else layer.forward(x, t);
    }
  });
  // An accepted call is fine only if the tensor was usable there; a refused one always is.
  if (!outcomes[0].threw && !fits)
    fuzz_bug("a tensor no op can use was accepted: " + t.shape_str() + " " + std::string(dtype_name(t.dtype())) +
             " on " + t.device().str());
  count_outcome(outcomes[0].threw);
  return 0;
}
