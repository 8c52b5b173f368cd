#include "all_to_all_bytes.hpp"

#include <span>

namespace pmoe::bench {
namespace {

double rank_mean(Communicator& comm, double mine) {
  const auto all = comm.all_gather(std::as_bytes(std::span(&mine, 1)));
  double sum = 0;
  for (int r = 0; r < comm.size(); ++r) sum += reinterpret_cast<const double*>(all.data())[r];
  return sum / comm.size();
}

}  // namespace

AllToAllBytes required_bytes(Communicator& comm, const AllToAllConfig& cfg,
                             const std::vector<reference::AllToAllInputs>& all,
                             const Tensor& counts) {
  const int rank = comm.rank(), k = cfg.top_k, H = cfg.hidden_dim;
  const int local_experts = cfg.num_experts / comm.size();
  // Tokens arriving here: those of any rank with at least one expert on this rank.
  int64_t arriving = 0, landed = 0, summed = 0;
  for (const auto& source : all) {
    for (int t = 0; t < source.m; ++t) {
      bool here = false;
      for (int j = 0; j < k; ++j) {
        const int32_t e = source.indices.data<int32_t>()[t * k + j];
        here = here || (e >= 0 && e / local_experts == rank);
      }
      arriving += here;
    }
  }
  for (int e = 0; e < local_experts; ++e) landed += counts.data<int32_t>()[e];
  const auto& mine = all[size_t(rank)];
  for (int i = 0; i < mine.m * k; ++i) summed += mine.indices.data<int32_t>()[i] >= 0;
  const double row = double(H) * dtype_size(cfg.in_dtype) + sizeof(float) * cfg.scales_per_token();
  return {rank_mean(comm, double(arriving + landed) * row),
          rank_mean(comm, double(summed) * H * 2 + double(mine.m) * H * 2)};
}

}  // namespace pmoe::bench
