// The overlap ops' cross-rank signals on a device: one-thread kernels that raise a rank's own
// signal word, or wait (bounded) for a peer's, enqueued on the stream whose work they order.
//
//   copy stream of rank r:  [wait peer's word >= e] [cudaMemcpyAsync piece] [raise own word = e]
//
// A wait that times out writes the peer into the op's fault word (host-mapped memory the host
// reads at the next call's entry) and returns; the rest of the call then runs on whatever the
// buffers hold, and the next call throws. Stream order on one rank, system-scope release and
// acquire between ranks.
#pragma once

#include <cstdint>

#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/flavor.hpp"
#include "cuda/launch.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// Host-mapped: written by a timed-out wait, read by the host.
struct OverlapFault {
  int32_t peer;  // -1 until a wait times out
  int32_t what;  // which wait (see OverlapWait)
};

enum OverlapWait : int32_t { kWaitPiece = 1, kWaitDone = 2 };

void raise_signal(uint64_t* word, uint64_t value, cudaStream_t stream);
// Waits until *word >= value; `peer` and `what` name the wait in the fault word on timeout.
void wait_for_signal(uint64_t* word, uint64_t value, uint64_t timeout_ns, int peer,
                     OverlapWait what, OverlapFault* fault, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
