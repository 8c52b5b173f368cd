// The emulated remote path (src/cuda/emulator/remote.hpp) held to NCCL's nccl_device/gin.h and no
// stronger: one sending rank over plain host memory, its network stepped by hand, for each rule;
// then CUDA AllToAll on 4 thread ranks as 2 nodes of 2 (emulated device 0), the network held
// while each send kernel ends, to show that the kernels flushed every put they made.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "cuda/emulator/remote.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

constexpr size_t kBytes = 64, kStride = 8;  // a put's bytes; words between two signal slots

// Rank 0 (the sender) and its peers' memory, as a proxy sees it.
struct Network {
  explicit Network(int ranks, int slots = 2)
      : regions(size_t(ranks), std::vector<std::byte>(8 * kBytes)),
        signals(size_t(ranks), std::vector<uint64_t>(size_t(slots) * kStride)) {
    for (int r = 0; r < ranks; ++r) emu::start_gin_signals(signals[size_t(r)].data(), kStride, slots, r);
  }
  std::vector<std::byte*> region_pointers() {
    std::vector<std::byte*> out;
    for (auto& r : regions) out.push_back(r.data());
    return out;
  }
  std::vector<uint64_t*> signal_pointers() {
    std::vector<uint64_t*> out;
    for (auto& s : signals) out.push_back(s.data());
    return out;
  }
  uint64_t gin_word(int rank, int slot) const {
    return signals[size_t(rank)][size_t(slot) * kStride + emu::kGinSignalWord];
  }
  void fill_source(int rank, uint8_t value) {
    std::memset(regions[size_t(rank)].data(), value, regions[size_t(rank)].size());
  }
  std::vector<std::vector<std::byte>> regions;
  std::vector<std::vector<uint64_t>> signals;
};

const emu::Coop kCoopA{reinterpret_cast<const void*>(0x10), 0, 0, 0};
const emu::Coop kCoopB{reinterpret_cast<const void*>(0x20), 0, 0, 0};

// "All source buffers from put's from any thread in this coop will be safe to reuse. Flush does
// not guarantee that data has settled in remote memory." Coop A and coop B each put 64 bytes;
// B flushes, then the sender rewrites its whole source. B's put carries the old bytes, A's
// (unflushed) the new ones, and nothing has landed when the flush returns.
TEST(EmulatedRemote, FlushReadsOnlyItsOwnCoopsSourcesAndLandsNothing) {
  Network net(2);
  net.fill_source(0, 1);
  emu::RemoteProxy proxy(0, net.region_pointers(), net.signal_pointers(), kStride, /*seed=*/1,
                         /*by_hand=*/true);
  proxy.put(1, 0, 0, kBytes, -1, kCoopA);
  proxy.put(1, kBytes, kBytes, kBytes, -1, kCoopB);
  EXPECT_EQ(proxy.unread_puts(), 2u);
  proxy.flush(kCoopB);
  EXPECT_EQ(proxy.unread_puts(), 1u) << "flush read the sources of another coop's puts";
  for (size_t i = 0; i < 2 * kBytes; ++i)
    ASSERT_EQ(net.regions[1][i], std::byte{0}) << "flush waited for data to land at the peer";
  net.fill_source(0, 2);  // B may reuse its source now; A may not
  while (proxy.step()) {
  }
  EXPECT_EQ(net.regions[1][0], std::byte{2}) << "A's unflushed put read its source early";
  EXPECT_EQ(net.regions[1][kBytes], std::byte{1}) << "B's flushed put read its source late";
}

// Signals are atomic adds into GIN's own word (never pmoe's word 0 of the slot), which starts at a
// seeded value that is not 0: two senders' adds to one slot make start + 2.
TEST(EmulatedRemote, SignalsAreAddsIntoGinsOwnWordsFromANonZeroStart) {
  Network net(3);
  const uint64_t start = emu::gin_signal_start(1, 1);
  EXPECT_GE(start, uint64_t(1) << 32);
  EXPECT_NE(start, emu::gin_signal_start(1, 0));
  EXPECT_NE(start, emu::gin_signal_start(2, 1));
  EXPECT_EQ(net.gin_word(1, 1), start);
  emu::RemoteProxy from0(0, net.region_pointers(), net.signal_pointers(), kStride, 1, true);
  emu::RemoteProxy from2(2, net.region_pointers(), net.signal_pointers(), kStride, 1, true);
  from0.put(1, 0, 0, kBytes, /*slot=*/1, kCoopA);
  from2.signal_add(1, 1);
  while (from0.step() || from2.step()) {
  }
  EXPECT_EQ(net.gin_word(1, 1), start + 2) << "a signal stored a count instead of adding";
  EXPECT_EQ(net.signals[1][1 * kStride], 0u) << "a remote signal wrote pmoe's own signal word";
  EXPECT_EQ(net.gin_word(1, 0), emu::gin_signal_start(1, 0));
}

// "That signal will be visible only after the payload of this put as well as the payloads of
// preceding puts on this context to the same peer are settled", and nothing more: over seeds, a
// put issued after the signal lands before it at least once, the one before it never.
TEST(EmulatedRemote, ALaterPutMayOvertakeASignalButAnEarlierOneNever) {
  int overtaken = 0;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    Network net(2, 1);
    net.fill_source(0, 9);
    emu::RemoteProxy proxy(0, net.region_pointers(), net.signal_pointers(), kStride, seed, true);
    proxy.put(1, 0, 0, kBytes, -1, kCoopA);
    proxy.signal_add(1, 0);
    proxy.put(1, kBytes, kBytes, kBytes, -1, kCoopA);
    const uint64_t start = net.gin_word(1, 0);
    while (proxy.step()) {
      if (net.gin_word(1, 0) != start) {
        ASSERT_EQ(net.regions[1][0], std::byte{9}) << "signal before the put it follows, seed "
                                                   << seed;
        overtaken += net.regions[1][kBytes] == std::byte{9};
        break;
      }
    }
  }
  EXPECT_GT(overtaken, 0) << "a later put never landed before an earlier signal";
  EXPECT_LT(overtaken, 64) << "the signal always came last";
}

// A signal issued before its data (the bug GIN does not forgive) is seen while the data is still
// on its way, and a put with a signal is seen only with its payload.
TEST(EmulatedRemote, ASignalBeforeItsPutArrivesWithoutItAndAPutsSignalWithIt) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Network net(2, 2);
    net.fill_source(0, 5);
    emu::RemoteProxy proxy(0, net.region_pointers(), net.signal_pointers(), kStride, seed, true);
    for (int i = 0; i < 3; ++i) proxy.put(1, kBytes * size_t(i), kBytes * size_t(i), kBytes, -1, kCoopA);
    proxy.put(1, 3 * kBytes, 3 * kBytes, kBytes, /*slot=*/1, kCoopB);
    const uint64_t start = net.gin_word(1, 1);
    while (proxy.step()) {
      if (net.gin_word(1, 1) == start) continue;
      for (size_t i = 0; i < 4 * kBytes; ++i)
        ASSERT_EQ(net.regions[1][i], std::byte{5}) << "signal before its data, seed " << seed;
    }
    EXPECT_EQ(net.gin_word(1, 1), start + 1);
    EXPECT_EQ(proxy.counters().bytes, 4 * kBytes);
    EXPECT_EQ(proxy.counters().transfers, 4u);
  }
  int stale = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Network net(2, 1);
    net.fill_source(0, 7);
    emu::RemoteProxy proxy(0, net.region_pointers(), net.signal_pointers(), kStride, seed, true);
    proxy.signal_add(1, 0);
    proxy.put(1, 0, 0, kBytes, -1, kCoopA);
    const uint64_t start = net.gin_word(1, 0);
    while (proxy.step()) {
      if (net.gin_word(1, 0) == start) continue;
      stale += net.regions[1][0] == std::byte{0};
      break;
    }
  }
  EXPECT_GT(stale, 0) << "a signal issued before a put never arrived ahead of it";
}

// The kernels' side: dispatch(send) and combine(send) on 4 ranks as 2 nodes of 2, the network held
// (no proxy takes a step) from before each send until its kernel has ended. Then no put may still
// wait for its source to be read: every put was flushed by the thread that issued it (combine's
// rows are put by each block's thread 0; a flush by the last block alone left the other blocks'
// staging unread). Released, the calls finish and match the reference.
TEST(EmulatedRemote, SendKernelsFlushEveryPutTheyMake) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  constexpr int W = 4;
  std::vector<size_t> unread_after_dispatch(W), unread_after_combine(W);
  std::vector<std::string> errors(W);
  run_ranks(W, [&](Communicator& comm) {
    AllToAllConfig cfg = make_config(16, 8, 2, 64);
    cfg.ranks_per_node = 2;
    AllToAll a2a(comm, cfg);
    const int L = cfg.num_experts / W;
    const auto in = reference::make_inputs(cfg, comm.rank(), 16, 7, reference::Routing::random);
    const Device gpu = comm.device();
    auto [x, indices, weights] = inputs_on(in, gpu);
    Buffer counts(DType::i32, {L}, gpu), expert_x(DType::bf16, {L, W * 16, 64}, gpu),
        expert_y(DType::bf16, {L, W * 16, 64}, gpu), y(DType::bf16, {16, 64}, gpu);
    auto held_send = [&](auto send, size_t& unread) {
      comm.barrier();
      if (comm.rank() == 0) emu::hold_remote_network(true);
      comm.barrier();
      send();
      synchronize(comm.stream());
      comm.barrier();
      unread = emu::unread_remote_puts();  // every rank's proxy of this process
      comm.barrier();
      if (comm.rank() == 0) emu::hold_remote_network(false);
    };
    held_send([&] { a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor(), Phase::send); },
              unread_after_dispatch[size_t(comm.rank())]);
    a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor(), Phase::recv);
    synchronize(comm.stream());
    Buffer host_counts(DType::i32, {L}), host_x(DType::bf16, {L, W * 16, 64}),
        host_y(DType::bf16, {L, W * 16, 64}), got(DType::bf16, {16, 64});
    copy(host_counts, counts);
    copy(host_x, expert_x);
    reference::run_fake_experts(cfg, W, comm.rank(), host_counts, host_x, Tensor(), host_y);
    copy(expert_y, host_y);
    held_send([&] { a2a.combine(expert_y, indices, weights, y, Phase::send); },
              unread_after_combine[size_t(comm.rank())]);
    a2a.combine(expert_y, indices, weights, y, Phase::recv);
    synchronize(comm.stream());
    try {
      a2a.check_errors();
      copy(got, y);
      errors[size_t(comm.rank())] =
          reference::compare_bytes("y", got, reference::reference_combine(cfg, in, DType::bf16));
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(unread_after_dispatch[size_t(r)], 0u) << "dispatch(send) left unflushed puts";
    EXPECT_EQ(unread_after_combine[size_t(r)], 0u) << "combine(send) left unflushed puts";
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  }
}

}  // namespace
}  // namespace pmoe::testing
