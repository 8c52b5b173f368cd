// What the two CPU overlap ops share: the symmetric memory and its signals (protocol in
// overlap/plan.hpp), the communication thread, the ready handshake that lets buffers be reused
// call after call without a barrier, and bounded waits that also watch the other thread.
//
// When every peer is load/store reachable (thread ranks, MPI ranks on one node), transfers run
// on a CommWorker while the rank's thread multiplies. When some peer is off-node, puts and
// signals to it are MPI calls, which must stay on the rank's own thread (MPI_THREAD_SERIALIZED);
// then there is no worker and the ops interleave transfers and GEMMs on the calling thread, as
// they also do for calls smaller than config.min_overlap_bytes. Both ways follow one protocol.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "backends/overlap_backend.hpp"
#include "cpu/comm_worker.hpp"
#include "overlap/plan.hpp"
#include "pmoe/comm.hpp"

namespace pmoe::detail {

class CpuOverlapBase : public OverlapBackend {
 public:
  bool overlaps() const override { return worker_ != nullptr; }

 protected:
  // Collective: allocates `symmetric_bytes` plus the layout's signals. `comm` must outlive the op.
  // `bytes_per_call`: what one call moves out of this rank, compared with min_overlap_bytes.
  CpuOverlapBase(Communicator& comm, const OverlapConfig& config, size_t symmetric_bytes,
                 size_t bytes_per_call);

  // Starts the next call: every peer learns that this rank's memory is free to be written.
  void begin_call();
  // Waits until rank `dest` has begun the current call, before writing into its memory.
  void wait_ready(int dest, const char* op, bool on_worker) const;
  // Waits until this rank's signal `slot` reaches `value`.
  void wait_signal(int slot, uint64_t value, const WaitFor& what, bool on_worker) const;

  // Runs `transfers` on the worker while `multiply` runs on this thread; returns when both have
  // ended. If `multiply` throws, the worker is stopped before the exception leaves.
  void pipeline(const std::function<void()>& transfers, const std::function<void()>& multiply);

  size_t base_workspace_bytes() const;

  Communicator& comm_;
  OverlapConfig config_;
  int rank_, world_size_;
  size_t dsize_;  // bytes per element of config_.dtype
  ChunkLayout layout_;
  std::unique_ptr<SymmetricMemory> memory_;
  std::unique_ptr<CommWorker> worker_;  // null: transfers run on the calling thread
  uint64_t call_ = 0;                   // calls begun; signals carry it (overlap/plan.hpp)

 private:
  void wait_bounded(const std::function<bool()>& ready, bool on_worker,
                    const std::function<std::string()>& timeout_message) const;
};

}  // namespace pmoe::detail
