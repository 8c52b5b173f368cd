// The checks every MoE layer runs on its constructor and forward() arguments, so that each
// layer's messages read alike.
#pragma once

#include <functional>

#include "core/config_agreement.hpp"
#include "moe/rows.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::detail {

inline void check_max_tokens(const char* op, const char* name, int max_tokens) {
  PMOE_CHECK(max_tokens >= 1, op, ": ", name,
             " must be >= 1 (the most tokens one forward takes, which sizes the buffers), got ",
             max_tokens);
}

// Collective: every rank of a TP or EP layer must build it from the same MoeConfig (and the same
// `extra` fields); `validate` is this rank's own check. Throws the same pmoe::Error on every rank
// otherwise (core/config_agreement.hpp).
inline void agree_on_layer(Communicator& comm, const char* layer, const MoeConfig& config,
                           const std::function<void(ConfigAgreement&)>& extra,
                           const std::function<void()>& validate) {
  ConfigAgreement agree(layer);
  agree.field("hidden_dim", config.hidden_dim);
  agree.field("ffn_dim", config.ffn_dim);
  agree.field("output_dim", config.out_dim());
  agree.field("num_experts", config.num_experts);
  agree.field("top_k", config.top_k);
  agree.field("act", int64_t(config.act), [](int64_t v) {
    return v >= 0 && v <= int64_t(Activation::swiglu) ? std::string(activation_name(Activation(v)))
                                                       : std::to_string(v);
  });
  agree.field("dtype", int64_t(config.dtype), show_dtype);
  agree.field("seed", int64_t(config.seed));
  extra(agree);
  agree.check(comm, validate);
}

// x [m, hidden_dim] and y [m, out_dim], both config.dtype, contiguous and on the layer's
// device, m <= max_tokens (the constructor argument, the same word in C++ and Python).
inline void check_forward(const char* op, const MoeConfig& config, int max_tokens,
                          const Tensor& x, const Tensor& y, Device device = Device::cpu()) {
  check_rows(op, "x", x, -1, config.hidden_dim, {config.dtype}, true, device);
  PMOE_CHECK(x.size(0) <= max_tokens, op, ": x has ", x.size(0), " tokens, more than the ",
             max_tokens, " this layer was built for; build it with a larger max_tokens");
  check_rows(op, "y", y, x.size(0), config.out_dim(), {config.dtype}, true, device);
}

}  // namespace pmoe::detail
