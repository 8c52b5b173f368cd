// The overlap ops' cross-rank signals on a device: one-thread kernels that count the op's calls,
// raise a rank's own signal word, or wait (bounded) for a peer's, enqueued on the stream whose
// work they order.
//
//   compute stream of rank r:  [call += 1] -> fork
//   copy stream of rank r:     [wait peer's word >= call - behind] [cudaMemcpyAsync piece]
//                              [raise own word = call]
//
// The call number lives in device memory (a word of the op's own signal array, which no peer
// reads) and is bumped by a kernel at the start of every call, so nothing the host passes
// changes from call to call: a captured run() replays with the right numbers. A wait that times
// out writes the peer into the op's fault word (host-mapped memory the host reads at the next
// call's entry) and returns; the rest of the call then runs on whatever the buffers hold, and the
// next call throws. Stream order on one rank, system-scope release and acquire between ranks.
#pragma once

#include <cstdint>
#include <optional>

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

// An op's fault word: host-mapped memory that its timed-out waits write (what, then peer with
// release) and that the host reads at each call's entry without synchronising. The overlap ops and
// TpMoe share it, so there is one reader to get right.
class FaultWord {
 public:
  FaultWord();  // peer = -1: no wait has timed out
  ~FaultWord();
  FaultWord(const FaultWord&) = delete;
  FaultWord& operator=(const FaultWord&) = delete;

  OverlapFault* device() const { return device_; }  // what the wait kernels write
  // The wait that timed out, if one has: its peer read with acquire, so that `what` is that
  // wait's. A timeout is seen at the latest once the host has synchronised with the stream.
  std::optional<OverlapFault> read() const;

 private:
  OverlapFault* host_ = nullptr;
  OverlapFault* device_ = nullptr;
};

// *call += 1: the number of the call that the work enqueued after it belongs to.
void count_call(uint64_t* call, cudaStream_t stream);
// *word = *call, with release (everything before it on `stream` is visible to an acquirer).
void raise_signal(uint64_t* word, const uint64_t* call, cudaStream_t stream);
// Waits until *word >= *call - behind (behind 1: the previous call's value); `peer` and `what`
// name the wait in the fault word on timeout.
void wait_for_signal(uint64_t* word, const uint64_t* call, uint64_t behind, uint64_t timeout_ns,
                     int peer, OverlapWait what, OverlapFault* fault, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
