// What AllToAll's kernels receive: one struct, by value. The symmetric region's layout is every
// backend's (src/all_to_all/layout.hpp, drawn there), carried here whole; the kernels read
// every offset from it.
//
//   rank r's symmetric region (device memory, same GPU or CUDA IPC)
//   | dispatch area: block per source s: count+flags | token slots (header, payload, scales) |
//   | combine area: rows (t, j) | row refs (unused here) | combine dtypes | (in-place buffers) |
//   signals: slot s = dispatch data from s; slot W + s = combine rows from s
//
//   rank r's private scratch (device memory)
//   | send_slot [max_tokens, W] i32: token t's slot at destination d, or -1                |
//   | send_position [max_tokens, k] i32: row (t, j)'s position among its expert's rows    |
//   | send_count [W] i32 | send_expert_count [E] i32: rows this rank sends to each rank and |
//   |   expert, added to by every block of send_tokens and cleared by its last block        |
//   | recv_base [W, E_local] i32: the first row of (source, expert) within the expert     |
//   | route_base [E_local] i32 | source_end [W] i32 | slot_count i32                       |
//   | routes [route capacity] Route, in (expert, row) order | route_count i32             |
//   | relay_slot [max_tokens, nodes] i32: token t's slot in node n's relay block, or -1   |
//   | relay_count [nodes] i32: relay slots used, kept for combine's node sum | relay_tally |
//   |   [nodes] i32: what send_tokens' blocks add them up in (all hierarchical only)         |
//   | send_first_bad i32 | epoch u64 | block counters u32 x 3 | owners_ready i32         |
//   | round: the step the device expects next, the m of the last dispatch(send)           |
#pragma once

#include <cstddef>
#include <cstdint>

// Before <cuda_runtime.h>: the emulated device's stand-in defines __noinline__, which the
// standard library headers these pull in spell as an attribute.
#include "all_to_all/layout.hpp"
#include "all_to_all/route.hpp"
#include "all_to_all/step.hpp"
#include "pmoe/shape.hpp"

#include <cuda_runtime.h>

#include "cuda/flavor.hpp"
#include "cuda/transport/transport_state.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

using ::pmoe::detail::AllToAllLayout;
using ::pmoe::detail::Route;
using ::pmoe::detail::Step;

// Codes a kernel leaves in the error word for the host to turn into pmoe::Error.
enum ErrorCode : int32_t {
  kOk = 0,
  kTimeout = 1,        // a peer did not signal in time (detail: the peer)
  kTooManyTokens = 2,  // bound_m outside [0, rows given] (detail: bound_m, value: rows given)
  kBadIndex = 3,       // an index out of range or repeated (detail: position, value: index)
  kDtypeMismatch = 4,  // an owner sent expert_y in another dtype (detail: owner, value: dtype)
  kStepOrder = 5,      // a step ran out of order, as a graph replayed twice does (detail: the
                       // step expected, value: unused; the step that ran is ErrorWord::step)
  kTokensMismatch = 6, // combine's m differs from its dispatch's (detail: combine's, value:
                       // dispatch's)
  kNoRemote = 7,       // a put to a remote peer on a path that has none (detail: the peer)
  kAborted = 8,        // on_peer_loss = mask: a wait ended on the abort word, as the host's
                       // watcher found a peer lost (detail: the peer awaited)
};

// What a timed-out wait waited for (ErrorWord::value of kTimeout), for the host's message.
enum TimeoutWait : int32_t {
  kAwaitedData = 0,     // the peer's data of the step (rows, tokens, partial sums)
  kAwaitedWeights = 1,  // node sum: a source's weights, at its relay
};

// Where this rank's device is in the round, kept on the device because graph replays skip the
// host's checks: each step's kernel checks next_step and advances it, dispatch(send) records m
// for combine(recv) to check.
struct Round {
  int32_t next_step;     // a Step
  int32_t dispatched_m;  // tokens of the last dispatch(send)
};

// A timeout, a dtype mismatch or a step out of order leaves the protocol broken, so every later
// kernel of the rank gives up at once (its waits, and the work of the steps out of order). A bad
// index or m is only reported: the slot counts as -1 (m as clamped, combine's m as dispatch's)
// and every rank still completes, so that peers do not combine stale rows.
__host__ __device__ inline bool is_fatal(int32_t code) {
  return code == kTimeout || code == kDtypeMismatch || code == kStepOrder || code == kNoRemote ||
         code == kAborted;
}

// In device memory, where kernels race for it with atomicCAS; the winner copies it to
// host_mirror (host-mapped pinned memory), which the host reads.
struct ErrorWord {
  int32_t code;    // ErrorCode
  int32_t detail;  // the peer (timeout), m (too many tokens) or the flat index position
  int32_t step;    // the Step whose kernel reported it
  int32_t value;   // the offending index value (bad index); a TimeoutWait (timeout)
  uint64_t call;   // a failed wait's epoch: the call it failed in (the calls before it ended)
  ErrorWord* host_mirror;  // device pointer to the host-mapped copy (unused in the copy itself)
  // on_peer_loss = mask: host-mapped, set by the host's watcher when a peer is found lost, polled
  // by every wait so that the rank's kernels end; null otherwise. Unused in the copy.
  int32_t* abort;
};

// block_counters: last_block() of send_tokens and of return_rows; 1 when a block of send_tokens
// found the step out of order (or an earlier error) and sent nothing.
constexpr int kSendDone = 0, kReturnDone = 1, kSendAborted = 2, kBlockCounters = 3;

// The exchange's MoeShape (max_tokens, num_experts, top_k, hidden_dim) under the config's names,
// then what the kernels derive from it.
struct AllToAllParams : MoeShape {
  int rank, world_size, num_local_experts, scales_per_token;
  int64_t rows_per_expert;
  int in_elem_bytes, y_elem_bytes, out_dtype, y_dtype;  // y_dtype/out_dtype: pmoe::DType values
  AllToAllLayout layout;
  // Symmetric memory: every direct peer's region and signal array (null for a remote peer), and
  // the transport, which also reaches the remote ones (src/cuda/transport/transport.cuh).
  std::byte* regions[kMaxRanks];
  uint64_t* signals[kMaxRanks];
  Transport transport;
  // This call's tensors (device pointers) and m.
  const std::byte* x;
  const float* x_scale;
  const int32_t* indices;
  const float* weights;
  int32_t* expert_num_tokens;
  std::byte* expert_x;
  float* expert_x_scale;
  const std::byte* expert_y;
  std::byte* y;
  int m;                  // rows of x / y given on the host
  // In-place buffers (AllToAllConfig::in_place_buffers). x_in_place: x (and x_scale) is this
  // rank's input buffer, so direct peers read each token from there (dispatch sends headers
  // only). y_in_place: expert_y is this rank's expert output buffer in out_dtype, so direct
  // sources read each row from there (combine sends a row ref, not the row). row_refs: the
  // config asked for in-place buffers, so every owner writes a row ref for each row of a direct
  // source, and reduce_rows reads it.
  bool x_in_place, y_in_place, row_refs;
  int fuse_recv;          // Phase::both: the send kernel's last block does the receive's waits
  const int32_t* bound_m; // or, when set, the actual m, read on the device (graph replays)
  // Private scratch.
  int32_t* send_slot;
  int32_t* send_position;
  int32_t* send_count;
  int32_t* send_expert_count;
  int32_t* relay_slot;   // hierarchical only (layout.hierarchical)
  int32_t* relay_count;
  int32_t* relay_tally;
  int32_t* recv_base;
  int32_t* route_base;
  int32_t* source_end;
  int32_t* slot_count;
  Route* routes;
  int32_t* route_count;
  uint64_t* epoch;
  uint32_t* block_counters;
  int32_t* send_first_bad;  // send_tokens: the first bad index slot (kBadSlotBase - slot), or 0
  int32_t* owners_ready;  // combine: 1 when every owner's rows arrived in the right dtype
  // [W]: 0 for a masked rank (AllToAllConfig::rank_mask), read by every call from device memory
  // so that a captured graph follows a later mask; null without rank_mask (every rank live).
  const int32_t* live;
  Round* round;
  ErrorWord* error;       // device memory; its host_mirror is what the host reads
  uint64_t timeout_ns;
};

// Whether rank r takes part in the calls (not masked).
__device__ __forceinline__ bool is_live(const AllToAllParams& p, int r) {
  return !p.live || p.live[r] != 0;
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
