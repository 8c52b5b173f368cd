// docs/design.md's MoE example, built and run by ctest so that it stays true: the same layer as
// SimpleMoe on one rank, as TpMoe and as EpMoe on 4 thread ranks, giving the same outputs.
#include <pmoe/pmoe.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  pmoe::MoeConfig cfg;
  cfg.hidden_dim = 256;  cfg.ffn_dim = 512;  cfg.num_experts = 8;  cfg.top_k = 2;
  cfg.act = pmoe::Activation::swiglu;  cfg.dtype = pmoe::DType::f32;  cfg.seed = 1;
  const int batch = 30;                             // tokens of the whole batch

  pmoe::Buffer x(cfg.dtype, {batch, 256}), y_simple(cfg.dtype, {batch, 256});
  for (int i = 0; i < batch * 256; ++i) x.data<float>()[i] = std::sin(0.01f * float(i));
  pmoe::SimpleMoe simple(cfg, batch);               // the whole model here
  simple.forward(x, y_simple);

  std::vector<float> worst(4, 0.0f);
  pmoe::run_ranks(4, [&](pmoe::Communicator& comm) {
    // EP: rank r owns experts 2r, 2r+1 and runs its share of the tokens.
    const pmoe::RowRange mine = pmoe::shard_rows(batch, comm.size(), comm.rank());
    pmoe::EpMoe ep(comm, cfg, /*max_tokens=*/8);
    pmoe::Tensor x_mine(x.data<float>() + mine.begin * 256, cfg.dtype, {mine.size(), 256});
    pmoe::Buffer y_ep(cfg.dtype, {mine.size(), 256});
    ep.forward(x_mine, y_ep);
    // TP: every rank holds 512 / 4 hidden columns of every expert and runs every token.
    pmoe::TpMoe tp(comm, cfg, batch);
    pmoe::Buffer y_tp(cfg.dtype, {batch, 256});
    tp.forward(x, y_tp);

    float& w = worst[size_t(comm.rank())];
    for (int t = 0; t < mine.size(); ++t)
      for (int o = 0; o < 256; ++o)
        w = std::max(w, std::abs(y_ep.data<float>()[t * 256 + o] -
                                 y_simple.data<float>()[(mine.begin + t) * 256 + o]));
    for (int i = 0; i < batch * 256; ++i)
      w = std::max(w, std::abs(y_tp.data<float>()[i] - y_simple.data<float>()[i]));
  });
  for (int r = 0; r < 4; ++r) {
    if (worst[size_t(r)] > 1e-5f) {
      std::printf("rank %d: EP or TP differs from SimpleMoe by %g\n", r, double(worst[size_t(r)]));
      return 1;
    }
  }
  std::printf("SimpleMoe, TpMoe and EpMoe agree (largest difference %g)\n",
              double(std::max(std::max(worst[0], worst[1]), std::max(worst[2], worst[3]))));
  return 0;
}
