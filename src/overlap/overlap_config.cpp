// OverlapConfig's checks and the order names: what every overlap op requires of its sizes.
#include <climits>
#include <cstring>

#include "pmoe/error.hpp"
#include "pmoe/overlap.hpp"

namespace pmoe {

void OverlapConfig::validate(const char* op, int world_size) const {
  const bool gather = std::strcmp(op, "AllGatherGemm") == 0;
  PMOE_CHECK(world_size >= 1, op, ": world size must be >= 1, got ", world_size);
  PMOE_CHECK(m >= 1 && n >= 1 && k >= 1, op, ": M, N and K must be >= 1, got M = ", m, ", N = ", n,
             ", K = ", k);
  PMOE_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, op,
             ": M, N and K must be at most 2^31 - 1 (BLAS takes int sizes), got M = ", m,
             ", N = ", n, ", K = ", k);
  PMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op,
             ": dtype must be f32, bf16 or f16, got ", dtype_name(dtype));
  PMOE_CHECK(m % world_size == 0, op, ": M (", m, ") must be divisible by the world size (",
             world_size, "): every rank ", gather ? "holds" : "receives", " M/W rows");
  if (gather) {
    PMOE_CHECK(n % world_size == 0, op, ": N (", n, ") must be divisible by the world size (",
               world_size, "): every rank holds N/W columns of B");
  } else {
    PMOE_CHECK(k % world_size == 0, op, ": K (", k, ") must be divisible by the world size (",
               world_size, "): every rank holds K/W columns of A and K/W rows of B");
  }
  PMOE_CHECK(chunks >= 0, op, ": chunks must be >= 0 (0 means one per rank), got ", chunks);
  const int resolved = chunks_for(world_size);
  PMOE_CHECK(resolved % world_size == 0, op, ": chunks (", resolved,
             ") must be a multiple of the world size (", world_size,
             "): each rank's block of M/W rows is cut into chunks/W pieces");
  if (gather) {
    PMOE_CHECK(resolved <= m, op, ": chunks (", resolved, ") exceeds M (", m,
               "): every piece needs at least one row");
  } else {
    PMOE_CHECK(resolved / world_size <= n, op, ": chunks / W (", resolved / world_size,
               ") exceeds N (", n, "): every piece of a block needs at least one column");
  }
  PMOE_CHECK(min_overlap_bytes >= 0, op, ": min_overlap_bytes must be >= 0, got ",
             min_overlap_bytes);
  PMOE_CHECK(order == OverlapOrder::all_pairs || order == OverlapOrder::ring, op,
             ": order must be all_pairs or ring, got ", int(order));
}

const char* order_name(OverlapOrder order) {
  return order == OverlapOrder::ring ? "ring" : "all-pairs";
}

OverlapOrder parse_order(const char* name) {
  if (std::strcmp(name, "ring") == 0) return OverlapOrder::ring;
  if (std::strcmp(name, "all-pairs") == 0 || std::strcmp(name, "all_pairs") == 0)
    return OverlapOrder::all_pairs;
  throw Error(detail::cat("unknown overlap order '", name, "'; expected ring or all-pairs"));
}

}  // namespace pmoe
