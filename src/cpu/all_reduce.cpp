#include "cpu/all_reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/arg_checks.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::cpu {
namespace {

constexpr size_t kHeaderBytes = 64;  // the partial's element count, one cache line

size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

AllReduceSum::AllReduceSum(Communicator& comm, int64_t max_elems)
    : rank_(comm.rank()), world_size_(comm.size()), max_elems_(max_elems) {
  PMOE_CHECK(max_elems >= 0 && max_elems <= INT32_MAX,
             "AllReduceSum: max_elems must be in 0..2^31-1, got ", max_elems);
  chunk_capacity_ = (max_elems + world_size_ - 1) / world_size_;
  slot_bytes_ = align64(sizeof(float) * size_t(chunk_capacity_));
  const size_t bytes =
      size_t(world_size_) * (kHeaderBytes + slot_bytes_) + size_t(world_size_) * slot_bytes_;
  memory_ = comm.alloc_symmetric(bytes, 2 * world_size_);
  sum_.reserve(size_t(chunk_capacity_));
}

AllReduceSum::~AllReduceSum() = default;

size_t AllReduceSum::partial_offset(int source) const {
  return size_t(source) * (kHeaderBytes + slot_bytes_);
}

size_t AllReduceSum::reduced_offset(int owner) const {
  return size_t(world_size_) * (kHeaderBytes + slot_bytes_) + size_t(owner) * slot_bytes_;
}

int64_t AllReduceSum::bytes_sent(int64_t n) const {
  int64_t sent = 0;
  for (int c = 0; c < world_size_; ++c) {
    if (c == rank_) continue;
    sent += int64_t(sizeof(float)) * shard_rows(int(n), world_size_, c).size();      // its chunk
    sent += int64_t(sizeof(float)) * shard_rows(int(n), world_size_, rank_).size();  // mine
  }
  return sent;
}

size_t AllReduceSum::workspace_bytes() const {
  return memory_->bytes() + size_t(memory_->signal_slots()) * SymmetricMemory::kSignalBytes +
         sum_.capacity() * sizeof(float);
}

void AllReduceSum::run(float* data, int64_t n, const std::string& op) {
  PMOE_CHECK(n >= 0 && n <= max_elems_, op, ": all-reduce of ", n, " elements, outside the 0..",
             max_elems_, " it was built for");
  ++epoch_;
  const int W = world_size_;
  std::byte* region = memory_->local();

  // Reduce-scatter: chunk c of this rank's partial goes to rank c.
  for (int step = 1; step < W; ++step) {
    const int c = (rank_ + step) % W;  // start with the next rank, so peers do not all hit rank 0
    const RowRange chunk = shard_rows(int(n), W, c);
    memory_->put(c, partial_offset(rank_), &n, sizeof n);
    if (chunk.size() > 0)
      memory_->put(c, partial_offset(rank_) + kHeaderBytes, data + chunk.begin,
                   sizeof(float) * size_t(chunk.size()));
    memory_->signal(c, rank_, epoch_);
  }
  const RowRange mine = shard_rows(int(n), W, rank_);
  std::vector<float>& sum = sum_;
  sum.assign(size_t(mine.size()), 0.0f);
  for (int s = 0; s < W; ++s) {
    const float* part = data + mine.begin;
    if (s != rank_) {
      memory_->wait_signal(s, epoch_, {op, s, "its partial sums (all-reduce)"});
      int64_t their_n;
      std::memcpy(&their_n, region + partial_offset(s), sizeof their_n);
      detail::check_all_reduce_count(op, s, their_n, rank_, n);
      part = reinterpret_cast<const float*>(region + partial_offset(s) + kHeaderBytes);
    }
    for (int i = 0; i < mine.size(); ++i) sum[size_t(i)] += part[i];
  }

  // All-gather: this rank's summed chunk goes to every rank.
  for (int step = 1; step < W; ++step) {
    const int r = (rank_ + step) % W;
    if (!sum.empty())
      memory_->put(r, reduced_offset(rank_), sum.data(), sizeof(float) * sum.size());
    memory_->signal(r, W + rank_, epoch_);
  }
  std::copy(sum.begin(), sum.end(), data + mine.begin);
  for (int o = 0; o < W; ++o) {
    if (o == rank_) continue;
    memory_->wait_signal(W + o, epoch_, {op, o, "its reduced chunk (all-reduce)"});
    const RowRange chunk = shard_rows(int(n), W, o);
    if (chunk.size() > 0)
      std::memcpy(data + chunk.begin, region + reduced_offset(o),
                  sizeof(float) * size_t(chunk.size()));
  }
}

}  // namespace pmoe::cpu
