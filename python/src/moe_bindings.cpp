// MoE layers: MoeConfig, SimpleMoe, TpMoe and EpMoe with forward(x), and the weights they build.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>

#include "bindings.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"
#include "tensor_interop.hpp"

namespace pmoe::python {

namespace nb = nanobind;

namespace {

MoeTensor parse_moe_tensor(const std::string& name) {
  if (name == "router") return MoeTensor::router;
  if (name == "w1") return MoeTensor::w1;
  if (name == "w1_linear") return MoeTensor::w1_linear;
  if (name == "w2") return MoeTensor::w2;
  throw Error("tensor must be 'router', 'w1', 'w1_linear' or 'w2', got '" + name + "'");
}

// forward(x, y=None): y is allocated when not given, and returned: of x's kind (a torch tensor
// for a torch tensor, through its new_zeros, so also its dtype and device; else NumPy).
template <typename Layer>
nb::object forward(Layer& layer, nb::handle x, nb::handle y) {
  const Tensor tx = to_tensor(x, "x");
  nb::object out;
  Tensor ty;
  if (y.is_none()) {
    PMOE_CHECK(tx.dim() == 2, "`x` must be 2-D [m, hidden_dim], got ", tx.shape_str());
    const MoeConfig& c = layer.config();
    const auto shape = nb::make_tuple(tx.size(0), c.out_dim());
    if (nb::hasattr(x, "new_zeros"))
      out = x.attr("new_zeros")(shape);
    else
      out = nb::module_::import_("numpy").attr("zeros")(
          shape, tx.dtype() == DType::bf16 ? "uint16" : "float32");
    ty = to_tensor(nb::cast<nb::ndarray<>>(out), "y");
  } else {
    out = nb::borrow(y);
    ty = to_tensor(y, "y");
  }
  {
    nb::gil_scoped_release release;
    layer.forward(tx, ty);
  }
  return out;
}

const char* kForwardDoc = R"(Runs the layer: y = sum_j weight_j * FFN_{expert_j}(x).

x  [m, hidden_dim] float32 (dtype f32) or uint16 bf16 bits (dtype bf16)
y  optional output [m, out_dim], same dtype; when omitted, allocated like x (a torch tensor for
   a torch x, else NumPy) and returned)";

}  // namespace

void bind_moe(nb::module_& m) {
  nb::class_<MoeConfig>(m, "MoeConfig", "The shape and weights of an MoE layer (see DESIGN.md).")
      .def(
          "__init__",
          [](MoeConfig* self, std::optional<int> hidden_dim, int ffn_dim, int num_experts,
             int top_k, int output_dim, const std::string& act, const std::string& dtype,
             uint64_t seed, std::optional<int> feature_dim) {
            new (self) MoeConfig();
            self->hidden_dim =
                renamed_arg("MoeConfig", "hidden_dim", hidden_dim, "feature_dim", feature_dim);
            self->ffn_dim = ffn_dim;
            self->num_experts = num_experts;
            self->top_k = top_k;
            self->output_dim = output_dim;
            self->act = parse_activation(act);
            self->dtype = parse_dtype(dtype);
            self->seed = seed;
            self->validate();
          },
          nb::kw_only(), nb::arg("hidden_dim") = nb::none(), nb::arg("ffn_dim"),
          nb::arg("num_experts"), nb::arg("top_k"), nb::arg("output_dim") = 0,
          nb::arg("act") = "relu", nb::arg("dtype") = "f32", nb::arg("seed") = 0,
          nb::arg("feature_dim") = nb::none(),
          "act: relu, gelu or swiglu; dtype: f32 or bf16; output_dim 0 means hidden_dim. "
          "feature_dim, hidden_dim's name before pmoe.MoeShape, still works for one release "
          "and warns.")
      .def_ro("hidden_dim", &MoeConfig::hidden_dim)
      .def_prop_ro(
          "feature_dim",
          [](const MoeConfig& c) {
            warn_renamed("MoeConfig", "feature_dim", "hidden_dim");
            return c.hidden_dim;
          },
          "Deprecated: hidden_dim's name before pmoe.MoeShape.")
      .def("shape", &MoeConfig::shape, nb::arg("max_tokens"),
           "The MoeShape of a layer of this config taking up to max_tokens tokens a rank.")
      .def_ro("ffn_dim", &MoeConfig::ffn_dim)
      .def_ro("num_experts", &MoeConfig::num_experts)
      .def_ro("top_k", &MoeConfig::top_k)
      .def_prop_ro("out_dim", &MoeConfig::out_dim)
      .def_prop_ro("act", [](const MoeConfig& c) { return std::string(activation_name(c.act)); })
      .def_prop_ro("dtype", [](const MoeConfig& c) { return std::string(dtype_name(c.dtype)); })
      .def_ro("seed", &MoeConfig::seed);

  m.def(
      "moe_weights",
      [](const MoeConfig& config, const std::string& tensor, int expert) {
        const MoeTensor t = parse_moe_tensor(tensor);
        const int64_t rows = t == MoeTensor::w2 ? config.ffn_dim : config.hidden_dim;
        const int64_t cols = t == MoeTensor::router ? config.num_experts
                             : t == MoeTensor::w2   ? config.out_dim()
                                                    : config.ffn_dim;
        nb::object out = nb::module_::import_("numpy").attr("zeros")(nb::make_tuple(rows, cols),
                                                                     "float32");
        float* values = static_cast<float*>(nb::cast<nb::ndarray<>>(out).data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) values[r * cols + c] = moe_weight(config, t, expert, r, c);
        return out;
      },
      nb::arg("config"), nb::arg("tensor"), nb::arg("expert") = 0,
      "The weights every layer builds from config.seed, as float32 [rows, cols]: 'router' Wg "
      "[hidden_dim, E], 'w1' and 'w1_linear' [hidden_dim, ffn_dim], 'w2' [ffn_dim, out_dim].");

  nb::class_<SimpleMoe>(m, "SimpleMoe", "The whole layer on one rank.")
      .def(nb::init<const MoeConfig&, int>(), nb::arg("config"), nb::arg("max_tokens"))
      .def("forward", &forward<SimpleMoe>, nb::arg("x"), nb::arg("y") = nb::none(), kForwardDoc)
      .def("weight_bytes", &SimpleMoe::weight_bytes);

  nb::class_<TpMoe>(m, "TpMoe", R"(Every expert split over the ranks (W1 by columns, W2 by rows);
tokens replicated (every rank passes the same x); one all-reduce per forward. Collective.)")
      .def(
          "__init__",
          [](TpMoe* self, Communicator& comm, const MoeConfig& config, int max_tokens) {
            nb::gil_scoped_release release;
            new (self) TpMoe(comm, config, max_tokens);
          },
          nb::arg("comm"), nb::arg("config"), nb::arg("max_tokens"), nb::keep_alive<1, 2>())
      .def("forward", &forward<TpMoe>, nb::arg("x"), nb::arg("y") = nb::none(), kForwardDoc)
      .def("weight_bytes", &TpMoe::weight_bytes);

  nb::class_<EpMoe>(m, "EpMoe", R"(Whole experts spread over the ranks; each rank passes its own
tokens; AllToAll dispatch, grouped expert GEMMs, combine. micro_batches=2 splits the tokens in
two halves so one half's exchange overlaps the other's experts. Collective.)")
      .def(
          "__init__",
          [](EpMoe* self, Communicator& comm, const MoeConfig& config,
             std::optional<int> max_tokens, int micro_batches,
             const std::optional<std::vector<int32_t>>& placement, bool rank_mask,
             const std::string& masked_experts, const std::string& on_peer_loss,
             double peer_timeout_s, std::optional<int> max_tokens_per_rank) {
            const int bound = renamed_arg("EpMoe", "max_tokens", max_tokens,
                                          "max_tokens_per_rank", max_tokens_per_rank);
            EpMoeOptions options;
            options.micro_batches = micro_batches;
            if (placement) {
              options.placement.slot_expert = *placement;
              options.placement.num_logical_experts = config.num_experts;
            }
            options.rank_mask = rank_mask;
            options.masked_experts = parse_masked_experts("EpMoe", masked_experts);
            options.on_peer_loss = parse_on_peer_loss("EpMoe", on_peer_loss);
            options.peer_timeout_s = peer_timeout_s;
            nb::gil_scoped_release release;
            new (self) EpMoe(comm, config, bound, options);
          },
          nb::arg("comm"), nb::arg("config"), nb::arg("max_tokens") = nb::none(),
          nb::arg("micro_batches") = 1, nb::kw_only(), nb::arg("placement") = nb::none(),
          nb::arg("rank_mask") = false, nb::arg("masked_experts") = "drop",
          nb::arg("on_peer_loss") = "fail", nb::arg("peer_timeout_s") = 0.0,
          nb::arg("max_tokens_per_rank") = nb::none(), nb::keep_alive<1, 2>(),
          "max_tokens: this rank's tokens per forward, at most (max_tokens_per_rank, its name "
          "before pmoe.MoeShape, still works for one release and warns). "
          "placement: for each expert slot (a multiple of the ranks), the expert of config it "
          "serves; replicas spread the load and keep tokens when a masked rank held one. "
          "rank_mask: the layer can mask ranks (mask_rank); masked_experts: 'drop' or "
          "'renormalize', what an expert with no live slot becomes. on_peer_loss: 'fail' or "
          "'mask' (the forward in which the survivors find a rank lost "
          "raises pmoe.PeerLost, and the next runs without it); peer_timeout_s as AllToAll's "
          "(docs/robustness.md).")
      .def("forward", &forward<EpMoe>, nb::arg("x"), nb::arg("y") = nb::none(), kForwardDoc)
      .def("mask_rank", &EpMoe::mask_rank, nb::arg("rank"), nb::arg("reason") = "",
           "rank_mask only: every live rank calls it between two forwards with the same rank, "
           "which forwards no more.")
      .def(
          "unmask_rank",
          [](EpMoe& self, int rank) {
            nb::gil_scoped_release release;
            self.unmask_rank(rank);
          },
          nb::arg("rank"), "on_peer_loss='mask' only: as AllToAll.unmask_rank.")
      .def(
          "rejoin",
          [](EpMoe& self) {
            nb::gil_scoped_release release;
            self.rejoin();
          },
          "on_peer_loss='mask' only: as AllToAll.rejoin.")
      .def_prop_ro(
          "live_ranks",
          [](const EpMoe& self) { return live_flags(self.rank_mask()); },
          "For each rank, True unless it was masked.")
      .def(
          "check_errors",
          [](EpMoe& self) {
            nb::gil_scoped_release release;  // a lost peer: drains the stream, then agrees
            self.check_errors();
          },
          "On a GPU, after synchronizing the stream: raises what the forward's kernels "
          "recorded, pmoe.PeerLost included. A no-op on the CPU.")
      .def("lost_experts", &EpMoe::lost_experts, "The experts no live rank serves now.")
      .def("weight_bytes", &EpMoe::weight_bytes);
}

}  // namespace pmoe::python
