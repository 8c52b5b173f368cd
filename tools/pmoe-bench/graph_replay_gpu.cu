// GraphReplay's calls on a GPU: CUDA's runtime (built where nvcc is found).
#include <cuda_runtime.h>

#include "graph_replay.hpp"
#include "pmoe/error.hpp"

namespace pmoe::bench::gpu_graphs {
#include "graph_replay_calls.inc"
}  // namespace pmoe::bench::gpu_graphs
