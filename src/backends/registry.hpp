// The one place an op gets its backend. Each backend is a table of makers, one per op: the CPU's
// (src/cpu/backends.cpp) and one per compilation of src/cuda (src/cuda/backends.cu: nvcc's for a
// GPU, the host compiler's for the emulated device). An op's front end validates its config, then
// asks backends(device) for its maker and calls it; it never branches on the device itself.
//
// This sits above core/ and the ops: core's DeviceRuntime knows nothing of the ops, and says only
// which compilation it is (DeviceRuntime::kind()), which picks the device's table here.
#pragma once

#include <memory>

#include "backends/all_to_all_backend.hpp"
#include "backends/moe_backend.hpp"
#include "backends/overlap_backend.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::detail {

// Every maker takes a config the front end validated (and agreed on between ranks); the overlap
// configs have chunks resolved (never 0). A device maker runs on the rank's stream (the
// communicator's, or `stream` for SimpleMoe).
struct Backends {
  std::unique_ptr<AllToAllBackend> (*make_all_to_all)(Communicator& comm,
                                                      const AllToAllConfig& config);
  std::unique_ptr<OverlapBackend> (*make_all_gather_gemm)(Communicator& comm,
                                                          const OverlapConfig& config);
  std::unique_ptr<OverlapBackend> (*make_gemm_reduce_scatter)(Communicator& comm,
                                                              const OverlapConfig& config);
  std::unique_ptr<MoeBackend> (*make_simple_moe)(const MoeConfig& config, int max_tokens,
                                                 Device device, Stream stream);
  std::unique_ptr<MoeBackend> (*make_tp_moe)(Communicator& comm, const MoeConfig& config,
                                             int max_tokens);
  std::unique_ptr<MoeBackend> (*make_ep_moe)(Communicator& comm, const MoeConfig& config,
                                             int max_tokens, const EpMoeOptions& options);
};

// The CPU's for Device::cpu; for a CUDA device, the table of the device runtime this process
// chose (core/device_runtime.hpp), or pmoe::Error where the build has none.
const Backends& backends(Device device);

// The CPU backends (src/cpu/backends.cpp).
const Backends& cpu_backends();

}  // namespace pmoe::detail
