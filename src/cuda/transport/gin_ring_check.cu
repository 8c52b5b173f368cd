// The GIN ring check (gin_ring_check.hpp). Layout of each rank's region:
//
//   [0, chunk)          source: pattern(this rank, i)
//   [chunk, 2 chunk)    from the rank one node back, put with signal slot 0
//   [2 chunk, 3 chunk)  from the same rank, put, then signal_add on slot 1
#include "cuda/transport/gin_ring_check.hpp"

#include "cuda/check.hpp"
#include "cuda/launch.cuh"
#include "cuda/transport/nccl_gin.hpp"
#include "cuda/transport/gin_setup.hpp"
#include "cuda/transport/transport.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__host__ __device__ inline std::byte pattern(int rank, uint64_t round, size_t i) {
  return std::byte(uint8_t(rank * 131 + round * 17 + i * 7 + (i >> 8)));
}

struct RingCheck {
  Transport t;  // the kernels' transport: every peer of another node remote, through GIN
  std::byte* region;
  int to, from;
  size_t chunk;
  uint64_t round, timeout_ns;
  ErrorWord* error;  // device; host_mirror points at a second device word (nothing maps it)
  int64_t* wrong;    // device: bytes that differ
  int32_t* arrived;  // device: 1 once both signals came
};

// Through transport.cuh's functions, as AllToAll's kernels call them: put_signal, put, then
// signal_add, flush, and wait_signal on both slots.
__global__ void __launch_bounds__(kBlockThreads) ring_check(RingCheck c) {
  for (size_t i = threadIdx.x; i < c.chunk; i += blockDim.x)
    c.region[i] = pattern(c.t.rank, c.round, i);
  __syncthreads();
  __shared__ int32_t came;
  if (threadIdx.x == 0) {
    bool issued = !is_direct(c.t, c.to) && put_signal(c.t, c.to, c.chunk, 0, c.chunk, 0);
    issued = issued && put(c.t, c.to, 2 * c.chunk, 0, c.chunk);
    issued = issued && signal_add(c.t, c.to, 1);
    flush(c.t);
    came = issued &&
           wait_signal(c.t, 0, c.round, c.timeout_ns, c.error, c.from, Step::dispatch_recv) &&
           wait_signal(c.t, 1, c.round, c.timeout_ns, c.error, c.from, Step::combine_recv);
    *c.arrived = came;
  }
  __syncthreads();
  if (!came) return;
  int64_t wrong = 0;
  for (size_t i = threadIdx.x; i < c.chunk; i += blockDim.x) {
    const std::byte want = pattern(c.from, c.round, i);
    wrong += (c.region[c.chunk + i] != want) + (c.region[2 * c.chunk + i] != want);
  }
  if (wrong)
    atomicAdd(reinterpret_cast<unsigned long long*>(c.wrong),
              static_cast<unsigned long long>(wrong));
}

}  // namespace

GinRingResult run_gin_ring_check(const NcclGin& gin, cudaStream_t stream, size_t chunk,
                                 uint64_t round, uint64_t timeout_ns) {
  const GinRequest& request = gin.request();
  PMOE_CHECK(chunk > 0 && 3 * chunk <= request.region_bytes, "GIN ring check: 3 x chunk (", chunk,
             ") must fit the region's ", request.region_bytes, " bytes");
  PMOE_CHECK(request.signal_slots >= 2, "GIN ring check: needs 2 signal slots, the GIN state has ",
             request.signal_slots);
  const ncclDevComm& comm = gin.dev_comm();
  const int W = comm.nRanks, per_node = request.ranks_per_node;
  RingCheck c{};
  c.t.rank = comm.rank;
  c.t.world_size = W;
  c.t.ranks_per_node = per_node;
  // Every peer remote here (the ring goes one node on); this rank's own signals are the window's.
  c.t.local_signals = gin.direct_signals();
  c.t.signal_stride = int(NcclGin::kSignalBytes / sizeof(uint64_t));
  fill_remote_path(gin, c.t.remote);
  c.region = gin.region();
  c.to = (comm.rank + per_node) % W;
  c.from = (comm.rank - per_node + W) % W;
  c.chunk = chunk;
  c.round = round;
  c.timeout_ns = timeout_ns;
  void* results = nullptr;
  // Then two zero baselines: the check counts its rounds from 0, as NCCL 2.28.9 leaves a new
  // communicator's signals (gin.h does not promise it; AllToAll reads its baselines instead,
  // signal_baseline.cuh, which a second call here could not do before a peer's add of round 1).
  constexpr size_t kResultBytes = 16 + 2 * sizeof(ErrorWord) + 2 * sizeof(uint64_t);
  PMOE_CUDA_CHECK(cudaMalloc(&results, kResultBytes));
  c.wrong = static_cast<int64_t*>(results);
  c.arrived = reinterpret_cast<int32_t*>(static_cast<std::byte*>(results) + 8);
  c.error = reinterpret_cast<ErrorWord*>(static_cast<std::byte*>(results) + 16);
  c.t.remote_baseline = reinterpret_cast<const uint64_t*>(c.error + 2);
  ErrorWord error{};
  error.host_mirror = c.error + 1;
  GinRingResult result;
  try {
    PMOE_CUDA_CHECK(cudaMemsetAsync(results, 0, kResultBytes, stream));
    PMOE_CUDA_CHECK(cudaMemcpyAsync(c.error, &error, sizeof error, cudaMemcpyHostToDevice, stream));
    launch(ring_check, 1, stream, c);
    int64_t wrong = 0;
    int32_t arrived = 0;
    PMOE_CUDA_CHECK(cudaMemcpyAsync(&wrong, c.wrong, 8, cudaMemcpyDeviceToHost, stream));
    PMOE_CUDA_CHECK(cudaMemcpyAsync(&arrived, c.arrived, 4, cudaMemcpyDeviceToHost, stream));
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    result.arrived = arrived != 0;
    result.wrong_bytes = wrong;
  } catch (...) {
    cudaFree(results);
    throw;
  }
  PMOE_CUDA_CHECK(cudaFree(results));
  return result;
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
