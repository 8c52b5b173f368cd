// The NCCL state behind the GPU remote path (nvcc builds with NCCL's device API). Shared by every
// op on one Communicator and GPU (shared_nccl_comm.hpp): one ncclComm over the Communicator's
// ranks, and with it GIN's queue pairs to every peer. Per op: one symmetric window that NCCL
// allocated and registered, and a device communicator with one GIN signal per slot:
//
//   window (every rank alike, whole 4 KiB pages):
//   ┌──────────────────────────────┬───────────────────────────────────┬─────┐
//   │ region: region_bytes         │ direct signals: slots x 64 bytes  │ pad │
//   │ (the AllToAll layout's bytes)│ (slot s at 64*s; node peers store)│     │
//   └──────────────────────────────┴───────────────────────────────────┴─────┘
//   GIN signals 0 .. slots-1 live in NCCL's own memory: remote peers add to them.
//
//   first op on (Communicator, GPU): rank 0: ncclGetUniqueId ─ Communicator::broadcast ─►
//                                    every rank: ncclCommInitRank
//   every op:  ncclMemAlloc ► cudaMemset 0 ► ncclCommWindowRegister ► ncclDevCommCreate
//   teardown, the other way round: ncclDevCommDestroy ► ncclCommWindowDeregister ► ncclMemFree
//   last op on (Communicator, GPU): ncclCommFinalize ► ncclCommDestroy
//
// NCCL's host functions come from libnccl loaded at run time (nccl_api.hpp); where the releases
// differ, nccl_compat.hpp says how.
//
// Compile-checked only: no GPU (and no NIC) has run this yet (docs/gpu.md, "Across nodes").
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/flavor.hpp"
#include "cuda/transport/gin_bootstrap.hpp"
#include "cuda/transport/nccl_api.hpp"
#include "cuda/transport/shared_nccl_comm.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

static_assert(kGinWindowAlign == NCCL_WIN_REQUIRED_ALIGNMENT);

class NcclGin {
 public:
  static constexpr size_t kSignalBytes = SymmetricMemory::kSignalBytes;

  // Collective over `comm`, a communicator of CUDA device ranks (each rank's device is made
  // current here): checks `request` against NCCL's limits (check_gin_request, with the signals
  // that the Communicator's other ops hold where NCCL's pool is shared) before any NCCL call,
  // then builds the state drawn above, opening the NCCL communicator only where no op on `comm`
  // and this GPU holds one. Region and direct signals are zeroed. If a step fails, what the
  // steps before made is undone before the pmoe::Error naming the call leaves.
  NcclGin(Communicator& comm, const GinRequest& request);
  // Teardown as drawn, collective; a failure there goes to stderr, never thrown (close() throws
  // this op's; the shared communicator's, when this was its last op, goes to stderr). The owner
  // first synchronizes the stream of every kernel that used the window.
  ~NcclGin();
  NcclGin(const NcclGin&) = delete;
  NcclGin& operator=(const NcclGin&) = delete;

  // Collective teardown now, throwing the first failure; afterwards the object is empty.
  void close();

  const ncclDevComm& dev_comm() const { return dev_comm_; }
  ncclWindow_t window() const { return window_; }
  const GinRequest& request() const { return request_; }
  // This rank's region (device memory at the window's start) and its direct signal words.
  std::byte* region() const { return base_; }
  uint64_t* direct_signals() const { return signals_of(base_); }
  // Offset of the direct signal words in the window (gin_signals_offset).
  size_t signals_offset() const { return gin_signals_offset(request_); }

  // Load/store pointers to every peer's window where the peer is on this node by ranks_per_node
  // (reached through NCCL's LSA team), nullptr for peers on other nodes, which only GIN reaches.
  // Reads the window's LSA table on the device, on `stream`, and waits for it. Throws if a peer
  // that ranks_per_node puts on this node is outside NCCL's LSA team.
  std::vector<std::byte*> direct_windows(cudaStream_t stream) const;
  uint64_t* signals_of(std::byte* window_base) const {
    return window_base ? reinterpret_cast<uint64_t*>(window_base + signals_offset()) : nullptr;
  }

 private:
  void destroy(bool report_only);

  const NcclApi* nccl_ = nullptr;  // loaded (on every rank) before any NCCL call
  GinRequest request_;
  int rank_ = 0, world_size_ = 0, device_ = 0;
  size_t window_bytes_ = 0;
  std::shared_ptr<SharedNcclComm> shared_;  // the NCCL communicator, held while this op lives
  ncclComm_t comm_ = nullptr;               // shared_'s
  std::byte* base_ = nullptr;
  ncclWindow_t window_ = nullptr;
  ncclDevComm dev_comm_{};
  bool have_dev_comm_ = false;
  int signals_held_ = 0;  // added to shared_'s count once the device communicator is made
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
