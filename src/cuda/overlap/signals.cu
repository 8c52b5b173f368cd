// The overlap ops' signal kernels (signals.cuh): one block of one thread each.
//
//   call word (own signal array):  c        count_call: c + 1 (read by the kernels after it in
//                                           stream order, and on the copy stream after the fork)
//   signal word of rank r:         e        raise_signal: e = c, release, system scope
//   a peer's word:                 >= c - behind ?   wait_for_signal: acquire, bounded
#include "cuda/overlap/signals.cuh"

#include <cuda/atomic>

#include "cuda/check.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__global__ void count_kernel(uint64_t* call) { store_to_peer(call, *call + 1); }

__global__ void raise_kernel(uint64_t* word, const uint64_t* call) {
  signal_release(word, *call);
}

__global__ void wait_kernel(uint64_t* word, const uint64_t* call, uint64_t behind,
                            uint64_t timeout_ns, int peer, int32_t what, OverlapFault* fault) {
  const uint64_t value = *call - behind;
  const uint64_t start = global_timer_ns();
  while (signal_acquire(word) < value) {
    if (global_timer_ns() - start > timeout_ns) {
      using HostWord = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>;
      HostWord(fault->what).store(what, ::cuda::memory_order_relaxed);
      HostWord(fault->peer).store(peer, ::cuda::memory_order_release);
      return;
    }
    __nanosleep(100);
  }
}

}  // namespace

FaultWord::FaultWord() {
  PMOE_CUDA_CHECK(cudaHostAlloc(&host_, sizeof(OverlapFault), cudaHostAllocMapped));
  host_->peer = -1;
  host_->what = 0;
  PMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
}

FaultWord::~FaultWord() { (void)cudaFreeHost(host_); }

std::optional<OverlapFault> FaultWord::read() const {
  // cuda::atomic_ref: loads the emulated device judges (src/cuda/emulator/host_view.hpp).
  using Word = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>;
  const int32_t peer = Word(host_->peer).load(::cuda::memory_order_acquire);
  if (peer < 0) return std::nullopt;
  return OverlapFault{peer, Word(host_->what).load(::cuda::memory_order_relaxed)};
}

void count_call(uint64_t* call, cudaStream_t stream) {
  launch_shaped(count_kernel, dim3(1), dim3(1), stream, call);
}

void raise_signal(uint64_t* word, const uint64_t* call, cudaStream_t stream) {
  launch_shaped(raise_kernel, dim3(1), dim3(1), stream, word, call);
}

void wait_for_signal(uint64_t* word, const uint64_t* call, uint64_t behind, uint64_t timeout_ns,
                     int peer, OverlapWait what, OverlapFault* fault, cudaStream_t stream) {
  launch_shaped(wait_kernel, dim3(1), dim3(1), stream, word, call, behind, timeout_ns, peer,
                int32_t(what), fault);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
