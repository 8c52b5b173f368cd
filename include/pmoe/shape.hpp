// MoeShape: the dimensions of an MoE layer's exchange, each with one name from Python to the
// kernels. AllToAllConfig is a MoeShape (it derives from it), the kernels' parameter blocks hold
// one, and an MoE layer hands its shape to its exchange whole (MoeConfig::shape), so no layer
// renames a dimension on the way down.
#pragma once

namespace pmoe {

struct MoeShape {
  int max_tokens = 0;   // tokens per rank per call, upper bound (>= 1)
  int num_experts = 0;  // experts of the layer, all ranks together (E)
  int top_k = 0;        // experts per token, 1..num_experts (k)
  int hidden_dim = 0;   // elements per token row (H)

  friend bool operator==(const MoeShape&, const MoeShape&) = default;
};

}  // namespace pmoe
