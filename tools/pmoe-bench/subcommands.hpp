// pmoe-bench's subcommands: each adds itself to the CLI and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace pmoe::bench {

// `pmoe-bench all-to-all`: dispatch and combine latency, checked against the reference first.
void add_all_to_all_command(CLI::App& app);

// `pmoe-bench ag-gemm M N K` and `pmoe-bench gemm-rs M N K`: AllGatherGemm / GemmReduceScatter
// overlapped against the serial baseline, checked against the reference first.
void add_overlap_commands(CLI::App& app);

}  // namespace pmoe::bench
