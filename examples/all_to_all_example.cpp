// A dispatch/combine round trip on thread ranks, built and run by ctest so that it stays true.
#include <pmoe/pmoe.hpp>

#include <cstdio>
#include <cstring>
#include <string>

int main() {
  pmoe::run_ranks(4, [](pmoe::Communicator& comm) {  // 4 ranks as threads; or MpiCommunicator
    pmoe::AllToAllConfig cfg;
    cfg.max_tokens = 64;  cfg.num_experts = 32;  cfg.top_k = 4;
    cfg.hidden_dim = 1024;    cfg.in_dtype = pmoe::DType::bf16;
    cfg.out_dtype = pmoe::DType::bf16;
    pmoe::AllToAll a2a(comm, cfg);                     // collective; buffers sized once

    const int m = 50, k = 4, E_local = 32 / comm.size(), rows = comm.size() * 64;
    pmoe::Buffer x(pmoe::DType::bf16, {m, 1024});       // this rank's tokens
    pmoe::Buffer indices(pmoe::DType::i32, {m, k});     // top-k experts, -1 = skip the slot
    pmoe::Buffer weights(pmoe::DType::f32, {m, k});     // router weights
    pmoe::Buffer counts(pmoe::DType::i32, {E_local});
    pmoe::Buffer expert_x(pmoe::DType::bf16, {E_local, rows, 1024});
    pmoe::Buffer expert_y(pmoe::DType::bf16, {E_local, rows, 1024});
    pmoe::Buffer y(pmoe::DType::bf16, {m, 1024});
    for (int t = 0; t < m; ++t) {                      // token t: value t, experts t..t+3
      for (int h = 0; h < 1024; ++h) x.data<pmoe::bf16>()[t * 1024 + h] = pmoe::to_bf16(float(t));
      for (int j = 0; j < k; ++j) {
        indices.data<int32_t>()[t * k + j] = (t + j) % 32;
        weights.data<float>()[t * k + j] = 0.25f;
      }
    }

    a2a.dispatch(x, pmoe::Tensor(), indices, counts, expert_x, pmoe::Tensor());
    // The "experts" here are the identity: expert_y = expert_x, row for row.
    std::memcpy(expert_y.data<void>(), expert_x.data<void>(), expert_x.nbytes());
    a2a.combine(expert_y, indices, weights, y);        // y[t] = sum_j 0.25 * x[t] = x[t]

    for (int t = 0; t < m; ++t) {
      const float got = pmoe::to_float(y.data<pmoe::bf16>()[t * 1024 + 17]);
      if (got != float(t)) throw pmoe::Error("example: y[" + std::to_string(t) + "] is wrong");
    }
    if (comm.rank() == 0) std::printf("rank 0 received %d rows for its first expert\n",
                                      counts.data<int32_t>()[0]);
  });
  std::printf("dispatch + combine round trip: ok\n");
}
