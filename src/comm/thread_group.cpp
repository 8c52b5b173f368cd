// run_ranks(): a group of ranks as threads of one process. Symmetric memory is plain heap memory
// shared by pointer; every region is owned jointly by all ranks' handles, so a rank that leaves
// early (or throws) never frees memory a peer is still writing into.
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/group.hpp"
#include "core/device_runtime.hpp"
#include "comm/wait.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe {
namespace {

struct ThreadGroup final : detail::Group {
  explicit ThreadGroup(int n) : size(n), arrivals(n), exchange(n), regions(n), board(n) {
    std::vector<detail::RejectionSlot*> slots;
    for (auto& slot : board) slots.push_back(&slot);
    set_rejection_slots(std::move(slots), nullptr);  // the board is this object's own
  }

  const int size;
  std::vector<std::atomic<uint64_t>> arrivals;  // barriers entered, per rank
  std::mutex mutex;                              // guards exchange and regions
  std::vector<std::vector<std::byte>> exchange;  // all_gather staging, one entry per rank
  std::vector<std::shared_ptr<std::byte>> regions;  // alloc_symmetric staging
  std::vector<detail::RejectionSlot> board;          // one zeroed slot per rank
};

// Heap regions shared by pointer: every peer is load/store reachable, so the base class's
// put() and signal() serve all of them.
class ThreadSymmetricMemory final : public SymmetricMemory {
 public:
  ThreadSymmetricMemory(int rank, size_t bytes, int signal_slots, std::vector<std::byte*> data,
                        std::vector<uint64_t*> signals, std::shared_ptr<void> keepalive,
                        std::shared_ptr<detail::Group> group, double timeout_s, Device device)
      : SymmetricMemory(rank, bytes, signal_slots, std::move(data), std::move(signals),
                        std::move(keepalive), std::move(group), timeout_s, device) {}
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank, Device device)
      : Communicator(group, device), group_(std::move(group)), rank_(rank) {
    if (device.kind == Device::Kind::cuda) set_stream(detail::create_stream(device));
  }
  ~ThreadCommunicator() override { detail::destroy_stream(stream()); }

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  void barrier() override {
    const uint64_t mine = group_->arrivals[rank_].fetch_add(1, std::memory_order_acq_rel) + 1;
    auto all_arrived = [&] {
      for (auto& count : group_->arrivals)
        if (count.load(std::memory_order_acquire) < mine) return false;
      return true;
    };
    detail::wait_until(timeout_s(), all_arrived, [&] { group_->check(rank_); }, [&] {
      std::string missing;
      for (int r = 0; r < size(); ++r) {
        if (group_->arrivals[r].load() >= mine) continue;
        if (!missing.empty()) missing += ", ";
        missing += std::to_string(r);
      }
      throw Error(detail::cat("barrier on rank ", rank_, ": rank(s) ", missing,
                              " did not arrive within ", timeout_s(), " s"));
    });
  }

  std::vector<std::byte> all_gather(std::span<const std::byte> mine) override {
    {
      std::lock_guard lock(group_->mutex);
      group_->exchange[rank_].assign(mine.begin(), mine.end());
    }
    barrier();
    std::vector<std::byte> all;
    {
      std::lock_guard lock(group_->mutex);
      for (int r = 0; r < size(); ++r) {
        PMOE_CHECK(group_->exchange[r].size() == mine.size(), "all_gather on rank ", rank_,
                   ": rank ", r, " gave ", group_->exchange[r].size(), " bytes, this rank ",
                   mine.size());
        all.insert(all.end(), group_->exchange[r].begin(), group_->exchange[r].end());
      }
    }
    barrier();  // nobody overwrites the staging area until everyone has read it
    return all;
  }

  void broadcast(std::span<std::byte> data, int root) override {
    PMOE_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " outside [0, ", size(), ")");
    const std::vector<std::byte> all = all_gather(data);
    std::copy_n(all.begin() + ptrdiff_t(root * data.size()), data.size(), data.begin());
  }

  std::vector<int> node_ranks() const override {
    std::vector<int> ranks(size());
    for (int r = 0; r < size(); ++r) ranks[r] = r;
    return ranks;
  }

  std::unique_ptr<SymmetricMemory> alloc_symmetric(size_t bytes, int signal_slots) override {
    return alloc_symmetric_in(device(), bytes, signal_slots);
  }
  std::unique_ptr<SymmetricMemory> alloc_host_symmetric(size_t bytes) override {
    return alloc_symmetric_in(Device::cpu(), bytes, 0);
  }

 private:
  std::unique_ptr<SymmetricMemory> alloc_symmetric_in(Device where, size_t bytes,
                                                      int signal_slots) {
    PMOE_CHECK(signal_slots >= 0, "alloc_symmetric: negative signal count ", signal_slots);
    const size_t data_bytes = (bytes + 63) / 64 * 64;
    const size_t total = data_bytes + size_t(signal_slots) * SymmetricMemory::kSignalBytes;
    std::shared_ptr<std::byte> region;
    if (where.kind == Device::Kind::cpu) {
      region.reset(static_cast<std::byte*>(aligned_alloc_zeroed(total)),
                   [](std::byte* p) { aligned_free(p); });
    } else {
      region.reset(static_cast<std::byte*>(detail::device_alloc(where, total)),
                   [where](std::byte* p) { detail::device_free(where, p); });
    }
    {
      std::lock_guard lock(group_->mutex);
      group_->regions[rank_] = region;
    }
    barrier();
    auto owned = std::make_shared<std::vector<std::shared_ptr<std::byte>>>();
    {
      std::lock_guard lock(group_->mutex);
      *owned = group_->regions;
    }
    barrier();
    {
      std::lock_guard lock(group_->mutex);
      group_->regions[rank_].reset();
    }
    std::vector<std::byte*> data(size());
    std::vector<uint64_t*> signals(size());
    for (int r = 0; r < size(); ++r) {
      data[r] = (*owned)[r].get();
      signals[r] = reinterpret_cast<uint64_t*>(data[r] + data_bytes);
    }
    return std::make_unique<ThreadSymmetricMemory>(
        rank_, bytes, signal_slots, std::move(data), std::move(signals), owned, group_,
        timeout_s(), where);
  }

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
};

}  // namespace

void run_ranks(int n, const std::function<void(Communicator&)>& fn, Device device) {
  PMOE_CHECK(n >= 1, "run_ranks: need at least 1 rank, got ", n);
  detail::note_ranks_on_node(n, detail::usable_cpus());  // more threads than CPUs: waits block early
  // Ranks sharing a GPU in one process share its CUDA context. With CUDA's lazy module loading
  // (the default since CUDA 12.2) a kernel launched for the first time may wait for the context's
  // running kernels, among them a peer rank's that spins until this rank's kernel runs: a
  // deadlock, seen on an H100 (docs/gpu.md). Eager loading, unless the user chose otherwise; it
  // holds only where CUDA has not started in this process yet.
  if (device.kind == Device::Kind::cuda && n > 1) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  auto group = std::make_shared<ThreadGroup>(n);
  std::mutex first_mutex;
  std::exception_ptr first_error;

  auto body = [&](int rank) {
    try {
      if (device.kind == Device::Kind::cuda) detail::set_device(device);
      ThreadCommunicator comm(group, rank, device);
      fn(comm);
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      std::string message = "unknown exception";
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      std::lock_guard lock(first_mutex);
      // The first failure is the cause; later ones are usually peers noticing it.
      if (!first_error) first_error = error;
      group->fail(rank, message);
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  for (int r = 1; r < n; ++r) threads.emplace_back(body, r);
  body(0);  // rank 0 runs on the caller's thread
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace pmoe
