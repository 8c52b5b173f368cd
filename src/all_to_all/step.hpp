// The four steps of an AllToAll round, in the order every rank must take them. The front end
// checks the order with it, and a CUDA kernel names the step it failed in by it.
#pragma once

#include <cstdint>

#include "pmoe/all_to_all.hpp"

namespace pmoe::detail {

// Declared (opaque) in pmoe/all_to_all.hpp, which keeps the next step.
enum class Step : int32_t { dispatch_send, dispatch_recv, combine_send, combine_recv };
constexpr int kSteps = 4;

inline Step next_step(Step step) { return Step((int(step) + 1) % kSteps); }

// "dispatch(send)", ...; "?" for a value outside the enum (a corrupted error word).
inline const char* step_name(int32_t step) {
  static const char* const names[kSteps] = {"dispatch(send)", "dispatch(recv)", "combine(send)",
                                            "combine(recv)"};
  return step >= 0 && step < kSteps ? names[step] : "?";
}
inline const char* step_name(Step step) { return step_name(int32_t(step)); }

}  // namespace pmoe::detail
