#include "moe_cases.hpp"

#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include <gtest/gtest.h>

#include "pmoe/error.hpp"
#include "pmoe/stream.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {

const char* variant_name(MoeVariant v) {
  switch (v) {
    case MoeVariant::simple:
      return "simple";
    case MoeVariant::tp:
      return "tp";
    case MoeVariant::ep:
      return "ep";
  }
  return "?";
}

std::vector<int32_t> zipf_expert_counts(int experts, int top_k, int tokens, double s,
                                        std::mt19937& rng) {
  std::vector<double> weight;
  for (int e = 0; e < experts; ++e) weight.push_back(1.0 / std::pow(e + 1.0, s));
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  std::vector<int32_t> counts(size_t(experts), 0);
  for (int t = 0; t < tokens; ++t) {
    std::set<int> chosen;
    while (int(chosen.size()) < top_k) chosen.insert(pick(rng));
    for (int e : chosen) ++counts[size_t(e)];
  }
  return counts;
}

MoeConfig make_moe_config(int feature, int ffn, int experts, int top_k, Activation act, DType dtype,
                          int output) {
  MoeConfig c;
  c.hidden_dim = feature;
  c.ffn_dim = ffn;
  c.output_dim = output;
  c.num_experts = experts;
  c.top_k = top_k;
  c.act = act;
  c.dtype = dtype;
  c.seed = 42;
  return c;
}

std::string describe(const MoeCase& c, int world_size) {
  const MoeConfig& m = c.config;
  return detail::cat(variant_name(c.variant), " W=", world_size, " H=", m.hidden_dim,
                     " F=", m.ffn_dim, " O=", m.out_dim(), " E=", m.num_experts, " k=", m.top_k,
                     " ", activation_name(m.act), " ", dtype_name(m.dtype), " batch=", c.batch,
                     " micro_batches=", c.micro_batches, " calls=", c.calls, " on ",
                     c.device.str());
}

namespace {

// Rows [begin, begin + rows) of x, as a view.
Tensor rows_of(const Buffer& x, int begin, int rows) {
  const Tensor t = x;
  const size_t row_bytes = size_t(t.size(1)) * dtype_size(t.dtype());
  return Tensor(static_cast<std::byte*>(t.data()) + size_t(begin) * row_bytes, t.dtype(),
                {rows, t.size(1)}, t.device());
}

std::vector<float> as_floats(const Tensor& y) {
  std::vector<float> out(size_t(y.numel()));
  for (int64_t i = 0; i < y.numel(); ++i)
    out[size_t(i)] = y.dtype() == DType::f32 ? y.data<float>()[i] : to_float(y.data<bf16>()[i]);
  return out;
}

}  // namespace

MoeCaseResult run_moe_case(Communicator& comm, const MoeCase& c) {
  const int W = comm.size(), rank = comm.rank(), O = c.config.out_dim();
  const RowRange most = shard_rows(c.batch, W, 0);  // rank 0 holds the most EP tokens
  std::unique_ptr<SimpleMoe> simple;
  std::unique_ptr<TpMoe> tp;
  std::unique_ptr<EpMoe> ep;
  switch (c.variant) {
    case MoeVariant::simple:
      simple = c.device.kind == Device::Kind::cpu
                   ? std::make_unique<SimpleMoe>(c.config, c.batch)
                   : std::make_unique<SimpleMoe>(c.config, c.batch, c.device, comm.stream());
      break;
    case MoeVariant::tp:
      tp = std::make_unique<TpMoe>(comm, c.config, c.batch);
      break;
    case MoeVariant::ep:
      ep = std::make_unique<EpMoe>(comm, c.config, std::max(1, most.size()),
                                   EpMoeOptions{c.micro_batches, c.placement});
      break;
  }

  // Device inputs and outputs are allocated once: an allocation may wait for the whole device,
  // where a peer's kernel can be waiting for this rank's next call.
  const bool on_device = c.device.kind != Device::Kind::cpu;
  const int rows = c.variant == MoeVariant::ep ? std::max(1, most.size()) : std::max(1, c.batch);
  Buffer x_device, y_device;
  if (on_device) {
    x_device = Buffer(c.config.dtype, {rows, c.config.hidden_dim}, c.device);
    y_device = Buffer(c.config.dtype, {rows, O}, c.device);
  }
  MoeCaseResult result;
  for (int call = 0; call < c.calls; ++call) {
    const int batch = std::max(0, c.batch - call % 3);
    const Buffer x = reference::make_moe_input(c.config, batch, c.input_seed + uint64_t(call));
    RowRange mine{0, batch};
    if (c.variant == MoeVariant::ep) mine = shard_rows(batch, W, rank);
    Buffer y(c.config.dtype, {mine.size(), O});
    std::memset(y.data<void>(), 0xA5, y.nbytes());  // a forward that skips a row shows up
    Tensor x_mine = rows_of(x, mine.begin, mine.size()), y_out = y;
    if (on_device) {
      const Tensor x_here = rows_of(x_device, 0, mine.size());
      y_out = rows_of(y_device, 0, mine.size());
      copy(x_here, x_mine);
      copy(y_out, y);
      x_mine = x_here;
    }
    if (simple) simple->forward(x_mine, y_out);
    if (tp) tp->forward(x_mine, y_out);
    if (ep) ep->forward(x_mine, y_out);
    if (on_device) {
      synchronize(comm.stream());
      copy(y, y_out);
    }

    std::vector<int> rows;
    for (int t = mine.begin; t < mine.end; ++t) rows.push_back(t);
    const auto expected = reference::reference_moe(c.config, x, rows);
    const auto cmp = reference::compare_moe(c.config, expected, y, mine.begin,
                                            reference::moe_tolerance(c.config.dtype));
    result.compared += cmp.compared;
    result.skipped += cmp.skipped;
    if (!cmp.error.empty() && result.error.empty())
      result.error = detail::cat(describe(c, W), " rank ", rank, " call ", call, ": ", cmp.error);
    result.y = as_floats(y);
    result.stats = simple ? simple->last_stats() : tp ? tp->last_stats() : ep->last_stats();

    if (tp && !result.y.empty()) {  // every rank must hold the same bits
      const auto all = comm.all_gather(std::as_bytes(std::span(result.y)));
      for (int r = 0; r < W && result.error.empty(); ++r)
        if (std::memcmp(all.data() + size_t(r) * result.y.size() * sizeof(float), result.y.data(),
                        result.y.size() * sizeof(float)) != 0)
          result.error = detail::cat(describe(c, W), " call ", call, ": rank ", r,
                                     "'s output differs from rank ", rank, "'s");
    }
  }
  return result;
}

std::string forward_ep_shard(EpMoe& ep, Communicator& comm, int batch, uint64_t seed,
                             const Buffer* device_x, const Buffer* device_y) {
  const MoeConfig& config = ep.config();
  const Buffer x = reference::make_moe_input(config, batch, seed);
  const RowRange mine = shard_rows(batch, comm.size(), comm.rank());
  const size_t row_bytes = size_t(config.hidden_dim) * dtype_size(config.dtype);
  const Tensor x_mine(x.data<std::byte>() + size_t(mine.begin) * row_bytes, config.dtype,
                      {mine.size(), config.hidden_dim});
  Buffer y(config.dtype, {mine.size(), config.out_dim()});
  if (device_x == nullptr) {
    ep.forward(x_mine, y);
  } else {
    const Tensor x_there(device_x->data<void>(), config.dtype, {mine.size(), config.hidden_dim},
                         comm.device()),
        y_there(device_y->data<void>(), config.dtype, {mine.size(), config.out_dim()},
                comm.device());
    copy(x_there, x_mine);
    ep.forward(x_there, y_there);
    synchronize(comm.stream());
    ep.check_errors();
    copy(y, y_there);
  }
  std::vector<int> rows;
  for (int t = mine.begin; t < mine.end; ++t) rows.push_back(t);
  return reference::compare_moe(config, reference::reference_moe(config, x, rows), y, mine.begin,
                                reference::moe_tolerance(config.dtype))
      .error;
}

void expect_ep_moe_loses_a_rank_and_takes_it_back(Device device, int micro_batches,
                                                  double peer_timeout_s) {
  const int W = 4, batch = 11;
  const MoeConfig config = make_moe_config(16, 24, 4, 2, Activation::gelu, DType::f32);
  EpMoeOptions options;
  options.micro_batches = micro_batches;
  options.placement = ExpertPlacement::round_robin(4, 8);
  options.on_peer_loss = OnPeerLoss::mask;
  options.peer_timeout_s = peer_timeout_s;
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(
      W,
      [&](Communicator& comm) {
        const int rank = comm.rank(), most = shard_rows(batch, W, 0).size();
        EpMoe ep(comm, config, most, options);
        std::optional<Buffer> device_x, device_y;
        if (device.kind == Device::Kind::cuda) {
          device_x.emplace(config.dtype, std::initializer_list<int64_t>{most, config.hidden_dim},
                           comm.device());
          device_y.emplace(config.dtype, std::initializer_list<int64_t>{most, config.out_dim()},
                           comm.device());
        }
        int lost = 0;
        for (int call = 0; call < 7; ++call) {
          if (call == 2 && rank == 3) {  // stops; comes back when the others unmask it
            ep.rejoin();
            call = 3;
            continue;
          }
          if (call == 4 && rank != 3) ep.unmask_rank(3);
          std::string error;
          try {
            error = forward_ep_shard(ep, comm, batch, 60 + uint64_t(call),
                                     device_x ? &*device_x : nullptr,
                                     device_y ? &*device_y : nullptr);
          } catch (const PeerLost& e) {
            ++lost;
            if (e.ranks() != std::vector<int>{3} || e.first_call() != 3 || e.last_call() != 3)
              errors[size_t(rank)] = std::string("an unexpected PeerLost: ") + e.what();
            continue;
          }
          if (!error.empty() && errors[size_t(rank)].empty())
            errors[size_t(rank)] = "call " + std::to_string(call) + ": " + error;
        }
        EXPECT_EQ(lost, rank == 3 ? 0 : 1) << "rank " << rank;
        EXPECT_EQ(ep.rank_mask().live, (std::vector<uint8_t>{1, 1, 1, 1}));
      },
      device);
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

}  // namespace pmoe::testing
