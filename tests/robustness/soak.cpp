// Topology: MPI processes on one node (ctest: 4 under mpiexec; `make soak`: 4), shared memory.
// A long run of AllToAll dispatch/combine calls where the input dtype, the expert output dtype,
// the routing, every rank's m and the phases change on every call, each result checked against
// the plain reference, and resident memory sampled: after the warm-up it may not grow by more
// than 1 MiB on any rank (a leak of even a few bytes per call shows over thousands of calls).
//
// Usage: soak CALLS [WARMUP]   (WARMUP defaults to CALLS / 10, at least 50)
// Prints one summary line from rank 0; exits non-zero on every rank if any check failed.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "all_to_all_cases.hpp"
#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"
#include "reference/all_to_all_reference.hpp"

namespace {

using namespace pmoe;
using reference::AllToAllInputs;
using reference::hash64;

constexpr uint8_t kSentinel = 0x5A;
constexpr int64_t kMaxGrowthBytes = 1 << 20;
// AddressSanitizer keeps freed memory in a quarantine (256 MiB by default), so resident memory
// grows there whatever the code does: the limit is judged in plain builds only.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kJudgeMemory = false;
#else
constexpr bool kJudgeMemory = true;
#endif

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

// One AllToAll per input dtype, built once and reused: the soak is about many calls, not many
// constructions. Outputs are allocated once per op, at the largest size.
struct Op {
  AllToAllConfig config;
  std::unique_ptr<AllToAll> a2a;
  Buffer counts, expert_x, expert_x_scale;
  Buffer expert_y[3];  // f32, bf16, f16

  Op(Communicator& comm, DType in, DType out) {
    const int W = comm.size();
    config = testing::make_config(/*max_tokens=*/24, /*experts=*/2 * W, /*top_k=*/3,
                                  /*hidden=*/64, in, out, in == DType::f8e4m3 ? 32 : 0);
    a2a = std::make_unique<AllToAll>(comm, config);
    const int E_local = config.num_experts / W;
    const int64_t rows = int64_t(W) * config.max_tokens;
    counts = Buffer(DType::i32, {E_local});
    expert_x = Buffer(in, {E_local, rows, config.hidden_dim});
    if (in == DType::f8e4m3)
      expert_x_scale = Buffer(DType::f32, {E_local, rows, config.scales_per_token()});
    const DType ys[3] = {DType::f32, DType::bf16, DType::f16};
    for (int i = 0; i < 3; ++i) expert_y[i] = Buffer(ys[i], {E_local, rows, config.hidden_dim});
  }
};

// Runs call number `call` on `op`; returns "" or the first mismatch.
std::string run_call(Communicator& comm, Op& op, uint64_t seed, int call) {
  const int W = comm.size(), rank = comm.rank();
  const AllToAllConfig& cfg = op.config;
  const bool f8 = cfg.in_dtype == DType::f8e4m3;
  const uint64_t h = hash64(seed, uint64_t(call));
  const auto routing = static_cast<reference::Routing>((h >> 8) % 3);
  Buffer& expert_y = op.expert_y[(h >> 16) % 3];
  const bool split = (h >> 24) % 2;

  std::vector<AllToAllInputs> all;
  for (int r = 0; r < W; ++r) {
    const int m = int(hash64(seed, uint64_t(call), uint64_t(r)) % uint64_t(cfg.max_tokens + 1));
    all.push_back(reference::make_inputs(cfg, r, m, hash64(seed, uint64_t(call), 99), routing));
  }
  const AllToAllInputs& mine = all[size_t(rank)];
  std::memset(op.expert_x.data<void>(), kSentinel, op.expert_x.nbytes());
  if (f8) std::memset(op.expert_x_scale.data<void>(), kSentinel, op.expert_x_scale.nbytes());
  const Tensor scale_out = f8 ? op.expert_x_scale.tensor() : Tensor();
  Buffer y(cfg.out_dtype, {mine.m, cfg.hidden_dim});

  auto phases = [&](auto&& fn) {
    if (!split) return fn(Phase::both);
    fn(Phase::send);
    fn(Phase::recv);
  };
  phases([&](Phase p) {
    op.a2a->dispatch(mine.x, mine.x_scale_or_empty(), mine.indices, op.counts, op.expert_x,
                     scale_out, p);
  });
  const auto expected = reference::reference_dispatch(cfg, W, rank, all);
  std::string error = reference::compare_dispatch(cfg, W, expected, op.counts, op.expert_x,
                                                  scale_out, kSentinel);
  reference::run_fake_experts(cfg, W, rank, op.counts, op.expert_x, scale_out, expert_y);
  phases([&](Phase p) { op.a2a->combine(expert_y, mine.indices, mine.weights, y, p); });
  if (error.empty())
    error = reference::compare_bytes("combine y", y,
                                     reference::reference_combine(cfg, mine, expert_y.tensor().dtype()));
  return error;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int calls = argc > 1 ? std::atoi(argv[1]) : 500;
  const int warmup = argc > 2 ? std::atoi(argv[2]) : std::max(50, calls / 10);
  int failed = 0;
  std::string first_error;
  int64_t rss_warm = 0, rss_max = 0;
  double seconds = 0;
  try {
    MpiCommunicator comm(MPI_COMM_WORLD);
    std::vector<std::unique_ptr<Op>> ops;
    // (input, output) dtypes: each op fixes both; the expert output dtype varies per call.
    const std::pair<DType, DType> dtypes[] = {{DType::f32, DType::bf16}, {DType::bf16, DType::f32},
                                              {DType::f16, DType::f16}, {DType::f8e4m3, DType::bf16}};
    for (const auto& [in, out] : dtypes) ops.push_back(std::make_unique<Op>(comm, in, out));
    const uint64_t seed = 0x50a4;
    const auto start = std::chrono::steady_clock::now();
    for (int call = 0; call < calls; ++call) {
      Op& op = *ops[hash64(seed, uint64_t(call), 7) % ops.size()];
      const std::string error = run_call(comm, op, seed, call);
      // Keep going after a mismatch: the peers are in the same call.
      if (!error.empty() && first_error.empty())
        first_error = detail::cat("call ", call, " (in ", dtype_name(op.config.in_dtype),
                                  "): ", error);
      if (call + 1 == warmup) rss_warm = resident_bytes();
      if (call + 1 >= warmup) rss_max = std::max(rss_max, resident_bytes());
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } catch (const std::exception& e) {
    first_error = std::string("threw: ") + e.what();
  }
  const int64_t growth = rss_max - rss_warm;
  if (!first_error.empty()) {
    std::fprintf(stderr, "soak: rank %d FAILED: %s\n", rank, first_error.c_str());
    failed = 1;
  } else if (kJudgeMemory && growth > kMaxGrowthBytes) {
    std::fprintf(stderr, "soak: rank %d FAILED: resident memory grew by %lld bytes after call %d\n",
                 rank, static_cast<long long>(growth), warmup);
    failed = 1;
  }
  int any = 0;
  int64_t worst_growth = 0, worst_rss = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&growth, &worst_growth, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&rss_max, &worst_rss, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    int W = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    std::printf("soak: %s: %d calls x %d ranks in %.1f s (%.2f ms per call); resident memory after "
                "call %d: largest growth %lld bytes (limit %lld%s), largest RSS %.1f MiB\n",
                any ? "FAILED" : "ok", calls, W, seconds, 1e3 * seconds / std::max(calls, 1),
                warmup, static_cast<long long>(worst_growth),
                static_cast<long long>(kMaxGrowthBytes),
                kJudgeMemory ? "" : ", not judged under AddressSanitizer",
                double(worst_rss) / (1 << 20));
  }
  MPI_Finalize();
  return any;
}
