// Host only, no ranks run: the scaling model's link model (tools/pmoe-bench/model_links.hpp) on
// one token between 2 ranks on 2 nodes, worked out by hand for direct and hierarchical mode and
// for the CPU formula (ranks on their own cores and sharing one); its routings
// (model_routing.hpp): distinct experts, Zipf skew toward expert 0, a recorded file, bad specs;
// and a preset's JSON round trip.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "model_links.hpp"
#include "model_routing.hpp"
#include "pmoe/error.hpp"

namespace pmoe::bench {
namespace {

using detail::TrafficMode;

// Round numbers: same rank 1000 GB/s, load/store 100 GB/s + 1 µs, network 10 GB/s + 2 µs +
// 0.5 µs per transfer, local 1000 GB/s, 2 kernels of 3 µs.
HardwarePreset round_preset() {
  HardwarePreset p;
  p.name = "round";
  p.ranks_per_node = 1;
  p.links = {LinkParams{1000, 0, 0}, LinkParams{100, 1, 0}, LinkParams{10, 2, 0.5}};
  p.local_gbps = 1000;
  p.launch_us = 3;
  p.kernels_per_op = 2;
  return p;
}

// W 2, one rank per node, E 2, k 1, H 64 bf16 (128 B rows), no scales: rank 0's one token goes
// to expert 1 on rank 1.
detail::Traffic one_token(TrafficMode mode) {
  AllToAllConfig c{1, 2, 1, 64, DType::bf16, 0, DType::bf16, false};
  return detail::count_traffic(c, {2, 1, mode, false}, {{1}, {}});
}

TEST(ModelLinks, OneTokenByHand) {
  const Prediction p =
      predict(round_preset(), one_token(TrafficMode::direct), TrafficMode::direct, 128, 128);
  // Dispatch, rank 1: receives rank 0's block in one put over the network (its head padded to
  // 64 B, the slot at the layout's stride: header 20 B padded to 64 + 128 = 192; 256 B), sends
  // its own empty block (64 B): 2 + 256 B / 10 GB/s + 1 x 0.5 µs; then lands 1 row (128 B read
  // and written at 1000 GB/s); 2 launches of 3 µs.
  EXPECT_EQ(p.dispatch.critical_rank, 1);
  EXPECT_NEAR(p.dispatch.us, 6 + 2 + 0.0256 + 0.5 + 0.000256, 1e-9);
  // Combine, rank 0: receives the row and a 4 B dtype word (132 B, 2 transfers); sums 1 row.
  EXPECT_EQ(p.combine.critical_rank, 0);
  EXPECT_NEAR(p.combine.us, 6 + 2 + 0.0132 + 1 + 0.000256, 1e-9);
  // The exchange's terms, as `model published` names them: latency, bandwidth, per-transfer.
  EXPECT_NEAR(p.dispatch.latency_us, 2, 1e-12);
  EXPECT_NEAR(p.dispatch.bandwidth_us, 0.0256, 1e-12);
  EXPECT_NEAR(p.dispatch.transfer_us, 0.5, 1e-12);
  EXPECT_NEAR(p.combine.transfer_us, 1, 1e-12);
  // Hierarchical: rank 1 is rank 0's relay on node 1. Rank 0's relay block (head 12 B padded to
  // 64, one slot: header 24 B padded to 64 + 128; 256 B, one put) crosses as the direct block
  // did; then the node stage: rank 1 rebuilds the 148 B slot (20 B header + 128) and rank 0's
  // 12 B head at itself, beside its own 12 B head (same rank, 172 B). Combine returns rows
  // directly in both modes: the same time.
  const Prediction h = predict(round_preset(), one_token(TrafficMode::hierarchical),
                               TrafficMode::hierarchical, 128, 128);
  EXPECT_EQ(h.dispatch.critical_rank, 1);
  EXPECT_NEAR(h.dispatch.us, 6 + 2 + 0.0256 + 0.5 + 0.000172 + 0.000256, 1e-9);
  EXPECT_NEAR(h.combine.us, p.combine.us, 1e-9);
  // Staged: the network stage's terms plus the node stage's (same rank: bandwidth only).
  EXPECT_NEAR(h.dispatch.latency_us, 2, 1e-12);
  EXPECT_NEAR(h.dispatch.bandwidth_us, 0.0256 + 0.000172, 1e-12);
  EXPECT_NEAR(h.dispatch.transfer_us, 0.5, 1e-12);
  for (const OpPrediction& op : {p.dispatch, p.combine, h.dispatch, h.combine})
    EXPECT_NEAR(op.latency_us + op.bandwidth_us + op.transfer_us, op.exchange_us, 1e-12);
}

TEST(ModelLinks, CpuFormulaByHand) {
  HardwarePreset cpu = round_preset();
  cpu.cores = 2, cpu.call_us = 2, cpu.signal_us = 1, cpu.cache_gbps = 100, cpu.cache_bytes = 1000;
  const detail::Traffic t = one_token(TrafficMode::direct);
  // Each rank on its own core: call 2 + one round trip 1 + 256 B (1 row read and written) from
  // cache at 100 GB/s. Combine: rank 0 reads 1 row and writes y (128 + 128 B).
  Prediction p = predict_cpu(cpu, t, 128, 128, 1, 128);
  EXPECT_NEAR(p.dispatch.us, 3 + 0.00256, 1e-9);
  EXPECT_NEAR(p.combine.us, 3 + 0.00256, 1e-9);
  // Both ranks on one core: call x 2, sync 2 ranks x 1 µs x 2; the bytes of both ranks, 384 B.
  cpu.cores = 1;
  p = predict_cpu(cpu, t, 128, 128, 1, 128);
  EXPECT_NEAR(p.combine.us, 4 + 4 + 0.00384, 1e-9);
  // Past the cache: the memory bandwidth (load/store, 100 GB/s here too) applies.
  cpu.cache_bytes = 100, cpu.links[1].gbps = 10;
  p = predict_cpu(cpu, t, 128, 128, 1, 128);
  EXPECT_NEAR(p.combine.us, 8 + 0.0384, 1e-9);
  // Combine's sum past the cache runs at its own measured rate; dispatch stays a copy.
  cpu.reduce_gbps = 5;
  p = predict_cpu(cpu, t, 128, 128, 1, 128);
  EXPECT_NEAR(p.combine.us, 8 + 0.0768, 1e-9);
  EXPECT_NEAR(p.dispatch.us, 8 + 0.0256, 1e-9);
  EXPECT_THROW(predict_cpu(round_preset(), t, 128, 128, 1, 128), Error);
}

TEST(ModelRouting, DistinctSkewedAndRecorded) {
  const auto uniform = make_routing("uniform", 4, 50, 8, 64, 3);
  const auto zipf = make_routing("zipf:1.5", 4, 50, 8, 64, 3);
  size_t hot = 0, cold = 0;
  for (const auto* routing : {&uniform, &zipf})
    for (const auto& rows : *routing) {
      ASSERT_EQ(rows.size(), 50u * 8);
      for (size_t t = 0; t < 50; ++t) {
        const std::set<int32_t> distinct(rows.begin() + t * 8, rows.begin() + t * 8 + 8);
        EXPECT_EQ(distinct.size(), 8u);
        for (int32_t e : distinct) EXPECT_TRUE(e >= 0 && e < 64);
      }
    }
  for (const auto& rows : zipf)
    for (int32_t e : rows) hot += e == 0, cold += e == 63;
  EXPECT_GT(hot, 4u * 50 * 3 / 4);  // with s = 1.5 expert 0 is in nearly every token
  EXPECT_LT(cold, hot / 4);

  const std::string path = testing::TempDir() + "pmoe_model_routing.txt";
  std::ofstream(path) << "0 1\n2 3\n-1 4\n";
  const auto recorded = make_routing("file:" + path, 2, 2, 2, 8, 0);
  EXPECT_EQ(recorded[0], (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(recorded[1], (std::vector<int32_t>{-1, 4, 0, 1}));       // wraps around the file
  EXPECT_THROW(make_routing("file:" + path, 2, 2, 2, 4, 0), Error);  // 4 is not < E
  std::ofstream(path) << "0 1 2\n";
  EXPECT_THROW(make_routing("file:" + path, 2, 2, 2, 8, 0), Error);  // not a multiple of k
  std::remove(path.c_str());
  EXPECT_THROW(make_routing("zipf:0", 2, 2, 2, 8, 0), Error);
  EXPECT_THROW(make_routing("zipf", 2, 2, 2, 8, 0), Error);
  EXPECT_THROW(make_routing("file:/nonexistent/x", 2, 2, 2, 8, 0), Error);
}

TEST(ModelLinks, PresetsRoundTripThroughJson) {
  for (const HardwarePreset& p : builtin_presets()) {
    const HardwarePreset q = HardwarePreset::from_json(p.to_json());
    EXPECT_EQ(q.to_json(), p.to_json()) << p.name;
    EXPECT_GT(p.links[2].gbps, 0) << p.name;
  }
  HardwarePreset cpu = find_preset("h100-ib");
  cpu.cores = 2, cpu.call_us = 1.5, cpu.signal_us = 2.5, cpu.cache_gbps = 90,
  cpu.cache_bytes = 4096;
  const HardwarePreset back = HardwarePreset::from_json(cpu.to_json());
  EXPECT_EQ(back.cores, 2);
  EXPECT_EQ(back.call_us, 1.5);
  EXPECT_EQ(back.signal_us, 2.5);
  EXPECT_EQ(back.cache_gbps, 90);
  EXPECT_EQ(back.cache_bytes, 4096);
  cpu.reduce_gbps = 7;
  EXPECT_EQ(HardwarePreset::from_json(cpu.to_json()).reduce_gbps, 7);
  EXPECT_EQ(find_preset("h100-ib").ranks_per_node, 8);
  EXPECT_EQ(find_preset("gb200-nvl72").ranks_per_node, 72);
  EXPECT_THROW(find_preset("h100"), Error);
  EXPECT_THROW(HardwarePreset::from_json({{"name", "x"}}), Error);
}

}  // namespace
}  // namespace pmoe::bench
