// MoeConfig's checks, the activation names and the token split shared by every MoE layer.
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe {

std::string_view activation_name(Activation act) {
  switch (act) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::swiglu:
      return "swiglu";
  }
  return "?";
}

Activation parse_activation(std::string_view name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  if (name == "swiglu") return Activation::swiglu;
  throw Error(detail::cat("unknown activation '", name, "': expected relu, gelu or swiglu"));
}

// The deprecated alias is read here and nowhere else in the library.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
MoeConfig MoeConfig::with_current_names() const {
  MoeConfig c = *this;
  c.hidden_dim = current_hidden_dim();
  c.feature_dim = 0;
  return c;
}

void MoeConfig::validate() const {
  if (feature_dim != 0) {
    PMOE_CHECK(hidden_dim == 0 || hidden_dim == feature_dim, "MoeConfig: hidden_dim = ",
               hidden_dim, " and its deprecated alias feature_dim = ", feature_dim,
               " disagree; set hidden_dim only");
    with_current_names().validate();
    return;
  }
#pragma GCC diagnostic pop
  PMOE_CHECK(hidden_dim >= 1, "MoeConfig: hidden_dim must be >= 1 (the token width), got ",
             hidden_dim);
  PMOE_CHECK(ffn_dim >= 1, "MoeConfig: ffn_dim must be >= 1 (the expert hidden width), got ",
             ffn_dim);
  PMOE_CHECK(output_dim >= 0, "MoeConfig: output_dim must be >= 0 (0 means hidden_dim), got ",
             output_dim);
  PMOE_CHECK(num_experts >= 1, "MoeConfig: num_experts must be >= 1, got ", num_experts);
  PMOE_CHECK(top_k >= 1 && top_k <= num_experts, "MoeConfig: top_k = ", top_k,
             " must be in 1..num_experts = ", num_experts,
             (top_k > num_experts ? "; lower top_k or add experts" : ""));
  PMOE_CHECK(act == Activation::relu || act == Activation::gelu || act == Activation::swiglu,
             "MoeConfig: act must be relu, gelu or swiglu, got value ", int(act));
  PMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16,
             "MoeConfig: dtype must be f32 or bf16, got ", dtype_name(dtype));
  PMOE_CHECK(!tf32 || dtype == DType::f32, "MoeConfig: tf32 applies to f32 layers; a ",
             dtype_name(dtype), " layer's experts already run ", dtype_name(dtype),
             " tensor-core GEMMs");
  // Every GEMM dimension goes to BLAS as an int.
  const int64_t widest = int64_t(w1_halves()) * ffn_dim;
  PMOE_CHECK(widest <= (int64_t(1) << 30), "MoeConfig: ffn_dim = ", ffn_dim, " is too large");
}

RowRange shard_rows(int rows, int world_size, int rank) {
  PMOE_CHECK(rows >= 0 && world_size >= 1 && rank >= 0 && rank < world_size,
             "shard_rows: need rows >= 0 and 0 <= rank < world_size, got rows = ", rows,
             ", rank = ", rank, ", world_size = ", world_size);
  const int base = rows / world_size, extra = rows % world_size;
  RowRange range;
  range.begin = rank * base + (rank < extra ? rank : extra);
  range.end = range.begin + base + (rank < extra ? 1 : 0);
  return range;
}

}  // namespace pmoe
