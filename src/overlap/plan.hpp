// The pipeline of the overlap ops, as pure logic: how M is cut into pieces, in which order a
// rank handles them, who sends what to whom, and the signal protocol. No memory is touched here,
// so tests check it without threads. Both backends follow it: the CPU's
// (src/cpu/all_gather_gemm.cpp, gemm_reduce_scatter.cpp) and the CUDA one (src/cuda/overlap).
//
// Rows of M:   | block 0 (rank 0) | block 1 (rank 1) | ... | block W-1 |, M/W rows each;
//              each block cut into P = chunks / W pieces: | piece 0 | piece 1 | ... |
//              (piece sizes differ by at most one row, larger ones first). GemmReduceScatter
//              cuts a block's N columns into its P pieces instead.
//
// Signals, 2W slots per rank, each a monotonic count of pieces (calls are numbered 1, 2, ...):
//   arrival(x), x < W:  pieces of slot x's data that have landed here. Piece p of call e is
//                       announced with (e - 1) * P + p + 1, a whole block with e * P; one writer
//                       per slot and call, pieces in order.
//   ready(q) = W + q:   the last call rank q has entered. A rank writes into q's symmetric
//                       memory for call e only once ready(q) >= e: q is done reading call e-1.
#pragma once

#include <cstdint>
#include <vector>

namespace pmoe::detail {

// `extent` cut into `parts` consecutive parts whose sizes differ by at most one, larger first.
struct EvenSplit {
  int64_t extent;
  int parts;

  int64_t size(int p) const { return extent / parts + (p < extra() ? 1 : 0); }
  int64_t begin(int p) const { return int64_t(p) * (extent / parts) + (p < extra() ? p : extra()); }
  int64_t extra() const { return extent % parts; }
};

class ChunkLayout {
 public:
  // m: global rows (a multiple of world_size); chunks: a multiple of world_size. AllGatherGemm
  // cuts each block into chunks / W pieces of rows (chunks <= m); GemmReduceScatter cuts its
  // columns instead (gemm_reduce_scatter.cpp says why) and uses the counts and signals only.
  ChunkLayout(int64_t m, int world_size, int chunks)
      : world_size_(world_size), block_rows_(m / world_size), pieces_(chunks / world_size) {}

  int world_size() const { return world_size_; }
  int pieces() const { return pieces_; }
  int64_t block_rows() const { return block_rows_; }
  // Rows of piece p and where it starts inside its block.
  int64_t piece_rows(int p) const { return EvenSplit{block_rows_, pieces_}.size(p); }
  int64_t piece_begin(int p) const { return EvenSplit{block_rows_, pieces_}.begin(p); }
  // The first global row of piece p of block b.
  int64_t row(int block, int p) const { return int64_t(block) * block_rows_ + piece_begin(p); }

  // Signal slots and values (see the file comment).
  int arrival_slot(int x) const { return x; }
  int ready_slot(int q) const { return world_size_ + q; }
  int signal_slots() const { return 2 * world_size_; }
  uint64_t piece_signal(uint64_t call, int p) const { return (call - 1) * pieces_ + p + 1; }
  uint64_t block_signal(uint64_t call) const { return call * pieces_; }

 private:
  int world_size_;
  int64_t block_rows_;
  int pieces_;
};

inline int ring_index(int r, int world_size) {
  return ((r % world_size) + world_size) % world_size;
}

// One step of a rank's pipeline: piece `piece` of block `block`, at step `step` of W.
struct PieceStep {
  int step;
  int block;
  int piece;
};

// AllGatherGemm on `rank`: blocks rank, rank+1, ... (own first: it needs no transfer), pieces in
// order. Both orders deliver (and multiply) in this order.
inline std::vector<PieceStep> all_gather_steps(int rank, const ChunkLayout& layout) {
  std::vector<PieceStep> steps;
  const int W = layout.world_size();
  for (int s = 0; s < W; ++s)
    for (int p = 0; p < layout.pieces(); ++p) steps.push_back({s, ring_index(rank + s, W), p});
  return steps;
}

// One put of AllGatherGemm: rank `dest` receives piece `piece` of block `block` from this rank.
// `relayed`: the piece came from rank+1 and must have arrived here before it is forwarded.
struct GatherSend {
  int dest;
  int block;
  int piece;
  bool relayed;
};

// What `rank` sends, in order. At step s (1..W-1) rank q needs block q+s. all-pairs: the owner r
// puts its own block to r-s. ring: rank r forwards block r+s-1 to r-1 (its own at s = 1).
inline std::vector<GatherSend> all_gather_sends(int rank, const ChunkLayout& layout, bool ring) {
  std::vector<GatherSend> sends;
  const int W = layout.world_size();
  for (int s = 1; s < W; ++s)
    for (int p = 0; p < layout.pieces(); ++p) {
      if (ring)
        sends.push_back({ring_index(rank - 1, W), ring_index(rank + s - 1, W), p, s >= 2});
      else
        sends.push_back({ring_index(rank - s, W), rank, p, false});
    }
  return sends;
}

// GemmReduceScatter on `rank`: blocks rank+1, rank+2, ..., rank (own last: its partial product
// stays here, so it is computed while the last piece for a peer is on its way), pieces in order.
// Rank q handles block b at step b-q-1, so block b's partial products come from ranks b-1, b-2,
// ..., b+1 in that order, then b's own: the order of the f32 sums in both orders (ring adds them
// along the way, all-pairs at the destination).
inline std::vector<PieceStep> reduce_scatter_steps(int rank, const ChunkLayout& layout) {
  std::vector<PieceStep> steps;
  const int W = layout.world_size();
  for (int s = 0; s < W; ++s)
    for (int p = 0; p < layout.pieces(); ++p) steps.push_back({s, ring_index(rank + 1 + s, W), p});
  return steps;
}

}  // namespace pmoe::detail
