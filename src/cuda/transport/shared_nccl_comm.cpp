#include "cuda/transport/shared_nccl_comm.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace pmoe::cuda {
namespace {

// This process's shared states, by Communicator and GPU. Weak: the ops own the state, and the
// last op's destruction tears NCCL's communicator down.
struct Registry {
  std::mutex mutex;
  std::map<std::pair<const Communicator*, int>, std::weak_ptr<SharedNcclComm>> states;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

std::shared_ptr<SharedNcclComm> share_nccl_comm(
    Communicator& comm, int device, const std::function<void(int)>& check,
    const std::function<std::shared_ptr<void>()>& open) {
  const auto key = std::make_pair(static_cast<const Communicator*>(&comm), device);
  std::shared_ptr<SharedNcclComm> mine;
  {
    std::lock_guard lock(registry().mutex);
    std::erase_if(registry().states, [](const auto& entry) { return entry.second.expired(); });
    auto found = registry().states.find(key);
    if (found != registry().states.end()) mine = found->second.lock();
  }
  // Shared only where every rank holds the same state: a rank whose ops are all gone (or that
  // never had one) makes every rank open a new one.
  const uint64_t token = mine ? mine->token() : 0;
  const auto tokens = comm.all_gather(std::as_bytes(std::span(&token, 1)));
  bool shared = token != 0;
  for (size_t r = 0; r < tokens.size() / sizeof token; ++r) {
    uint64_t theirs;
    std::memcpy(&theirs, tokens.data() + r * sizeof token, sizeof token);
    shared = shared && theirs == token;
  }
  if (shared) {
    check(mine->signals_held());
    return mine;
  }

  check(0);
  std::shared_ptr<void> nccl_comm = open();
  uint64_t chosen = 0;
  if (comm.rank() == 0) {
    std::random_device random;
    while (chosen == 0) chosen = (uint64_t(random()) << 32) ^ random();
  }
  comm.broadcast(std::as_writable_bytes(std::span(&chosen, 1)), 0);
  auto state = std::make_shared<SharedNcclComm>(std::move(nccl_comm), chosen);
  std::lock_guard lock(registry().mutex);
  registry().states[key] = state;
  return state;
}

}  // namespace pmoe::cuda
