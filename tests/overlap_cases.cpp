#include "overlap_cases.hpp"

#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "pmoe/error.hpp"
#include "pmoe/stream.hpp"
#include "reference/overlap_reference.hpp"
#include "reference/workload.hpp"

namespace pmoe::testing {
namespace {

// One call of the op with entry point number `which` of the mix.
template <typename Op>
void call(Op& op, CallMix mix, int index, const Tensor& A, const Tensor& B, const Tensor& C,
          bool gather) {
  const int which = mix == CallMix::overlapped ? 0 : mix == CallMix::serial ? 1 : index % 3;
  if (which == 0) return op.run(A, B, C);
  if (which == 1) return op.run_serial(A, B, C);
  // The two halves of the baseline, in the op's order.
  op.run_serial(A, B, C, gather ? SerialStep::communicate : SerialStep::gemm);
  op.run_serial(A, B, C, gather ? SerialStep::gemm : SerialStep::communicate);
}

uint64_t digest_of(uint64_t digest, const Tensor& t) {
  const auto* bytes = static_cast<const unsigned char*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) digest = reference::hash64(digest, bytes[i]);
  return digest;
}

template <typename Op>
OverlapResult run_case(Communicator& comm, const OverlapCase& c) {
  constexpr bool gather = std::is_same_v<Op, AllGatherGemm>;
  const int W = comm.size(), rank = comm.rank();
  Op op(comm, c.config, c.device);
  const bool on_device = c.device.kind != Device::Kind::cpu;
  OverlapResult result;
  result.overlaps = op.overlaps();
  const OverlapConfig& cfg = c.config;
  Buffer C = gather ? Buffer(cfg.dtype, {cfg.m, cfg.n / W}) : Buffer(cfg.dtype, {cfg.m / W, cfg.n});
  // Device buffers live for the whole case: cudaFree waits for every stream of the device, and
  // a peer's stream may already wait for this rank's next call.
  Buffer device_C = on_device ? Buffer::like(C, c.device) : Buffer();
  Buffer device_A, device_B;
  for (int i = 0; i < c.calls; ++i) {  // every call on every rank, even after an error: peers wait
    const uint64_t seed = c.seed + uint64_t(i);
    std::vector<reference::OverlapInputs> inputs;
    for (int r = 0; r < W; ++r)
      inputs.push_back(gather ? reference::make_all_gather_gemm_inputs(cfg, W, r, seed)
                              : reference::make_gemm_reduce_scatter_inputs(cfg, W, r, seed));
    const reference::OverlapInputs& mine = inputs[size_t(rank)];
    const std::vector<unsigned char> a_before(mine.A.data<unsigned char>(),
                                              mine.A.data<unsigned char>() + mine.A.nbytes());
    const std::vector<unsigned char> b_before(mine.B.data<unsigned char>(),
                                              mine.B.data<unsigned char>() + mine.B.nbytes());
    std::memset(C.data<void>(), 0xFF, C.nbytes());  // NaN in f32 and bf16: unwritten fails
    if (on_device) {
      if (i == 0) {
        device_A = Buffer::like(mine.A, c.device);
        device_B = Buffer::like(mine.B, c.device);
      }
      copy(device_A, mine.A);
      copy(device_B, mine.B);
      copy(device_C, C);
      call(op, c.mix, i, device_A, device_B, device_C, gather);
      synchronize(comm.stream());  // before C is read
      copy(C, device_C);
    } else {
      call(op, c.mix, i, mine.A, mine.B, C, gather);
    }

    std::vector<Tensor> a_parts, b_parts;
    for (const auto& in : inputs) {
      a_parts.push_back(in.A);
      b_parts.push_back(in.B);
    }
    const reference::Expected want =
        gather ? reference::all_gather_gemm_reference(a_parts, mine.B, cfg.dtype)
               : reference::gemm_reduce_scatter_reference(a_parts, b_parts, rank, cfg.dtype);
    std::string error =
        reference::compare_close(detail::cat("call ", i, " rank ", rank, " C"), C, want);
    if (error.empty() && (std::memcmp(a_before.data(), mine.A.data<void>(), a_before.size()) != 0 ||
                          std::memcmp(b_before.data(), mine.B.data<void>(), b_before.size()) != 0))
      error = detail::cat("call ", i, " rank ", rank, ": the op changed its inputs");
    if (result.error.empty()) result.error = error;  // the first one
    result.digest = digest_of(result.digest, C);
  }
  // Over MPI messages, a peer's last ready signal may still be in flight; the barrier polls
  // the transport until every rank is here, so none is left for a freed region.
  comm.barrier();
  if (!result.error.empty()) result.error = describe(c) + ": " + result.error;
  return result;
}

}  // namespace

OverlapConfig make_overlap_config(int64_t m, int64_t n, int64_t k, DType dtype, int chunks,
                                  OverlapOrder order) {
  OverlapConfig c;
  c.m = m;
  c.n = n;
  c.k = k;
  c.dtype = dtype;
  c.chunks = chunks;
  c.order = order;
  c.min_overlap_bytes = 0;  // the communication thread even for the tests' small sizes
  return c;
}

OverlapResult run_overlap_case(Communicator& comm, const OverlapCase& c) {
  return c.kind == OverlapKind::all_gather_gemm ? run_case<AllGatherGemm>(comm, c)
                                                : run_case<GemmReduceScatter>(comm, c);
}

std::string describe(const OverlapCase& c) {
  static const char* mixes[] = {"overlapped", "serial", "mixed"};
  return detail::cat(c.kind == OverlapKind::all_gather_gemm ? "AllGatherGemm" : "GemmReduceScatter",
                     " M=", c.config.m, " N=", c.config.n, " K=", c.config.k, " ",
                     dtype_name(c.config.dtype), " chunks=", c.config.chunks, " ",
                     order_name(c.config.order), " calls=", c.calls, " ", mixes[int(c.mix)]);
}

}  // namespace pmoe::testing
