#include "all_to_all_cuda.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <span>
#include <string>

#include <unistd.h>

#include "all_to_all_bytes.hpp"
#include "core/device_runtime.hpp"
#include "pmoe/diagnostics/kernel_counts.hpp"
#include "nccl_all_to_all_v.hpp"
#include "pmoe/error.hpp"
#include "pmoe/graph.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::bench {
namespace {

// Every rank's time per iteration, then the slowest rank's per iteration.
std::vector<double> slowest(Communicator& comm, const std::vector<double>& mine) {
  const auto all = comm.all_gather(std::as_bytes(std::span(mine)));
  const auto* t = reinterpret_cast<const double*>(all.data());
  std::vector<double> out(mine.size(), 0.0);
  for (int r = 0; r < comm.size(); ++r)
    for (size_t i = 0; i < mine.size(); ++i) out[i] = std::max(out[i], t[size_t(r) * mine.size() + i]);
  return out;
}

// Times each step with events on the rank's stream, a barrier before each step.
std::vector<std::vector<double>> time_on_stream(Communicator& comm, int warmup, int iters,
                                                const std::vector<std::function<void()>>& steps) {
  const detail::DeviceRuntime& runtime = detail::device_runtime();
  const Stream stream = comm.stream();
  void* start = runtime.create_event();
  void* stop = runtime.create_event();
  std::vector<std::vector<double>> mine(steps.size(), std::vector<double>(size_t(iters)));
  for (int i = -warmup; i < iters; ++i) {
    for (size_t s = 0; s < steps.size(); ++s) {
      synchronize(stream);
      comm.barrier();
      runtime.record_event(start, stream);
      steps[s]();
      runtime.record_event(stop, stream);
      const double ms = runtime.elapsed_ms(start, stop);
      if (i >= 0) mine[s][size_t(i)] = 1e3 * ms;
    }
  }
  runtime.destroy_event(start);
  runtime.destroy_event(stop);
  std::vector<std::vector<double>> out;
  for (const auto& m : mine) out.push_back(slowest(comm, m));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The copy the op's traffic is bounded by: every rank writes kRooflineBytes into the symmetric
// memory of rank (r + 1) % W at once, from its own device memory, on its stream, as dispatch and
// combine write into peers. Ranks on different GPUs measure the peer (NVLink or PCIe) copy rate,
// ranks sharing a GPU (threads, or W = 1) a local device-to-device copy; the kind says which.
// (read + written bytes) / median time per rank, like the op's GB/s.
constexpr size_t kRooflineBytes = size_t(256) << 20;

void measure_roofline(Communicator& comm, int warmup, int iters, CudaAllToAllResult& result) {
  const int W = comm.size(), next = (comm.rank() + 1) % W;
  const int device = comm.device().index;
  const auto all = comm.all_gather(std::as_bytes(std::span(&device, 1)));
  std::vector<int> device_of(static_cast<size_t>(W));
  std::memcpy(device_of.data(), all.data(), all.size());
  result.copy_kind = roofline_kind(device_of);
  auto memory = comm.alloc_symmetric(kRooflineBytes, 1);
  char reachable = memory->peer(next) != nullptr;
  const auto votes = comm.all_gather(std::as_bytes(std::span(&reachable, 1)));
  if (std::any_of(votes.begin(), votes.end(), [](std::byte v) { return v == std::byte{0}; })) {
    result.copy_kind = "none: a peer is on another node";
    return;
  }
  Buffer from(DType::f32, {int64_t(kRooflineBytes / 4)}, comm.device());
  const auto t = time_on_stream(comm, warmup, std::max(iters, 20), {[&] {
    detail::device_runtime().copy_async(memory->peer(next), from.data<void>(), kRooflineBytes,
                                        comm.stream());
  }});
  result.copy_gbps = 2.0 * double(kRooflineBytes) / (median(t[0]) * 1e3);
}

// Every rank's measured network traffic of the round counted on its own, beside count_traffic
// of the same routing (expert_y is bf16 here).
void collect_links(Communicator& comm, const AllToAllConfig& cfg,
                   const std::vector<reference::AllToAllInputs>& all, detail::TrafficMode mode,
                   CudaAllToAllResult& result) {
  const int W = comm.size();
  const uint64_t mine[4] = {result.dispatch_network.bytes, result.dispatch_network.transfers,
                            result.combine_network.bytes, result.combine_network.transfers};
  const auto gathered = comm.all_gather(std::as_bytes(std::span(mine)));
  const auto* words = reinterpret_cast<const uint64_t*>(gathered.data());
  std::vector<std::vector<int32_t>> indices(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    const Tensor& t = all[size_t(r)].indices.tensor();
    indices[size_t(r)].assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  }
  const int per_node = cfg.ranks_per_node > 0 ? cfg.ranks_per_node : W;
  const detail::Traffic counted =
      detail::count_traffic(cfg, {W, per_node, mode, false}, indices, DType::bf16);
  for (int r = 0; r < W; ++r) {
    const uint64_t* w = words + 4 * size_t(r);
    result.dispatch_links.push_back({{w[0], w[1]}, counted.dispatch.ranks[size_t(r)]});
    result.combine_links.push_back({{w[2], w[3]}, counted.combine.ranks[size_t(r)]});
  }
}

// Every rank's `text` (cut to 511 bytes); "" where all are empty, else the first rank's that is
// not, named.
std::string first_of_ranks(Communicator& comm, const std::string& text) {
  char mine[512] = {};
  text.copy(mine, sizeof mine - 1);
  const auto all = comm.all_gather(std::as_bytes(std::span(mine)));
  for (int r = 0; r < comm.size(); ++r) {
    const char* theirs = reinterpret_cast<const char*>(all.data()) + size_t(r) * sizeof mine;
    if (theirs[0] != '\0') return detail::cat("on rank ", r, ": ", theirs);
  }
  return "";
}

// Why NCCL's all-to-all-v cannot run on this communicator, or "" where it can.
std::string nccl_not_run(Communicator& comm) {
  if (cuda_emulated()) return "not run: the emulated CUDA device has no NCCL (NCCL needs a GPU)";
  struct Where {
    char host[64];
    int device;
  } mine{};
  gethostname(mine.host, sizeof mine.host - 1);
  mine.device = comm.device().index;
  const auto all = comm.all_gather(std::as_bytes(std::span(&mine, 1)));
  const auto* where = reinterpret_cast<const Where*>(all.data());
  for (int r = 0; r < comm.size(); ++r)
    for (int s = r + 1; s < comm.size(); ++s)
      if (where[r].device == where[s].device && std::strcmp(where[r].host, where[s].host) == 0)
        return detail::cat("not run: ranks ", r, " and ", s, " share GPU ", where[r].device,
                           ", and NCCL refuses two ranks of one communicator on one GPU (under "
                           "mpirun with one process per GPU it runs)");
  const std::string why = first_of_ranks(comm, nccl_all_to_all_v_unavailable());
  return why.empty() ? why : "not run: " + why;
}

// NCCL's all-to-all-v of the same rows: checked against the reference (a wrong result throws),
// then the round trip timed. A set-up that NCCL refuses leaves the row's reason instead, so that
// pmoe's rows, already timed, are still reported.
void time_nccl(Communicator& comm, const AllToAllConfig& cfg,
               const std::vector<reference::AllToAllInputs>& all, int warmup, int iters,
               CudaAllToAllResult& result) {
  std::unique_ptr<BaselinePath> path;
  std::string refused;
  try {
    path = make_nccl_all_to_all_v_path(comm, cfg, all[size_t(comm.rank())]);
  } catch (const Error& e) {
    refused = e.what();
  }
  refused = first_of_ranks(comm, refused);
  if (!refused.empty()) {
    result.nccl_not_run = "not run: NCCL's set-up failed " + refused;
    return;
  }
  path->dispatch();
  path->run_experts();
  path->combine();
  const std::string error = first_of_ranks(comm, path->check(all));
  PMOE_CHECK(error.empty(), "check failed: nccl_alltoallv, ranks=", comm.size(), " ", error);
  const auto t =
      time_on_stream(comm, warmup, iters, {[&] { path->dispatch(); }, [&] { path->combine(); }});
  for (size_t i = 0; i < t[0].size(); ++i) result.nccl_us.push_back(t[0][i] + t[1][i]);
}

}  // namespace

std::string roofline_kind(const std::vector<int>& device_of) {
  const size_t W = device_of.size();
  size_t crossing = 0;  // pairs (r, r + 1) on different devices
  for (size_t r = 0; r < W; ++r) crossing += device_of[r] != device_of[(r + 1) % W];
  if (crossing == 0) return "local D2D copy (ranks share one GPU)";
  if (crossing == W) return "peer copy to rank r+1's GPU (NVLink or PCIe)";
  return "peer and local copies (some ranks share a GPU)";
}

CudaAllToAllResult run_all_to_all_cuda(Communicator& comm, const AllToAllConfig& cfg, int tokens,
                                       uint64_t seed, int warmup, int iters,
                                       detail::TrafficMode mode) {
  const int W = comm.size(), rank = comm.rank(), L = cfg.num_experts / W, H = cfg.hidden_dim;
  const int S = cfg.scales_per_token();
  const Device gpu = comm.device();
  const int64_t capacity = int64_t(W) * cfg.max_tokens;
  const bool f8 = cfg.in_dtype == DType::f8e4m3;
  CudaAllToAllResult result;

  std::vector<reference::AllToAllInputs> all;
  for (int r = 0; r < W; ++r)
    all.push_back(reference::make_inputs(cfg, r, tokens, seed, reference::Routing::random));
  const auto& in = all[size_t(rank)];

  AllToAll a2a(comm, cfg);
  result.in_place = cfg.in_place_buffers;
  result.workspace_bytes = a2a.workspace_bytes();
  Buffer x = Buffer::like(in.x, gpu), indices = Buffer::like(in.indices, gpu),
         weights = Buffer::like(in.weights, gpu);
  copy(x, in.x);
  copy(indices, in.indices);
  copy(weights, in.weights);
  Buffer x_scale, expert_x_scale;
  if (f8) {
    x_scale = Buffer::like(in.x_scale, gpu);
    copy(x_scale, in.x_scale);
    expert_x_scale = Buffer(DType::f32, {L, capacity, S}, gpu);
  }
  Buffer counts(DType::i32, {L}, gpu), expert_x(cfg.in_dtype, {L, capacity, H}, gpu),
      expert_y(DType::bf16, {L, capacity, H}, gpu), y(cfg.out_dtype, {tokens, H}, gpu);
  Tensor x_arg = x.tensor(), xs = f8 ? x_scale.tensor() : Tensor(), y_in = expert_y.tensor();
  const Tensor exs = f8 ? expert_x_scale.tensor() : Tensor();
  if (cfg.in_place_buffers) {  // as an MoE layer runs it: the op's own buffers, peers read them
    x_arg = a2a.input_buffer();
    PMOE_CHECK(x_arg.size(0) == tokens, "the bench runs max_tokens tokens, got ",
               x_arg.shape_str(), " for ", tokens);
    copy(x_arg, in.x);
    if (f8) {
      xs = a2a.input_scale_buffer();
      copy(xs, in.x_scale);
    }
    y_in = a2a.expert_output_buffer();
  }
  auto dispatch = [&](Phase p) { a2a.dispatch(x_arg, xs, indices, counts, expert_x, exs, p); };
  auto combine = [&](Phase p) { a2a.combine(y_in, indices, weights, y, p); };

  // The check: one call, outputs copied back and compared with the reference.
  Buffer host_counts(DType::i32, {L}), host_x(cfg.in_dtype, {L, capacity, H});
  Buffer host_scales = f8 ? Buffer(DType::f32, {L, capacity, S}) : Buffer();
  std::memset(host_x.data<void>(), 0xA5, host_x.nbytes());
  copy(expert_x, host_x);
  if (f8) {
    std::memset(host_scales.data<void>(), 0xA5, host_scales.nbytes());
    copy(expert_x_scale, host_scales);
  }
  dispatch(Phase::both);
  synchronize(comm.stream());
  a2a.check_errors();
  copy(host_counts, counts);
  copy(host_x, expert_x);
  if (f8) copy(host_scales, expert_x_scale);
  const Tensor host_scales_arg = f8 ? host_scales.tensor() : Tensor();
  std::string error = reference::compare_dispatch(cfg, W, reference::reference_dispatch(cfg, W, rank, all),
                                                  host_counts, host_x, host_scales_arg, 0xA5);
  Buffer host_y_in(DType::bf16, {L, capacity, H}), host_y(cfg.out_dtype, {tokens, H});
  reference::run_fake_experts(cfg, W, rank, host_counts, host_x, host_scales_arg, host_y_in);
  copy(y_in, host_y_in);
  combine(Phase::both);
  synchronize(comm.stream());
  a2a.check_errors();
  copy(host_y, y);
  if (error.empty())
    error = reference::compare_bytes("y", host_y, reference::reference_combine(cfg, in, DType::bf16));
  char failed = error.empty() ? 0 : 1;
  const auto votes = comm.all_gather(std::as_bytes(std::span(&failed, 1)));
  for (int r = 0; r < W; ++r)
    PMOE_CHECK(votes[size_t(r)] == std::byte{0}, "check failed on ", gpu.str(), " ranks=", W,
               " tokens=", tokens, r == rank ? ": " + error : " on rank " + std::to_string(r));

  const AllToAllBytes bytes = required_bytes(comm, cfg, all, host_counts);
  result.dispatch_bytes = bytes.dispatch;
  result.combine_bytes = bytes.combine;

  // One round on its own, to count what each op sends over the network (the remote path).
  synchronize(comm.stream());
  const auto before = a2a.remote_traffic();
  dispatch(Phase::both);
  synchronize(comm.stream());
  const auto dispatched = a2a.remote_traffic();
  combine(Phase::both);
  synchronize(comm.stream());
  const auto combined = a2a.remote_traffic();
  result.dispatch_network = {dispatched.bytes - before.bytes,
                             dispatched.transfers - before.transfers};
  result.combine_network = {combined.bytes - dispatched.bytes,
                            combined.transfers - dispatched.transfers};
  collect_links(comm, cfg, all, mode, result);

  // The roofline, in the same run. None on the emulated device, whose copies are host memcpys.
  if (!cuda_emulated()) measure_roofline(comm, warmup, iters, result);

  // One dispatch and one combine of every rank counted on the emulated device (rank 0 starts and
  // stops the count of every rank's kernels).
  if (cuda_emulated()) {
    auto count_one = [&](const std::function<void()>& call) {
      synchronize(comm.stream());
      comm.barrier();
      if (rank == 0) start_counting_kernels();
      comm.barrier();
      call();
      synchronize(comm.stream());
      comm.barrier();
      std::vector<KernelCounts> counted;
      if (rank == 0) counted = stop_counting_kernels();
      comm.barrier();
      return counted;
    };
    result.dispatch_counts = count_one([&] { dispatch(Phase::both); });
    result.combine_counts = count_one([&] { combine(Phase::both); });
  }

  // The kernels' time: each op captured once per rank into a CUDA graph, events around each
  // replay. Then the host-inclusive time: events recorded before the host's own launches.
  {
    synchronize(comm.stream());
    comm.barrier();
    CudaGraph dispatch_graph(comm.stream(), [&] { dispatch(Phase::both); });
    CudaGraph combine_graph(comm.stream(), [&] { combine(Phase::both); });
    const auto replays = time_on_stream(comm, warmup, iters, {[&] { dispatch_graph.replay(); },
                                                              [&] { combine_graph.replay(); }});
    result.dispatch_us = replays[0];
    result.combine_us = replays[1];
    synchronize(comm.stream());
    a2a.check_errors();
  }
  const auto both = time_on_stream(comm, warmup, iters, {[&] { dispatch(Phase::both); },
                                                         [&] { combine(Phase::both); }});
  result.dispatch_host_us = both[0];
  result.combine_host_us = both[1];
  const auto halves = time_on_stream(
      comm, warmup, iters,
      {[&] { dispatch(Phase::send); }, [&] { dispatch(Phase::recv); },
       [&] { combine(Phase::send); }, [&] { combine(Phase::recv); }});
  result.dispatch_send_us = halves[0];
  result.dispatch_recv_us = halves[1];
  result.combine_send_us = halves[2];
  result.combine_recv_us = halves[3];
  synchronize(comm.stream());
  a2a.check_errors();

  result.nccl_not_run = nccl_not_run(comm);
  if (result.nccl_not_run.empty()) time_nccl(comm, cfg, all, warmup, iters, result);
  return result;
}

}  // namespace pmoe::bench
