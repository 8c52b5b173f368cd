// pmoe-bench's subcommands: each adds itself to the CLI and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace pmoe::bench {

// `pmoe-bench all-to-all`: dispatch and combine latency, checked against the reference first.
void add_all_to_all_command(CLI::App& app);

// `pmoe-bench moe`: Simple vs TP vs EP MoE layers over a batch, top-k or feature sweep, each
// setting checked against the reference first.
void add_moe_command(CLI::App& app);

// `pmoe-bench all`: a quick pass of every benchmark, each part checked; the README's make bench.
void add_all_command(CLI::App& app);

// `pmoe-bench ag-gemm M N K` and `pmoe-bench gemm-rs M N K`: AllGatherGemm / GemmReduceScatter
// overlapped against the serial baseline, checked against the reference first.
void add_overlap_commands(CLI::App& app);

// `pmoe-bench model` (+ `model published`, `model calibrate`): the scaling model,
// docs/scaling-model.md.
void add_model_command(CLI::App& app);

}  // namespace pmoe::bench
