#include "cpu/overlap_base.hpp"

#include "comm/wait.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

bool every_peer_reachable(const SymmetricMemory& memory) {
  for (int r = 0; r < memory.size(); ++r)
    if (memory.peer(r) == nullptr) return false;
  return true;
}

}  // namespace

CpuOverlapBase::CpuOverlapBase(Communicator& comm, const OverlapConfig& config,
                               size_t symmetric_bytes, size_t bytes_per_call)
    : comm_(comm),
      config_(config),
      rank_(comm.rank()),
      world_size_(comm.size()),
      dsize_(size_t(dtype_size(config.dtype))),
      layout_(config.m, comm.size(), config.chunks),
      memory_(comm.alloc_symmetric(symmetric_bytes, layout_.signal_slots())) {
  if (world_size_ > 1 && every_peer_reachable(*memory_) &&
      int64_t(bytes_per_call) >= config.min_overlap_bytes)
    worker_ = std::make_unique<CommWorker>(comm.timeout_s());
}

size_t CpuOverlapBase::base_workspace_bytes() const {
  return memory_->bytes() + size_t(layout_.signal_slots()) * SymmetricMemory::kSignalBytes;
}

void CpuOverlapBase::begin_call() {
  comm_.check_group();
  ++call_;
  for (int q = 0; q < world_size_; ++q)
    if (q != rank_) memory_->signal(q, layout_.ready_slot(rank_), call_);
}

void CpuOverlapBase::wait_ready(int dest, const char* op, bool on_worker) const {
  wait_signal(layout_.ready_slot(dest), call_, {op, dest, "it to begin this call"}, on_worker);
}

void CpuOverlapBase::wait_signal(int slot, uint64_t value, const WaitFor& what,
                                 bool on_worker) const {
  if (!worker_) return memory_->wait_signal(slot, value, what);  // MPI progress included
  wait_bounded([&] { return memory_->read_signal(slot) >= value; }, on_worker,
               [&] {
                 return cat(what.op, " on rank ", rank_, ": rank ", what.peer,
                            " did not arrive within ", comm_.timeout_s(), " s (waited for ",
                            what.event, ": signal ", slot, " to reach ", value, ", it is at ",
                            memory_->read_signal(slot), ")");
               });
}

void CpuOverlapBase::wait_bounded(const std::function<bool()>& ready, bool on_worker,
                                  const std::function<std::string()>& timeout_message) const {
  wait_until(
      comm_.timeout_s(), ready,
      [&] {
        comm_.check_group();
        if (on_worker && worker_->stop_requested())
          throw Error("communication thread: stopped by its rank");
        if (!on_worker && worker_->failed()) worker_->finish();  // rethrows the worker's error
      },
      [&] { throw Error(timeout_message()); });
}

void CpuOverlapBase::pipeline(const std::function<void()>& transfers,
                              const std::function<void()>& multiply) {
  worker_->start(transfers);
  try {
    multiply();
  } catch (...) {
    worker_->abandon();
    throw;
  }
  worker_->finish();
}

}  // namespace pmoe::detail
