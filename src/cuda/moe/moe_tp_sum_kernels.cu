// TpMoe's all-reduce sum on the device (moe_kernels.cuh): each rank publishes its element count,
// the sum kernel adds the ranks' f32 partials in rank order once every count matches, and
// CountMismatchRecord carries a mismatch it finds to the host without a synchronisation.
#include "cuda/moe/moe_kernels.cuh"

#include <cuda_bf16.h>

#include <cuda/atomic>

#include "cuda/check.hpp"
#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "cuda/moe/moe_kernel_helpers.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__global__ void publish_count_kernel(uint64_t* word, int64_t n) { store_to_peer(word, uint64_t(n)); }

// Every thread reads the W counts (after the landed waits' acquire): all agree, so all sum or all
// skip; one thread records the mismatch.
template <typename T>
__global__ void __launch_bounds__(kBlockThreads) sum_partials_kernel(const SumPartials s) {
  for (int r = 0; r < s.world; ++r) {
    const int64_t theirs = int64_t(*s.counts[r]);
    if (theirs == s.n) continue;
    if (first_index() == 0) {
      using HostCount = ::cuda::atomic_ref<int64_t, ::cuda::thread_scope_system>;
      using HostWord = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>;
      HostCount(s.mismatch->theirs).store(theirs, ::cuda::memory_order_relaxed);
      HostCount(s.mismatch->mine).store(s.n, ::cuda::memory_order_relaxed);
      HostWord(s.mismatch->peer).store(r, ::cuda::memory_order_release);
    }
    return;
  }
  T* out = static_cast<T*>(s.out);
  for (int64_t e = first_index(); e < s.n; e += grid_step()) {
    float sum = 0.0f;
    for (int r = 0; r < s.world; ++r) sum = __fadd_rn(sum, s.parts[r][e]);
    store_to_peer(out + e, narrow<T>(sum));
  }
}

// One kernel template per element type, f32 or bf16.
template <template <typename> class Kernel, typename Args>
void launch_typed(const char* what, DType dtype, int blocks, cudaStream_t stream, const Args& a) {
  switch (dtype) {
    case DType::f32:
      launch(Kernel<float>::fn, blocks, stream, a);
      return;
    case DType::bf16:
      launch(Kernel<__nv_bfloat16>::fn, blocks, stream, a);
      return;
    default:
      throw Error(detail::cat(what, ": no kernel for ", dtype_name(dtype)));
  }
}

template <typename T>
struct SumParts {
  static constexpr auto fn = sum_partials_kernel<T>;
};

}  // namespace

void launch_publish_count(uint64_t* word, int64_t n, cudaStream_t stream) {
  launch_shaped(publish_count_kernel, dim3(1), dim3(1), stream, word, n);
}

void launch_sum_partials(const SumPartials& s, DType dtype, cudaStream_t stream) {
  launch_typed<SumParts>("TpMoe all-reduce", dtype, blocks_for(s.n), stream, s);
}

CountMismatchRecord::CountMismatchRecord() {
  PMOE_CUDA_CHECK(cudaHostAlloc(&host_, sizeof(CountMismatch), cudaHostAllocMapped));
  *host_ = CountMismatch();
  PMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
}

CountMismatchRecord::~CountMismatchRecord() { (void)cudaFreeHost(host_); }

std::optional<CountMismatch> CountMismatchRecord::take() {
  // cuda::atomic_ref: loads the emulated device judges (src/cuda/emulator/host_view.hpp).
  using Count = ::cuda::atomic_ref<int64_t, ::cuda::thread_scope_system>;
  using Word = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>;
  const int32_t peer = Word(host_->peer).load(::cuda::memory_order_acquire);
  if (peer < 0) return std::nullopt;
  CountMismatch seen;
  seen.theirs = Count(host_->theirs).load(::cuda::memory_order_relaxed);
  seen.mine = Count(host_->mine).load(::cuda::memory_order_relaxed);
  seen.peer = peer;
  Word(host_->peer).store(-1, ::cuda::memory_order_relaxed);
  return seen;
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
