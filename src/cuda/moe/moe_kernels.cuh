// The MoE layers' small kernels on a device (moe_row_kernels.cu, moe_routing_kernels.cu,
// moe_tp_sum_kernels.cu): everything between the cuBLAS GEMMs. Each takes its pointers and sizes
// in one struct and runs on the given stream; none reads anything back to the host, so a forward
// made of them can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "cuda/flavor.hpp"
#include "pmoe/dtype.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// Rows of `dtype` (f32 or bf16) widened to f32: dst[r, c] = src[r, c] for c < cols. With
// `row_limits` (per group of `group_rows` rows, the rows in use), rows past a group's limit are
// skipped: not read, not written, not walked (the row kernels of moe_row_kernels.cu visit the rows
// in use only, on a full grid, in 16-byte words where the pointers, strides and widths are
// multiples of 16 bytes and 8 elements).
struct WidenRows {
  const void* src = nullptr;
  int64_t src_ld = 0;
  float* dst = nullptr;
  int64_t dst_ld = 0;
  int64_t rows = 0, cols = 0;
  const int32_t* row_limits = nullptr;
  int64_t group_rows = 0;
};
void launch_widen_rows(const WidenRows& w, DType dtype, cudaStream_t stream);
// A layer's input rows (m x H, packed) as f32: `x` itself when `dtype` is f32, else widened into
// `scratch` (m x H) on `stream`. The router and the experts read f32.
const float* rows_as_f32(const void* x, DType dtype, int64_t m, int64_t H, float* scratch,
                         cudaStream_t stream);

// f32 rows rounded to `dtype` (f32 or bf16): dst[r, c] = round(src[r, c]) for c < cols, and with
// pad_to > cols, dst[r, c] = 0 for c in [cols, pad_to). Row limits as WidenRows.
struct NarrowRows {
  const float* src = nullptr;
  int64_t src_ld = 0;
  void* dst = nullptr;
  int64_t dst_ld = 0;
  int64_t rows = 0, cols = 0, pad_to = 0;
  const int32_t* row_limits = nullptr;
  int64_t group_rows = 0;
};
void launch_narrow_rows(const NarrowRows& n, DType dtype, cudaStream_t stream);

// Rows of one dtype copied into rows of another width: dst[r, c] = src[r, c] for c < copy_cols,
// 0 for c in [copy_cols, dst_cols). Element bytes `elem`. A warp a row, in 16-byte words where
// every width, stride and pointer is whole words.
struct CopyRows {
  const void* src = nullptr;
  int64_t src_ld = 0;
  void* dst = nullptr;
  int64_t dst_ld = 0;
  int64_t rows = 0, copy_cols = 0, dst_cols = 0;
};
void launch_copy_rows(const CopyRows& c, int elem, cudaStream_t stream);

// The router after its logits GEMM, one thread per token: the top_k experts by descending logit
// (strict '>', so a tie goes to the lower expert, as the CPU router), then the softmax of those k
// logits, subtracting the first (largest).
struct TopKSoftmax {
  const float* logits = nullptr;  // [m, E]
  int32_t* indices = nullptr;     // [m, k]
  float* weights = nullptr;       // [m, k]
  int m = 0, num_experts = 0, top_k = 0;
};
void launch_top_k_softmax(const TopKSoftmax& t, cudaStream_t stream);

// Groups a call's (token, slot) pairs by expert into fixed-capacity slots, a block an expert
// (the pairs split over its threads in order, placed by a block scan), so each expert's rows
// keep token order (as the CPU):
//   counts[e]              rows of expert e (<= capacity)
//   token_of_row[e * capacity + i]   the token of expert e's i-th row
//   row_of_pair[t * k + j]           where pair (t, j)'s row is: e * capacity + i
struct GroupPairs {
  const int32_t* indices = nullptr;  // [m, k]
  int32_t* counts = nullptr;         // [E]
  int32_t* token_of_row = nullptr;   // [E, capacity]
  int32_t* row_of_pair = nullptr;    // [m, k]
  int m = 0, num_experts = 0, top_k = 0, capacity = 0;
};
void launch_group_pairs(const GroupPairs& g, cudaStream_t stream);

// The experts' GEMMs run as batches of equal tiles of `tile` rows (device_experts.hpp), planned
// on the device from the counts, in one block: group g (an expert; rows g * group_rows + i for
// i < counts[g]) gets ceil(counts[g] / tile) tiles, in group order. Tile j of a group starts at
// row min(j tile, max(count, tile) - tile) of it: the last one is moved back to end at the count
// (overlapping its neighbour, which computes the same rows the same way), and no tile leaves its
// group (tile <= group_rows). Tiles past the live ones, up to max_tiles, address each operand's
// `dead` rows, so a batch of max_tiles GEMMs, a size the host knows, does the call.
// Each operand is addressed in bytes: for tile t of group g starting at global row r,
//   tiles[t] = base + (per_group ? g : r) * step         (dead tiles: tiles[t] = dead)
// (x, hidden, act and out step by rows; the weights w1 and w2 by groups.)
struct TileOperand {
  const void* base = nullptr;
  int64_t step = 0;  // bytes per row, or per group where per_group
  bool per_group = false;
  const void* dead = nullptr;
  const void** tiles = nullptr;  // [max_tiles] (device)
};
struct PlanTiles {
  static constexpr int kOperands = 6;  // x, w1, hidden, act, w2, out (device_experts.hpp)
  const int32_t* counts = nullptr;     // [groups], each <= group_rows
  int groups = 0, tile = 0, max_tiles = 0;
  int64_t group_rows = 0;
  int32_t* first_tile = nullptr;  // [groups + 1] scratch: each group's first tile, then the total
  TileOperand operands[kOperands];
  // With device stats: tally[0] = the rows in use (sum of counts), tally[1] = the rows of the
  // live tiles; plain stores, read by the host after an event (host-mapped). Null: not counted.
  int64_t* tally = nullptr;
};
void launch_plan_tiles(const PlanTiles& p, cudaStream_t stream);

// gathered[e * capacity + i, :] = x[token_of_row[e * capacity + i], :] for i < counts[e], in
// elements of `elem` bytes (the layer's dtype: the expert GEMMs read it as it came). The rows
// past a count are not walked; rows are copied in 16-byte words where H elem is a multiple of 16.
struct GatherRows {
  const void* x = nullptr;  // [m, H]
  const int32_t* counts = nullptr;
  const int32_t* token_of_row = nullptr;
  void* gathered = nullptr;  // [E, capacity, H]
  int num_experts = 0, capacity = 0, H = 0;
};
void launch_gather_rows(const GatherRows& g, int elem, cudaStream_t stream);

// The experts' activation on f32 hidden rows [rows, halves * width] (ld = halves * width),
// written rounded to `dtype` (f32 or bf16, the second GEMM's input) into out [rows, out_ld]:
// relu / gelu of column c, or swiglu's silu(gate c) * linear c. out may be hidden itself (f32,
// out_ld = its ld: each element is read before the thread writes it). Rows past a group's limit
// are skipped and not walked (row_limits as WidenRows; may be null).
struct Activate {
  const float* hidden = nullptr;
  void* out = nullptr;
  int64_t out_ld = 0;
  int64_t rows = 0, width = 0;
  int act = 0;  // pmoe::Activation
  const int32_t* row_limits = nullptr;
  int64_t group_rows = 0;
};
void launch_activate(const Activate& a, DType dtype, cudaStream_t stream);

// The gating: y[t, o] = sum over j of weights[t, j] * rows[row_of_pair[t * k + j], o], in f32,
// in slot order, rounded once to `dtype` (f32 or bf16) into y [m, O] contiguous. A warp a token,
// as the row kernels.
struct WeightedSum {
  const float* rows = nullptr;  // [*, O]
  const int32_t* row_of_pair = nullptr;
  const float* weights = nullptr;
  void* y = nullptr;
  int m = 0, top_k = 0, O = 0;
};
void launch_weighted_sum(const WeightedSum& w, DType dtype, cudaStream_t stream);

// TpMoe's check that every rank all-reduces as many elements as this one, made on the device:
// host-mapped memory that the sum kernel writes on the first mismatch it meets (theirs and mine,
// then peer with release, all system-scope atomic stores) and that the host reads at the next
// call's entry without synchronising (take(): peer with acquire, so theirs and mine are that
// mismatch's). The same protocol as the overlap ops' FaultWord (overlap/signals.cuh).
struct CountMismatch {
  int64_t theirs = 0, mine = 0;
  int32_t peer = -1;  // -1: every rank's count matched
};

class CountMismatchRecord {
 public:
  CountMismatchRecord();  // peer = -1
  ~CountMismatchRecord();
  CountMismatchRecord(const CountMismatchRecord&) = delete;
  CountMismatchRecord& operator=(const CountMismatchRecord&) = delete;

  CountMismatch* device() const { return device_; }  // what the sum kernel writes
  // The mismatch a sum kernel recorded, if one has, and peer = -1 again, so that it is raised
  // once. Seen at the latest once the host has synchronised with the stream.
  std::optional<CountMismatch> take();

 private:
  CountMismatch* host_ = nullptr;
  CountMismatch* device_ = nullptr;
};

// *word = n, stored for peers (they read it once a release after it on the stream, the landed
// signal, lets them): a rank's element count for this call, before its partial is announced.
void launch_publish_count(uint64_t* word, int64_t n, cudaStream_t stream);

// The TP all-reduce's sum: out[i] = round(((0 + part_0[i]) + part_1[i]) + ...), the W ranks'
// f32 partials in rank order, so every rank gets the same bits. If a rank's published count
// differs from n, nothing is summed (out keeps what it held) and *mismatch records it.
struct SumPartials {
  const float* const* parts = nullptr;    // device array of W pointers (peers' regions)
  const uint64_t* const* counts = nullptr;  // device array of W pointers (peers' count words)
  CountMismatch* mismatch = nullptr;        // host-mapped
  int world = 0;
  void* out = nullptr;
  int64_t n = 0;
};
void launch_sum_partials(const SumPartials& s, DType dtype, cudaStream_t stream);

// EpMoe's traffic over a call's routing (moe/ep_traffic.hpp, the CPU layer's rule), in one
// block: *rows = the sum of ep_token_rows_moved over the m rows of indices [m, k], in a fixed
// order. *rows may be host-mapped memory, read by the host once the stream has passed the kernel.
struct CountEpRows {
  const int32_t* indices = nullptr;  // [m, k]
  int64_t* rows = nullptr;
  int m = 0, top_k = 0, num_experts = 0, num_local = 0, rank = 0;
};
void launch_count_ep_rows(const CountEpRows& c, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
