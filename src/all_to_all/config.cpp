// AllToAllConfig's checks, and its deprecated names moved to their current ones.
#include "pmoe/all_to_all.hpp"

#include <cmath>

#include "all_to_all/wire_dtypes.hpp"
#include "pmoe/error.hpp"

namespace pmoe {

using detail::is_output_dtype;
using detail::is_payload_dtype;

// The deprecated aliases are read here and nowhere else in the library.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
AllToAllConfig AllToAllConfig::with_current_names() const {
  AllToAllConfig c = *this;
  if (c.max_tokens == 0) c.max_tokens = max_num_tokens;
  if (c.top_k == 0) c.top_k = experts_per_token;
  c.max_num_tokens = c.experts_per_token = 0;
  return c;
}

void AllToAllConfig::validate(int world_size) const {
  if (max_num_tokens != 0 || experts_per_token != 0) {
    PMOE_CHECK(max_num_tokens == 0 || max_tokens == 0 || max_num_tokens == max_tokens,
               "AllToAllConfig: max_tokens = ", max_tokens, " and its deprecated alias "
               "max_num_tokens = ", max_num_tokens, " disagree; set max_tokens only");
    PMOE_CHECK(experts_per_token == 0 || top_k == 0 || experts_per_token == top_k,
               "AllToAllConfig: top_k = ", top_k, " and its deprecated alias experts_per_token = ",
               experts_per_token, " disagree; set top_k only");
    with_current_names().validate(world_size);
    return;
  }
#pragma GCC diagnostic pop
  PMOE_CHECK(world_size >= 1, "AllToAllConfig: world size must be >= 1, got ", world_size);
  PMOE_CHECK(max_tokens >= 1, "AllToAllConfig: max_tokens must be >= 1, got ", max_tokens);
  PMOE_CHECK(num_experts >= 1, "AllToAllConfig: num_experts must be >= 1, got ", num_experts);
  PMOE_CHECK(num_experts % world_size == 0, "AllToAllConfig: num_experts (", num_experts,
             ") must be divisible by the world size (", world_size, ")");
  PMOE_CHECK(top_k >= 1 && top_k <= num_experts, "AllToAllConfig: top_k must be in [1, ",
             "num_experts = ", num_experts, "], got ", top_k);
  PMOE_CHECK(hidden_dim >= 1, "AllToAllConfig: hidden_dim must be >= 1, got ", hidden_dim);
  PMOE_CHECK(is_payload_dtype(in_dtype), "AllToAllConfig: in_dtype must be f32, bf16, f16 or ",
             "f8e4m3, got ", dtype_name(in_dtype));
  PMOE_CHECK(is_output_dtype(out_dtype), "AllToAllConfig: out_dtype must be f32, bf16 or f16, got ",
             dtype_name(out_dtype));
  PMOE_CHECK(ranks_per_node >= 0 && (ranks_per_node == 0 || world_size % ranks_per_node == 0),
             "AllToAllConfig: ranks_per_node (", ranks_per_node, ") must be 0 (no split) or "
             "divide the world size (", world_size, ")");
  PMOE_CHECK(cross_node == CrossNode::direct || cross_node == CrossNode::hierarchical,
             "AllToAllConfig: cross_node must be direct or hierarchical, got ", int(cross_node));
  PMOE_CHECK(cross_node == CrossNode::direct || ranks_per_node > 0,
             "AllToAllConfig: cross_node = hierarchical needs ranks_per_node (the ranks of one "
             "node, consecutive), to find each node's relay; got ranks_per_node = 0");
  PMOE_CHECK(!combine_sums_in_node || cross_node == CrossNode::hierarchical,
             "AllToAllConfig: combine_sums_in_node is an option of cross_node = hierarchical (the "
             "relays that forwarded dispatch's tokens sum combine's rows); set cross_node = "
             "hierarchical and ranks_per_node, or leave combine_sums_in_node false");
  if (!placement.empty()) placement.validate(num_experts);
  PMOE_CHECK(masked_experts == MaskedExperts::drop || masked_experts == MaskedExperts::renormalize,
             "AllToAllConfig: masked_experts must be drop or renormalize, got ",
             int(masked_experts));
  PMOE_CHECK(on_peer_loss == OnPeerLoss::fail || on_peer_loss == OnPeerLoss::mask,
             "AllToAllConfig: on_peer_loss must be fail or mask, got ", int(on_peer_loss));
  PMOE_CHECK(std::isfinite(peer_timeout_s) && peer_timeout_s >= 0,
             "AllToAllConfig: peer_timeout_s must be >= 0 seconds (0: the communicator's "
             "timeout), got ", peer_timeout_s);
  PMOE_CHECK(!maskable() || (ranks_per_node == 0 && cross_node == CrossNode::direct),
             "AllToAllConfig: rank_mask (and on_peer_loss = mask) works on one node in direct "
             "mode; leave ranks_per_node 0 and cross_node direct, or rank_mask false and "
             "on_peer_loss fail");
  if (in_dtype == DType::f8e4m3) {
    PMOE_CHECK(scale_block >= 1, "AllToAllConfig: f8e4m3 input needs scale_block >= 1 (elements ",
               "per f32 scale; 128 is common), got ", scale_block);
    PMOE_CHECK(hidden_dim % scale_block == 0, "AllToAllConfig: hidden_dim (", hidden_dim,
               ") must be a multiple of scale_block (", scale_block, ")");
  } else {
    PMOE_CHECK(scale_block == 0, "AllToAllConfig: scale_block is for f8e4m3 input only; set it ",
               "to 0 for ", dtype_name(in_dtype), ", got ", scale_block);
  }
}

}  // namespace pmoe
