#include "graph_replay.hpp"

#include "pmoe/error.hpp"

namespace pmoe::bench {
#if PMOE_BENCH_EMULATED_GRAPHS
namespace emulated_graphs {
extern const GraphReplay::Calls calls;
}
#endif
#if PMOE_BENCH_GPU_GRAPHS
namespace gpu_graphs {
extern const GraphReplay::Calls calls;
}
#endif

namespace {
const GraphReplay::Calls* chosen_calls() {
  if (cuda_emulated()) {
#if PMOE_BENCH_EMULATED_GRAPHS
    return &emulated_graphs::calls;
#endif
  } else {
#if PMOE_BENCH_GPU_GRAPHS
    return &gpu_graphs::calls;
#endif
  }
  PMOE_CHECK(false, "pmoe-bench: this build has no graph capture for the ",
             cuda_emulated() ? "emulated device" : "GPU", "'s runtime");
  return nullptr;
}
}  // namespace

GraphReplay::GraphReplay(Stream stream, const std::function<void()>& work)
    : calls_(chosen_calls()), stream_(stream.handle), exec_(calls_->capture(stream_, work)) {}

GraphReplay::~GraphReplay() { calls_->destroy(exec_); }

void GraphReplay::replay() { calls_->launch(exec_, stream_); }

}  // namespace pmoe::bench
