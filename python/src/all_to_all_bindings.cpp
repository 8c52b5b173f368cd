// AllToAll: dispatch and combine on any DLPack arrays.
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>

#include "bindings.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "tensor_interop.hpp"

namespace pmoe::python {

namespace nb = nanobind;

namespace {

Phase parse_phase(const std::string& phase) {
  if (phase == "both") return Phase::both;
  if (phase == "send") return Phase::send;
  if (phase == "recv") return Phase::recv;
  throw Error("phase must be 'both', 'send' or 'recv', got '" + phase + "'");
}

// AllToAllConfig::cross_node by its name; pmoe::Error naming both choices otherwise.
CrossNode parse_cross_node(const std::string& name) {
  if (name == "direct") return CrossNode::direct;
  if (name == "hierarchical") return CrossNode::hierarchical;
  throw Error("AllToAll: cross_node must be 'direct' or 'hierarchical', got '" + name + "'");
}

// AllToAllConfig::masked_experts by its name.
}  // namespace

void bind_all_to_all(nb::module_& m) {
  nb::class_<MoeShape>(m, "MoeShape", R"(The dimensions of an MoE layer's exchange, one name each:
max_tokens (tokens per rank per call, at most), num_experts, top_k (experts per token) and
hidden_dim (elements per token row). AllToAll.shape and MoeConfig.shape(max_tokens) give one.)")
      .def(nb::init<>())
      .def(
          "__init__",
          [](MoeShape* self, int max_tokens, int num_experts, int top_k, int hidden_dim) {
            new (self) MoeShape{max_tokens, num_experts, top_k, hidden_dim};
          },
          nb::kw_only(), nb::arg("max_tokens"), nb::arg("num_experts"), nb::arg("top_k"),
          nb::arg("hidden_dim"))
      .def_rw("max_tokens", &MoeShape::max_tokens)
      .def_rw("num_experts", &MoeShape::num_experts)
      .def_rw("top_k", &MoeShape::top_k)
      .def_rw("hidden_dim", &MoeShape::hidden_dim)
      .def(nb::self == nb::self)
      .def("__repr__", [](const MoeShape& s) {
        return detail::cat("MoeShape(max_tokens=", s.max_tokens, ", num_experts=", s.num_experts,
                           ", top_k=", s.top_k, ", hidden_dim=", s.hidden_dim, ")");
      });

  nb::class_<AllToAll>(m, "AllToAll", R"(Expert-parallel dispatch and combine.

W ranks, E experts, E_local = E / W; rank r owns experts [r * E_local, (r + 1) * E_local).
Received rows of each expert are ordered by (source rank, source token): results are
bit-identical run after run. Every call validates its arguments before sending anything.)")
      .def(
          "__init__",
          [](AllToAll* self, Communicator& comm, std::optional<int> max_tokens, int num_experts,
             std::optional<int> top_k, int hidden_dim, const std::string& in_dtype, int scale_block,
             const std::string& out_dtype, bool in_place_buffers, int ranks_per_node,
             const std::string& cross_node, bool combine_sums_in_node, bool packed_expert_rows,
             const std::optional<std::vector<int32_t>>& placement, int num_logical_experts,
             bool rank_mask, const std::string& masked_experts, const std::string& on_peer_loss,
             double peer_timeout_s, bool replacing, std::optional<int> max_num_tokens,
             std::optional<int> experts_per_token) {
            AllToAllConfig c;
            c.shape() = {renamed_arg("AllToAll", "max_tokens", max_tokens, "max_num_tokens",
                                     max_num_tokens),
                         num_experts,
                         renamed_arg("AllToAll", "top_k", top_k, "experts_per_token",
                                     experts_per_token),
                         hidden_dim};
            c.in_dtype = parse_dtype(in_dtype);
            c.scale_block = scale_block;
            c.out_dtype = parse_dtype(out_dtype);
            c.in_place_buffers = in_place_buffers;
            c.ranks_per_node = ranks_per_node;
            c.cross_node = parse_cross_node(cross_node);
            c.combine_sums_in_node = combine_sums_in_node;
            c.packed_expert_rows = packed_expert_rows;
            if (placement) {
              c.placement.slot_expert = *placement;
              c.placement.num_logical_experts =
                  num_logical_experts > 0 || placement->empty()
                      ? num_logical_experts
                      : 1 + *std::max_element(placement->begin(), placement->end());
            }
            c.rank_mask = rank_mask;
            c.masked_experts = parse_masked_experts("AllToAll", masked_experts);
            c.on_peer_loss = parse_on_peer_loss("AllToAll", on_peer_loss);
            c.peer_timeout_s = peer_timeout_s;
            nb::gil_scoped_release release;  // collective: peers are constructing too
            if (replacing)
              new (self) AllToAll(comm, c, AllToAll::Replacing{});
            else
              new (self) AllToAll(comm, c);
          },
          nb::arg("comm"), nb::kw_only(), nb::arg("max_tokens") = nb::none(),
          nb::arg("num_experts"), nb::arg("top_k") = nb::none(), nb::arg("hidden_dim"),
          nb::arg("in_dtype") = "bf16",
          nb::arg("scale_block") = 0, nb::arg("out_dtype") = "bf16",
          nb::arg("in_place_buffers") = false, nb::arg("ranks_per_node") = 0,
          nb::arg("cross_node") = "direct", nb::arg("combine_sums_in_node") = false,
          nb::arg("packed_expert_rows") = false, nb::arg("placement") = nb::none(),
          nb::arg("num_logical_experts") = 0, nb::arg("rank_mask") = false,
          nb::arg("masked_experts") = "drop", nb::arg("on_peer_loss") = "fail",
          nb::arg("peer_timeout_s") = 0.0, nb::arg("replacing") = false,
          nb::arg("max_num_tokens") = nb::none(), nb::arg("experts_per_token") = nb::none(),
          nb::keep_alive<1, 2>(),
          "Collective over comm. max_tokens: tokens per rank per call, at most; top_k: experts "
          "per token (max_num_tokens and experts_per_token, their names before pmoe.MoeShape, "
          "still work for one release and warn). in_dtype: f32, bf16, f16 or f8e4m3 (then "
          "scale_block > 0 "
          "elements per f32 scale); out_dtype: f32, bf16 or f16. ranks_per_node > 0: ranks "
          "[n R, (n + 1) R) form node n (0: the communicator's own nodes); cross_node: "
          "'direct' or 'hierarchical' (CUDA only: one relay block per remote node, "
          "docs/gpu-all-to-all.md); combine_sums_in_node (hierarchical only): each node's relay "
          "sums its experts' rows of a token before they cross the network, fewer bytes but a "
          "sum order that depends on the node split. packed_expert_rows (CPU only): expert_x and "
          "expert_y hold the experts' rows back to back from flat row 0 (expert e's after the "
          "counts of experts before it), not each in its own block. placement: for each of the "
          "num_experts slots, the logical expert it serves (several slots may serve one: "
          "replicas); indices then name logical experts in [0, num_logical_experts) (default: "
          "the largest in placement, plus one), each sent to a live slot. rank_mask: the op can "
          "mask ranks (mask_rank); masked_experts: 'drop' or 'renormalize', what an expert with "
          "no live slot becomes. on_peer_loss: 'fail' (a lost peer fails the op on every rank) "
          "or 'mask' (every rank on one node, CPU or CUDA: the survivors mask it and go on; "
          "the call in which they find it raises pmoe.PeerLost); peer_timeout_s: with 'mask', "
          "how long a wait for a peer lasts before the peer is lost (0: PMOE_TIMEOUT_S) "
          "(docs/robustness.md). replacing: this process takes a lost rank's place (comm from "
          "SocketCommunicator.replacing) while every survivor calls admit(rank): the op takes "
          "over the lost rank's memory and joins as rejoin() does.")
      .def(
          "dispatch",
          [](AllToAll& self, nb::handle x, nb::handle indices, nb::handle expert_num_tokens,
             nb::handle expert_x, nb::handle x_scale,
             nb::handle expert_x_scale, const std::string& phase) {
            const Tensor tx = to_tensor(x, "x"), ti = to_tensor(indices, "indices"),
                         tn = to_tensor(expert_num_tokens, "expert_num_tokens"),
                         te = to_tensor(expert_x, "expert_x"),
                         ts = to_tensor_or_empty(x_scale, "x_scale"),
                         tes = to_tensor_or_empty(expert_x_scale, "expert_x_scale");
            const Phase p = parse_phase(phase);
            nb::gil_scoped_release release;
            self.dispatch(tx, ts, ti, tn, te, tes, p);
          },
          nb::arg("x"), nb::arg("indices"), nb::arg("expert_num_tokens"), nb::arg("expert_x"),
          nb::arg("x_scale") = nb::none(), nb::arg("expert_x_scale") = nb::none(),
          nb::arg("phase") = "both",
          R"(Sends every token to the ranks owning its experts.

x                 [m, H] in_dtype, m <= max_tokens
indices           [m, k] int32 or int64 (torch.topk's indices as they are), experts in
                  [0, E) or -1 (slot skipped), distinct per row
expert_num_tokens [E_local] int32, out: rows received per local expert
expert_x          [E_local, W * max_tokens, H] in_dtype, out; with
                  packed_expert_rows also [R, H], R >= the rows that arrive (arriving_rows())
x_scale           [m, H / scale_block] float32, f8e4m3 only
expert_x_scale    [E_local, W * max_tokens, H / scale_block] float32, f8e4m3 only
phase             'both', or 'send' then 'recv' with other work in between)")
      .def(
          "combine",
          [](AllToAll& self, nb::handle expert_y, nb::handle indices, nb::handle weights,
             nb::handle y, const std::string& phase) {
            const Tensor te = to_tensor(expert_y, "expert_y"), ti = to_tensor(indices, "indices"),
                         tw = to_tensor(weights, "weights"), ty = to_tensor(y, "y");
            const Phase p = parse_phase(phase);
            nb::gil_scoped_release release;
            self.combine(te, ti, tw, ty, p);
          },
          nb::arg("expert_y"), nb::arg("indices"), nb::arg("weights"), nb::arg("y"),
          nb::arg("phase") = "both",
          R"(Brings expert outputs back and sums them with the router weights.

expert_y [E_local, W * max_tokens, H] float32, bfloat16 or float16, rows in dispatch order
         (packed_expert_rows: also [R, H], R >= the rows dispatch received)
indices  [m, k] int32 or int64, the same as given to dispatch
weights  [m, k] float32
y        [m, H] out_dtype, out: y[t] = sum_j weights[t, j] * expert_y[row of (t, j)], in f32,
         in j order, skipping -1 slots)")
      .def(
          "arriving_rows",
          [](AllToAll& self) {
            nb::gil_scoped_release release;  // waits for the peers' sends
            return self.arriving_rows();
          },
          "packed_expert_rows only, between dispatch(phase='send') and dispatch(phase='recv'): "
          "waits until every peer has sent and returns the rows dispatch(recv) will write, so "
          "that expert_x can be a packed [rows, H] of exactly that size.")
      .def(
          "mask_rank", &AllToAll::mask_rank, nb::arg("rank"), nb::arg("reason") = "",
          "rank_mask only. Every live rank calls it between two calls with the same rank; from "
          "the next call on nobody sends to it or waits for it, and it calls the op no more. A "
          "rank cannot mask itself.")
      .def(
          "unmask_rank",
          [](AllToAll& self, int rank) {
            nb::gil_scoped_release release;  // waits for the rank to rejoin
            self.unmask_rank(rank);
          },
          nb::arg("rank"),
          "on_peer_loss='mask' only. Every live rank calls it between the same two calls with "
          "the same rank, while that rank calls rejoin(); it waits for the rank, and from the "
          "next call on the rank's slots serve again.")
      .def(
          "admit",
          [](AllToAll& self, int rank) {
            nb::gil_scoped_release release;  // collective with the survivors and the newcomer
            self.admit(rank);
          },
          nb::arg("rank"),
          "on_peer_loss='mask', on every survivor, after SocketCommunicator.admit(rank), while a "
          "new process builds the op with replacing=True: checks its config, hands it the op's "
          "memory, then does what unmask_rank does.")
      .def(
          "rejoin",
          [](AllToAll& self) {
            nb::gil_scoped_release release;  // waits for every live rank to unmask this one
            self.rejoin();
          },
          "on_peer_loss='mask', on a rank the others masked: waits until every live rank has "
          "unmasked it, takes their mask and call count, and makes the op usable again.")
      .def_prop_ro(
          "live_ranks",
          [](const AllToAll& self) { return live_flags(self.rank_mask()); },
          "For each rank, True unless it was masked.")
      .def_prop_ro(
          "mask_reasons", [](const AllToAll& self) { return self.rank_mask().reasons; },
          "For each rank, the reason it was masked ('' for a live rank).")
      .def_prop_ro("calls_started", &AllToAll::calls_started,
                   "The number of the last call begun (from 1, the same on every rank); after a "
                   "pmoe.PeerLost, the number the survivors agreed on.")
      .def(
          "check_errors",
          [](AllToAll& self) {
            nb::gil_scoped_release release;  // a lost peer: drains the stream, then agrees
            self.check_errors();
          },
          "On a GPU, after synchronizing the stream: raises the first error the kernels "
          "recorded (a bad index, a peer that never arrived), pmoe.PeerLost included with "
          "on_peer_loss='mask'. A no-op on the CPU, whose calls raise everything themselves.")
      .def("lost_experts", &AllToAll::lost_experts,
           "The logical experts (slots, without a placement) no live rank serves now.")
      .def("workspace_bytes", &AllToAll::workspace_bytes,
           "Bytes this op allocated per rank.")
      .def(
          "input_buffer",
          [](nb::handle self) {
            return to_numpy(nb::cast<AllToAll&>(self).input_buffer(), self);
          },
          "The op's in-place token buffer [max_tokens, H] (in_place_buffers=True).")
      .def(
          "input_scale_buffer",
          [](nb::handle self) {
            return to_numpy(nb::cast<AllToAll&>(self).input_scale_buffer(), self);
          },
          "The op's in-place scale buffer [max_tokens, H / scale_block] (f8e4m3).")
      .def(
          "expert_output_buffer",
          [](nb::handle self) {
            return to_numpy(nb::cast<AllToAll&>(self).expert_output_buffer(), self);
          },
          "The op's in-place expert output buffer [E_local, W * max_tokens, H] out_dtype.")
      .def_prop_ro(
          "shape", [](const AllToAll& self) { return self.config().shape(); },
          "The op's MoeShape (max_tokens, num_experts, top_k, hidden_dim).")
      .def_prop_ro("num_local_experts", &AllToAll::num_local_experts)
      .def_prop_ro("world_size", &AllToAll::world_size);
}

}  // namespace pmoe::python
