// One NCCL communicator per pmoe Communicator and GPU, shared by every op made on it: an
// ncclCommInitRank per op would be slow to set up and, as GIN connects its queue pairs to every
// peer once per NCCL communicator (ncclGinConnectOnce), would open a new set of queue pairs per
// op until the NIC runs out. Each op still registers its own window and makes its own device
// communicator on the shared one (nccl_gin.cu).
//
//   op 1 on (comm, GPU 0) ─┐
//   op 2 on (comm, GPU 0) ─┼─► SharedNcclComm ─► the ncclComm_t (opaque here), the GIN signals
//   op 3 on (comm, GPU 0) ─┘   (a token agreed    its ops hold from NCCL's pool
//                               by every rank)
//
// Plain C++ that knows no NCCL type, built in every configuration, so that thread-rank tests
// count the communicators opened (tests/test_gin_bootstrap.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "pmoe/comm.hpp"

namespace pmoe::cuda {

class SharedNcclComm {
 public:
  SharedNcclComm(std::shared_ptr<void> nccl_comm, uint64_t token)
      : nccl_comm_(std::move(nccl_comm)), token_(token) {}

  // What open() returned: NCCL's communicator, and its teardown when the last op lets go.
  void* nccl_comm() const { return nccl_comm_.get(); }
  // The same on every rank that shares this state; chosen by rank 0 when it was opened.
  uint64_t token() const { return token_; }

  // GIN signals that this rank's live ops hold from the communicator's pool (an op adds its own
  // once its device communicator is made, and takes them back when it is destroyed).
  int signals_held() const { return signals_held_.load(); }
  void hold_signals(int n) { signals_held_ += n; }
  void release_signals(int n) { signals_held_ -= n; }

 private:
  std::shared_ptr<void> nccl_comm_;
  uint64_t token_;
  std::atomic<int> signals_held_{0};
};

// Collective over `comm`. The state shared by the ops on (`comm`, `device`): the one this rank's
// earlier ops made, where every rank still holds one and all hold the same (equal tokens);
// otherwise a new one, on every rank: check(0), then open() for NCCL's communicator. Where the
// state is shared, check(signals its ops hold) runs first. check throws pmoe::Error on every rank
// alike (check_gin_request); nothing is opened after it threw. Ranks never split between sharing
// and opening, so none waits in ncclCommInitRank for peers that went on with the old one (ops
// need not be destroyed at the same time on every rank).
std::shared_ptr<SharedNcclComm> share_nccl_comm(Communicator& comm, int device,
                                                const std::function<void(int)>& check,
                                                const std::function<std::shared_ptr<void>()>& open);

}  // namespace pmoe::cuda
