// The checks every MoE layer runs on its constructor and forward() arguments, so that each
// layer's messages read alike.
#pragma once

#include "moe/rows.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::detail {

inline void check_max_tokens(const char* op, const char* name, int max_tokens) {
  PMOE_CHECK(max_tokens >= 1, op, ": ", name,
             " must be >= 1 (the most tokens one forward takes, which sizes the buffers), got ",
             max_tokens);
}

// x [m, feature_dim] and y [m, out_dim], both config.dtype and contiguous, m <= max_tokens.
inline void check_forward(const char* op, const MoeConfig& config, int max_tokens, const Tensor& x,
                          const Tensor& y) {
  check_rows(op, "x", x, -1, config.feature_dim, {config.dtype}, true);
  PMOE_CHECK(x.size(0) <= max_tokens, op, ": x has ", x.size(0), " tokens, more than the ",
             max_tokens, " this layer was built for; build it with a larger max_tokens");
  check_rows(op, "y", y, x.size(0), config.out_dim(), {config.dtype}, true);
}

}  // namespace pmoe::detail
