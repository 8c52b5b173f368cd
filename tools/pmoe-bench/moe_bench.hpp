// `pmoe-bench moe`: Simple vs TP vs EP MoE layers, the MoE layer comparison report's table
// done with pmoe's measurement protocol. moe_bench.cpp holds the CLI, the sweep and the report;
// moe_bench_run.cpp measures one layer variant at one setting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "pmoe/moe.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::bench {

enum class MoeVariantKind : uint8_t { simple, tp, ep };
const char* variant_key(MoeVariantKind v);  // "simple", "tp", "ep"

// What one variant is measured with.
struct MoeRunSpec {
  MoeVariantKind variant = MoeVariantKind::simple;
  MoeConfig config;
  int batch = 0;          // tokens of the whole batch: Simple and TP run all, EP shards them
  int ranks = 4;          // thread ranks (ignored under mpirun: the processes are the ranks)
  int micro_batches = 1;  // EP
  int iters = 20, warmup = 3;
  bool gemm_rate = false;  // EP: also time dense GEMMs of the same FLOPs on every rank
  int blas_threads = 0;    // per rank; 0: Simple all cores, TP and EP cores / ranks (>= 1)
  // The CPU, or a CUDA device: thread ranks share GPU 0 (the emulated device where none is
  // visible), x and y live there, and a forward is timed up to its stream's end.
  Device device = Device::cpu();
};

// One rank's expert-stage rate against a dense BLAS GEMM of the same FLOPs, both measured on all
// ranks at once (median over the timed iterations).
struct GemmRate {
  int rank = 0;
  int64_t rows = 0;       // rows this rank's experts computed
  int experts = 0;        // local experts that had rows
  double gflop = 0;       // GEMM work of those rows
  double grouped_ms = 0;  // EpMoe's expert stage: one GEMM pair per local expert
  double dense_ms = 0;    // one GEMM pair over all the rows, one expert's weight shapes
};

struct MoeRunResult {
  Stats ms;                 // per iteration, the slowest rank
  double max_mem_mb = 0;    // max over ranks of the peak bytes the rank allocated
  double weights_mb = 0;    // max over ranks of the layer's weights
  double workspace_mb = 0;  // max over ranks of everything else the layer holds
  double rss_mb = 0;        // peak resident set of the process (max over processes)
  double gflop_max = 0;     // max over ranks of router + expert GFLOP per forward
  double mb_moved_max = 0;  // max over ranks of MoeStats::bytes_moved, MB
  double route_ms = 0, dispatch_ms = 0, experts_ms = 0, combine_ms = 0, reduce_ms = 0;
  double check_error = 0;  // max relative error against the reference
  int checked_rows = 0;
  int blas_threads = 1;
  int ranks = 1;
  // The expert GEMMs: rows issued over rows in use, summed over ranks (1 on the CPU, which
  // computes exactly the rows in use; a device pads them to tiles: src/cuda/gemm/expert_tiles.hpp),
  // and the rows in use's GEMM FLOPs, over all ranks, per second of the slowest rank's expert
  // stage (median), in TFLOP/s.
  double issued_per_used = 0, gemm_tflops = 0;
  std::vector<GemmRate> gemm_rates;  // EP with gemm_rate
  // Which kernels ran the expert GEMMs (rank 0's last forward, MoeStats::expert_gemm): "" on
  // the CPU.
  std::string expert_gemm;
};

// Builds the layer on its ranks, checks one forward against `expected` (throws pmoe::Error on a
// mismatch), then times `iters` forwards after `warmup`. x is the whole batch.
MoeRunResult run_moe_variant(const MoeRunSpec& spec, const Tensor& x,
                             const reference::MoeExpected& expected);

}  // namespace pmoe::bench
