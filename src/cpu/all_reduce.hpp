// A sum of an f32 array over the ranks of a group, in place, the same bits on every rank: a
// reduce-scatter then an all-gather, built on SymmetricMemory puts and epoch signals. TpMoe runs
// it once per forward over the layer output.
//
// The array of n elements is cut into W chunks (shard_rows over elements); rank c reduces chunk c.
//
//   rank c's symmetric region
//   +---------------------------------------------------------------------------------+
//   | partial area, slot s = 0..W-1: | n of rank s (i64, 64 B) | rank s's chunk c, f32 |
//   | reduced area, slot o = 0..W-1: | chunk o, summed by rank o, f32                 |
//   +---------------------------------------------------------------------------------+
//   signals: s = rank s's partial chunk arrived; W + o = rank o's reduced chunk arrived
//
// Each rank sends (W - 1) / W of the array in each phase; chunk c is summed on rank c alone, in
// rank order 0..W-1, so every rank ends with identical bits whatever W is.
//
// Reuse without barriers: rank s writes its partial into rank c's slot s for call i + 1 only
// after it received c's reduced chunk of call i, which c sends after it has read every partial of
// call i. Rank o writes its reduced chunk into rank s's slot o for call i + 1 only after it
// received s's partial of call i + 1, which s sends after it has read call i's reduced chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::cpu {

class AllReduceSum {
 public:
  // Collective over comm; sized for arrays of up to max_elems floats.
  AllReduceSum(Communicator& comm, int64_t max_elems);
  ~AllReduceSum();

  // Collective: data[i] = sum over ranks r, in rank order, of rank r's data[i], for i < n.
  // n <= max_elems and the same on every rank; a rank that sees another n from a peer throws
  // pmoe::Error naming `op` and both counts. Waits are bounded (PMOE_TIMEOUT_S).
  void run(float* data, int64_t n, const std::string& op);

  // Bytes this rank sends to other ranks for an n-element call.
  int64_t bytes_sent(int64_t n) const;
  size_t workspace_bytes() const;

 private:
  size_t partial_offset(int source) const;
  size_t reduced_offset(int owner) const;

  int rank_, world_size_;
  int64_t max_elems_, chunk_capacity_;
  size_t slot_bytes_;
  std::unique_ptr<SymmetricMemory> memory_;
  uint64_t epoch_ = 0;
  std::vector<float> sum_;  // this rank's chunk, summed
};

}  // namespace pmoe::cpu
