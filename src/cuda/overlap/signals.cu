// The overlap ops' signal kernels (signals.cuh): one block of one thread each.
#include "cuda/overlap/signals.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__global__ void raise_kernel(uint64_t* word, uint64_t value) { signal_release(word, value); }

__global__ void wait_kernel(uint64_t* word, uint64_t value, uint64_t timeout_ns, int peer,
                            int32_t what, OverlapFault* fault) {
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

void raise_signal(uint64_t* word, uint64_t value, cudaStream_t stream) {
  launch_shaped(raise_kernel, dim3(1), dim3(1), stream, word, value);
}

void wait_for_signal(uint64_t* word, uint64_t value, uint64_t timeout_ns, int peer,
                     OverlapWait what, OverlapFault* fault, cudaStream_t stream) {
  launch_shaped(wait_kernel, dim3(1), dim3(1), stream, word, value, timeout_ns, peer,
                int32_t(what), fault);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
