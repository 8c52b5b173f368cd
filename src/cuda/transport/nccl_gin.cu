#include "cuda/transport/nccl_gin.hpp"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>

#include "comm/agree_on_step.hpp"
#include "cuda/check.hpp"
#include "cuda/launch.cuh"
#include "cuda/transport/gin_remote.cuh"
#include "cuda/transport/gin_setup.hpp"
#include "cuda/transport/nccl_compat.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

// One thread per peer: peer r's window base for load/store where r is in this rank's LSA team,
// else nullptr. The window's LSA table lives in device memory, so only a kernel can read it.
__global__ void read_lsa_bases(ncclDevComm comm, ncclWindow_t window, int world_size,
                               std::byte** out) {
  const int r = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= world_size) return;
  const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
  out[r] =
      ncclTeamRankIsMember(lsa, world, r)
          ? static_cast<std::byte*>(ncclGetLsaPointer(window, 0, ncclTeamRankToTeam(lsa, world, r)))
          : nullptr;
}

// The NCCL communicator of one Communicator and GPU, shared by its ops (SharedNcclComm holds it
// type-erased); the last op's end tears it down, printing a failure (there is no caller to throw
// to).
struct NcclCommOwner {
  const NcclApi* nccl = nullptr;
  ncclComm_t comm = nullptr;
  int device = 0, rank = 0;

  ~NcclCommOwner() {
    try {
      PMOE_CUDA_CHECK(cudaSetDevice(device));
      PMOE_NCCL_CHECK(nccl->CommFinalize(comm));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pmoe: GIN remote path teardown on rank %d: %s\n", rank, e.what());
    }
    try {
      PMOE_NCCL_CHECK(nccl->CommDestroy(comm));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pmoe: GIN remote path teardown on rank %d: %s\n", rank, e.what());
    }
  }
};

// Collective: rank 0 makes the id, pmoe's communicator carries it (a failure there reaches every
// rank), and every rank joins NCCL's communicator.
std::shared_ptr<void> open_nccl_comm(Communicator& comm, const NcclApi& nccl, int device) {
  const auto id_bytes = share_root_id(
      comm, 0, sizeof(ncclUniqueId),
      [&](std::span<std::byte> id) {
        ncclUniqueId made;
        PMOE_NCCL_CHECK(nccl.GetUniqueId(&made));
        std::memcpy(id.data(), &made, sizeof made);
      },
      "ncclGetUniqueId");
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof id);
  ncclComm_t nccl_comm = nullptr;
  PMOE_NCCL_CHECK(nccl.CommInitRank(&nccl_comm, comm.size(), id, comm.rank()));
  return std::shared_ptr<void>(new NcclCommOwner{&nccl, nccl_comm, device, comm.rank()});
}

}  // namespace

NcclGin::NcclGin(Communicator& comm, const GinRequest& request)
    : request_(request), rank_(comm.rank()), world_size_(comm.size()) {
  PMOE_CHECK(comm.device().kind == Device::Kind::cuda,
             "GIN remote path: needs CUDA device ranks, not ", comm.device().str());
  window_bytes_ = gin_window_bytes(request);
  device_ = comm.device().index;
  // Ranks sharing a GPU are refused first: on one GPU that is the reason, whatever NCCL is there.
  std::string gpu;
  ::pmoe::detail::agree_on_step(
      comm,
      [&] {
        PMOE_CUDA_CHECK(cudaSetDevice(device_));
        char bus_id[64] = {};
        PMOE_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_));
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        gpu = detail::cat(host, ":", bus_id);
      },
      "GIN remote path: naming this rank's GPU");
  check_distinct_devices(comm, gpu);
  // Ranks on other nodes may lack NCCL (or have another release): all learn it before any waits.
  ::pmoe::detail::agree_on_step(comm, [&] { nccl_ = &nccl_api(); },
                                "GIN remote path: loading NCCL");
  const NcclApi& nccl = *nccl_;

  // The release of the headers the kernels were built with sets the limits (the library is
  // that release, or one that lays the device communicator out alike: nccl_api.cu).
  const GinLimits limits = gin_limits(
      NCCL_VERSION_CODE, [](const char* name) -> const char* { return std::getenv(name); });
  shared_ = share_nccl_comm(
      comm, device_, [&](int held) { check_gin_request(comm, request, limits, held); },
      [&] { return open_nccl_comm(comm, nccl, device_); });
  comm_ = static_cast<NcclCommOwner*>(shared_->nccl_comm())->comm;

  try {
    void* base = nullptr;
    PMOE_NCCL_CHECK(nccl.MemAlloc(&base, window_bytes_));
    base_ = static_cast<std::byte*>(base);
    // Zeroed before any peer can write into it, on a stream of its own: neither the legacy null
    // stream nor a device-wide sync, which would wait for kernels of other ops that may be
    // spinning on this GPU (docs/gpu.md).
    cudaStream_t zeroing = nullptr;
    PMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
    const cudaError_t zeroed = cudaMemsetAsync(base_, 0, window_bytes_, zeroing);
    const cudaError_t waited = cudaStreamSynchronize(zeroing);
    PMOE_CUDA_CHECK(cudaStreamDestroy(zeroing));
    PMOE_CUDA_CHECK(zeroed);
    PMOE_CUDA_CHECK(waited);
    PMOE_NCCL_CHECK(
        nccl.CommWindowRegister(comm_, base_, window_bytes_, &window_, NCCL_WIN_COLL_SYMMETRIC));

    ncclDevCommRequirements requirements = nccl_dev_comm_requirements();
    requirements.ginForceEnable = true;  // GIN even where NCCL could load/store every peer
    // A hint: 2.28 gives every device communicator all the communicator's contexts (min(4,
    // NCCL_GIN_NCONTEXTS)), 2.30 what is asked where its GIN plugin can. pmoe's kernels issue
    // every put, signal and read on context 0 (gin_remote.cuh): GIN orders a signal after earlier
    // puts of the same context only, and a signal is read through the context that received it.
    requirements.ginContextCount = request.contexts;
    requirements.ginSignalCount = request.signal_slots;  // ids 0 .. slots-1
    requirements.ginCounterCount = 0;
    PMOE_NCCL_CHECK(nccl.DevCommCreate(comm_, &requirements, &dev_comm_));
    have_dev_comm_ = true;
    signals_held_ = request.signal_slots;
    shared_->hold_signals(signals_held_);
    PMOE_CHECK(int(dev_comm_.ginContextCount) >= request.contexts,
               "GIN remote path: ncclDevCommCreate made ", int(dev_comm_.ginContextCount),
               " GIN contexts, pmoe's kernels use ", request.contexts,
               " (is there an RDMA NIC NCCL can use? NCCL_DEBUG=INFO says)");
  } catch (...) {
    destroy(/*report_only=*/true);
    throw;
  }
}

NcclGin::~NcclGin() { destroy(/*report_only=*/true); }

void NcclGin::close() { destroy(/*report_only=*/false); }

// Every step runs even after one failed, so that nothing is left behind; the first failure is
// thrown (close) or printed (destructor, or undoing a failed construction).
void NcclGin::destroy(bool report_only) {
  if (!nccl_) return;  // NCCL never loaded: nothing was made
  const NcclApi& nccl = *nccl_;
  std::string first;
  auto step = [&](auto&& run) {
    try {
      run();
    } catch (const std::exception& e) {
      if (first.empty()) first = e.what();
    }
  };
  // The owner has synchronized the stream of every kernel that used the window (see the header).
  if (comm_ || base_) step([&] { PMOE_CUDA_CHECK(cudaSetDevice(device_)); });
  if (have_dev_comm_) step([&] { PMOE_NCCL_CHECK(nccl.DevCommDestroy(comm_, &dev_comm_)); });
  have_dev_comm_ = false;
  if (shared_) shared_->release_signals(signals_held_);
  signals_held_ = 0;
  if (window_) step([&] { PMOE_NCCL_CHECK(nccl.CommWindowDeregister(comm_, window_)); });
  window_ = nullptr;
  if (base_) step([&] { PMOE_NCCL_CHECK(nccl.MemFree(base_)); });
  base_ = nullptr;
  comm_ = nullptr;
  shared_.reset();  // the last op on this Communicator and GPU closes NCCL's communicator
  if (first.empty()) return;
  if (!report_only) throw Error(first);
  std::fprintf(stderr, "pmoe: GIN remote path teardown on rank %d: %s\n", rank_, first.c_str());
}

std::vector<std::byte*> NcclGin::direct_windows(cudaStream_t stream) const {
  PMOE_CHECK(have_dev_comm_, "GIN remote path: direct_windows() after close()");
  std::byte** table = nullptr;
  std::vector<std::byte*> lsa(size_t(world_size_), nullptr);
  PMOE_CUDA_CHECK(cudaMalloc(&table, sizeof(std::byte*) * lsa.size()));
  try {
    launch_shaped(read_lsa_bases, dim3(unsigned(world_size_ + 63) / 64), dim3(64), stream,
                  dev_comm_, window_, world_size_, table);
    PMOE_CUDA_CHECK(cudaMemcpyAsync(lsa.data(), table, sizeof(std::byte*) * lsa.size(),
                                    cudaMemcpyDeviceToHost, stream));
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaFree(table);
    throw;
  }
  PMOE_CUDA_CHECK(cudaFree(table));
  const int per_node = request_.ranks_per_node;
  std::vector<std::byte*> direct(lsa.size(), nullptr);
  for (int r = 0; r < world_size_; ++r) {
    if (r / per_node != rank_ / per_node) continue;  // another node: GIN only, by definition
    PMOE_CHECK(lsa[size_t(r)] != nullptr, "GIN remote path: rank ", r, " is on rank ", rank_,
               "'s node (ranks_per_node ", per_node,
               ") but outside NCCL's LSA team, so no load/"
               "store pointer reaches its window; set ranks_per_node to the GPUs NCCL connects");
    // This rank's own: the address NCCL allocated, the one region() gives and kernels write.
    direct[size_t(r)] = r == rank_ ? base_ : lsa[size_t(r)];
  }
  return direct;
}

// The hook the CUDA backend calls (gin_setup.hpp).
bool gpu_remote_path_built() { return true; }

std::unique_ptr<NcclGin, NcclGinDeleter> open_gpu_remote_path(Communicator& comm,
                                                              const GinRequest& request) {
  return std::unique_ptr<NcclGin, NcclGinDeleter>(new NcclGin(comm, request));
}

void NcclGinDeleter::operator()(NcclGin* gin) const { delete gin; }

RemoteWiring wire_gpu_remote_path(const NcclGin& gin, cudaStream_t stream) {
  RemoteWiring wiring;
  wiring.region = gin.region();
  wiring.signals = gin.direct_signals();
  wiring.direct_regions = gin.direct_windows(stream);
  for (std::byte* window : wiring.direct_regions)
    wiring.direct_signals.push_back(gin.signals_of(window));
  return wiring;
}

void fill_remote_path(const NcclGin& gin, RemotePath& remote) {
  remote = RemotePath{gin.dev_comm(), gin.window(), 0};
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
