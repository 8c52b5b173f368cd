// GraphReplay's calls on the emulated device: compiled against its cuda_runtime.h (this file's
// own include path, tools/pmoe-bench/CMakeLists.txt).
#include <cuda_runtime.h>

#include "graph_replay.hpp"
#include "pmoe/error.hpp"

namespace pmoe::bench::emulated_graphs {
#include "graph_replay_calls.inc"
}  // namespace pmoe::bench::emulated_graphs
