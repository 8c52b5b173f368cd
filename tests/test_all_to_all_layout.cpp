// The AllToAll buffer layout (src/all_to_all/layout.hpp), which the CPU backend and the CUDA
// kernels both read, tested on the host alone: every piece of every region for random configs
// (1 to 8 ranks, every payload dtype, with and without in-place buffers) lies inside the region,
// starts where copies want it (64 B), and overlaps no other piece; one small config against
// offsets worked out by hand; and the routing rule both backends share against a plain one.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "all_to_all/layout.hpp"
#include "all_to_all/route.hpp"
#include "all_to_all/step.hpp"

namespace pmoe::detail {
namespace {

struct Piece {
  size_t begin, bytes;
  std::string what;
};

// Every piece of the region that the layout hands out, at its accessors' offsets.
std::vector<Piece> pieces_of(const AllToAllLayout& l, const AllToAllConfig& c) {
  std::vector<Piece> out;
  auto add = [&](size_t begin, size_t bytes, std::string what) {
    if (bytes) out.push_back({begin, bytes, std::move(what)});
  };
  const int E = c.num_experts;
  for (int s = 0; s < l.world_size; ++s) {
    const std::string src = "source " + std::to_string(s);
    add(l.count_offset(s), sizeof(int32_t), src + " count");
    add(l.flags_offset(s), sizeof(int32_t), src + " flags");
    for (int e = 0; e < l.num_local_experts; ++e)
      add(l.expert_count_offset(s, e), sizeof(int32_t), src + " expert count " + std::to_string(e));
    for (int slot = 0; slot < l.max_tokens; ++slot) {
      const std::string at = src + " slot " + std::to_string(slot);
      add(l.token_offset(s, slot), sizeof(int32_t) * size_t(l.header_ints(l.max_pairs)),
          at + " header");
      add(l.payload_offset(s, slot), l.payload_bytes, at + " payload");
      add(l.scale_offset(s, slot), l.scale_bytes, at + " scales");
    }
  }
  for (int t = 0; t < l.max_tokens; ++t) {
    for (int j = 0; j < l.top_k; ++j) {
      const std::string at = "(" + std::to_string(t) + ", " + std::to_string(j) + ")";
      // Room for an f32 row, whatever expert_y's dtype.
      add(l.combine_row_offset(t, j), sizeof(float) * size_t(c.hidden_dim), "combine row " + at);
      add(l.row_ref_slot(t, j), sizeof(int32_t), "row ref " + at);
    }
  }
  for (int o = 0; o < l.world_size; ++o)
    add(l.combine_dtype_slot(o), sizeof(uint32_t), "combine dtype of " + std::to_string(o));
  if (c.in_place_buffers) {
    add(l.input_offset, size_t(l.max_tokens) * l.payload_bytes, "input buffer");
    add(l.input_scale_offset, size_t(l.max_tokens) * l.scale_bytes, "input scales");
    add(l.expert_output_offset, size_t(E) * l.max_tokens * l.expert_output_row, "expert output");
  }
  return out;
}

void expect_sound(const AllToAllConfig& c, int W) {
  const AllToAllLayout l(c, W);
  const std::string cfg = "W=" + std::to_string(W) + " E=" + std::to_string(c.num_experts) +
                          " k=" + std::to_string(c.top_k) +
                          " H=" + std::to_string(c.hidden_dim) + " " + std::string(dtype_name(c.in_dtype)) +
                          (c.in_place_buffers ? " in-place" : "");
  const int L = c.num_experts / W;
  ASSERT_EQ(l.max_pairs, std::min(c.top_k, L)) << cfg;
  ASSERT_EQ(l.payload_bytes, size_t(c.hidden_dim) * dtype_size(c.in_dtype)) << cfg;
  ASSERT_EQ(l.scale_bytes, sizeof(float) * size_t(c.scales_per_token())) << cfg;
  ASSERT_EQ(l.total_bytes % 64, 0u) << cfg;
  std::vector<Piece> pieces = pieces_of(l, c);
  for (const Piece& p : pieces) {
    EXPECT_LE(p.begin + p.bytes, l.total_bytes) << cfg << ": " << p.what << " ends past the region";
    // Rows and headers start on a cache line; the small words sit at 4-byte multiples.
    const bool word = p.what.find("flags") != std::string::npos ||
                      p.what.find("expert count") != std::string::npos ||
                      p.what.find("row ref") != std::string::npos;
    EXPECT_EQ(p.begin % (word ? 4 : 64), 0u) << cfg << ": " << p.what << " at " << p.begin;
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < pieces.size(); ++i)
    EXPECT_LE(pieces[i - 1].begin + pieces[i - 1].bytes, pieces[i].begin)
        << cfg << ": " << pieces[i - 1].what << " overlaps " << pieces[i].what;
  // Signals: one slot per source for dispatch, one per owner for combine, all distinct.
  std::set<int> slots;
  for (int s = 0; s < W; ++s) {
    slots.insert(l.dispatch_signal(s));
    slots.insert(l.combine_signal(s));
  }
  EXPECT_EQ(int(slots.size()), l.signal_slots()) << cfg;
  EXPECT_EQ(*slots.rbegin(), l.signal_slots() - 1) << cfg;
  EXPECT_EQ(AllToAllLayout::signal_word(1) * sizeof(uint64_t), SymmetricMemory::kSignalBytes);
}

TEST(AllToAllLayout, RandomConfigsPiecesAlignedInsideAndDisjoint) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 200; ++trial) {
    const int W = pick(1, 8);
    AllToAllConfig c;
    c.num_experts = W * pick(1, 40);
    c.top_k = pick(1, std::min(c.num_experts, 9));
    c.max_tokens = pick(1, 12);
    const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f8e4m3};
    c.in_dtype = dtypes[pick(0, 3)];
    c.out_dtype = dtypes[pick(0, 2)];
    c.scale_block = c.in_dtype == DType::f8e4m3 ? pick(1, 4) * 4 : 0;
    c.hidden_dim = c.in_dtype == DType::f8e4m3 ? c.scale_block * pick(1, 40) : pick(1, 300);
    c.in_place_buffers = pick(0, 1) == 1;
    c.validate(W);
    expect_sound(c, W);
  }
}

// W = 2, E = 4, k = 3, H = 10 bf16, 3 tokens, worked out by hand from the drawing in layout.hpp.
TEST(AllToAllLayout, SmallConfigAtHandComputedOffsets) {
  AllToAllConfig c;
  c.max_tokens = 3;
  c.num_experts = 4;
  c.top_k = 3;
  c.hidden_dim = 10;
  c.in_dtype = DType::bf16;
  c.out_dtype = DType::bf16;
  const AllToAllLayout l(c, 2);
  EXPECT_EQ(l.max_pairs, 2);              // 2 experts per rank
  EXPECT_EQ(l.block_head_bytes, 64u);     // count, flags, 2 expert counts: 16 B, one line
  EXPECT_EQ(l.expert_count_offset(1, 1), 448u + 12);
  EXPECT_EQ(l.header_bytes, 64u);         // 2 + 3 * 2 i32 = 32 B, one line
  EXPECT_EQ(l.token_stride, 128u);        // header line + 20 B payload line, no scales
  EXPECT_EQ(l.source_block, 448u);        // 64 B count/flags + 3 slots
  EXPECT_EQ(l.token_offset(1, 2), 448u + 64 + 256);
  EXPECT_EQ(l.payload_offset(1, 2), 448u + 64 + 256 + 64);
  EXPECT_EQ(l.combine_offset, 896u);      // 2 source blocks
  EXPECT_EQ(l.combine_row, 64u);          // 10 f32 = 40 B, one line
  EXPECT_EQ(l.combine_row_offset(2, 1), 896u + 7 * 64);
  EXPECT_EQ(l.row_ref_offset, 896u + 9 * 64);
  EXPECT_EQ(l.combine_dtype_offset, 1472u + 64);  // 9 row refs = 36 B, one line
  EXPECT_EQ(l.total_bytes, 1536u + 2 * 64);       // no in-place buffers
}

// first_in_group against its definition, written plainly: the first slot of its group among
// the slots in [0, E).
TEST(AllToAllRouting, FirstInGroupMatchesAPlainScan) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int E = 1 + int(rng() % 12), k = 1 + int(rng() % 6), group = 1 + int(rng() % 4);
    std::vector<int32_t> row(static_cast<size_t>(k));
    for (auto& e : row) e = int32_t(rng() % (E + 3)) - 1;  // -1 .. E + 1: some out of range
    for (int j = 0; j < k; ++j) {
      bool expected = row[size_t(j)] >= 0 && row[size_t(j)] < E;
      for (int i = 0; i < j && expected; ++i)
        if (row[size_t(i)] >= 0 && row[size_t(i)] / group == row[size_t(j)] / group)
          expected = false;
      EXPECT_EQ(first_in_group(row.data(), j, E, group), expected);
    }
  }
}

TEST(AllToAllSteps, NamesInRoundOrder) {
  Step s{};
  const char* names[] = {"dispatch(send)", "dispatch(recv)", "combine(send)", "combine(recv)"};
  for (int i = 0; i < 2 * kSteps; ++i, s = next_step(s))
    EXPECT_STREQ(step_name(s), names[i % kSteps]);
  EXPECT_STREQ(step_name(int32_t(kSteps)), "?");
}

}  // namespace
}  // namespace pmoe::detail
