// The GPU side of `pmoe-bench all-to-all --device cuda`: ranks are threads sharing one GPU
// (run_ranks with Device::cuda), or MPI processes spread over the node's GPUs; pmoe's dispatch
// and combine are checked against the reference, then timed with CUDA events on each rank's
// stream, twice: events around a replay of the op captured in a CUDA graph (the kernels' time),
// and events recorded before the host's launches (the host-inclusive time; with ranks sharing a
// GPU the slowest rank's includes the other ranks' launches). With config.in_place_buffers, x is
// a view of AllToAll::input_buffer() and expert_y is expert_output_buffer(), as an MoE layer
// passes them; else the caller's own buffers. On the emulated device one dispatch and one combine are also
// counted (every rank's kernels), with the bytes they moved beside the minimum. The roofline, timed the same way in the same run, is every rank copying into the next
// rank's memory at once: the peer (NVLink) copy rate where ranks sit on different GPUs, a local
// device-to-device copy where they share one, named by copy_kind (left out on the emulated
// device: copy_gbps stays 0). Beside them, in the same run, NCCL's all-to-all-v of the same rows
// (nccl_all_to_all_v.hpp), or why it could not run here. Throws pmoe::Error where the build has
// no CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "all_to_all/traffic.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/diagnostics/kernel_counts.hpp"

namespace pmoe::bench {

struct CudaAllToAllResult {
  // Per iteration, slowest rank: events around a graph replay of the op (the kernels' time).
  std::vector<double> dispatch_us, combine_us;
  // Per iteration, slowest rank: the start event recorded before the host's launches.
  std::vector<double> dispatch_host_us, combine_host_us;
  std::vector<double> dispatch_send_us, dispatch_recv_us, combine_send_us, combine_recv_us;
  double copy_gbps = 0;       // per rank, all ranks copying at once: (read + written) / time
  std::string copy_kind = "none (emulated device)";  // what copy_gbps measured
  double dispatch_bytes = 0;  // what dispatch must read and write per rank (mean over ranks)
  double combine_bytes = 0;
  bool in_place = false;  // which buffers the op ran on (see run_all_to_all_cuda)
  // The emulated device only (empty on a GPU): every rank's kernels of one dispatch and of one
  // combine (Phase::both), counted.
  std::vector<KernelCounts> dispatch_counts, combine_counts;
  size_t workspace_bytes = 0;
  // What one dispatch / one combine sent to peers on other nodes (config.ranks_per_node), this
  // rank: bytes put and transfers (puts and lone signals), from AllToAll::remote_traffic().
  AllToAll::RemoteTraffic dispatch_network, combine_network;
  // Every rank's, per op: the network as measured (remote_traffic() around one call), and every
  // link as count_traffic counts the same routing (load/store and same rank are known only from
  // the count: stores leave no counter).
  struct RankLinks {
    AllToAll::RemoteTraffic network;
    detail::RankTraffic counted;
  };
  std::vector<RankLinks> dispatch_links, combine_links;
  // NCCL's all-to-all-v: the round trip (dispatch + combine) per iteration, slowest rank; or,
  // where it did not run, why (the same text on every rank).
  std::vector<double> nccl_us;
  std::string nccl_not_run;
};

// What the roofline copy measures when rank r sits on GPU device_of[r] and copies to rank r + 1.
std::string roofline_kind(const std::vector<int>& device_of);

// Collective over a CUDA communicator. Throws pmoe::Error if a check fails. `mode`: how the
// config sends tokens across nodes, for count_traffic.
CudaAllToAllResult run_all_to_all_cuda(Communicator& comm, const AllToAllConfig& config,
                                       int tokens, uint64_t seed, int warmup, int iters,
                                       detail::TrafficMode mode = detail::TrafficMode::direct);

}  // namespace pmoe::bench
