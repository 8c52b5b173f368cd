// AllGatherGemm / GemmReduceScatter cases shared by the thread tests and the MPI tests: the same
// case runs on any Communicator and every call is checked against the plain reference.
#pragma once

#include <cstdint>
#include <string>

#include "pmoe/overlap.hpp"

namespace pmoe::testing {

enum class OverlapKind : uint8_t { all_gather_gemm, gemm_reduce_scatter };

// Which entry points the calls of a case use, call after call.
enum class CallMix : uint8_t {
  overlapped,  // run() every time
  serial,      // run_serial() every time
  mixed,       // run(), run_serial(both), run_serial(communicate) + run_serial(gemm), again
};

struct OverlapCase {
  OverlapKind kind = OverlapKind::all_gather_gemm;
  OverlapConfig config;
  int calls = 3;
  CallMix mix = CallMix::mixed;
  uint64_t seed = 1;
  // Where A, B and C live and the op runs (the communicator's device); on a CUDA device C is read
  // back after the rank's stream has run the call.
  Device device = Device::cpu();
};

// min_overlap_bytes = 0: even these small calls use the communication thread where there is one.
OverlapConfig make_overlap_config(int64_t m, int64_t n, int64_t k, DType dtype, int chunks = 0,
                                  OverlapOrder order = OverlapOrder::all_pairs);

struct OverlapResult {
  std::string error;      // "" when every call matched the reference and left A and B alone
  uint64_t digest = 0;    // a hash of every output byte, to compare runs
  bool overlaps = false;  // what the op reported
};

// Runs the case on `comm` (collective): one op, one C buffer reused by every call, new inputs
// (seed + call) for every call, C filled with NaNs before it.
OverlapResult run_overlap_case(Communicator& comm, const OverlapCase& c);

std::string describe(const OverlapCase& c);

}  // namespace pmoe::testing
