// The host-side steps of the GPU remote path (NCCL's device API, GIN) that need no GPU and no
// NCCL: what the GIN state must hold for one AllToAll, checked before any NCCL call, and the
// handing of rank 0's ncclUniqueId to every rank over pmoe's own Communicator. Plain C++, built
// in every configuration, so that thread-rank tests cover them (tests/test_gin_bootstrap.cpp);
// src/cuda/transport/nccl_gin.cu calls them with the real NCCL.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::cuda {

// NCCL registers windows in whole 4 KiB pages (NCCL_WIN_REQUIRED_ALIGNMENT in nccl.h; nccl_gin.cu
// checks the two agree).
constexpr size_t kGinWindowAlign = 4096;
// GIN contexts a device communicator may have up to 2.29.2 (NCCL_GIN_MAX_CONTEXTS in
// nccl_device); later releases make as many as asked.
constexpr int kGinMaxContexts = 4;

// What one AllToAll asks of the GIN state: its layout's region (every rank the same size), one
// GIN signal per layout slot, and the GIN contexts its kernels issue on (gin_remote.cuh uses
// context 0 alone). Node of rank r = r / ranks_per_node.
struct GinRequest {
  size_t region_bytes = 0;
  int signal_slots = 0;
  int ranks_per_node = 1;
  int contexts = 1;
};

// What NCCL gives the GIN state of one rank, as this rank's NCCL release and environment set it.
// NCCL does not check a request against these before it is deep in a collective call (2.28 fails
// ncclDevCommCreate on one rank only where the pool runs out), so pmoe checks them first.
struct GinLimits {
  // Signals one device communicator may hold. `pool_shared`: they come from one pool per NCCL
  // communicator, shared by every device communicator made on it (2.28, 2.29), not per device
  // communicator (2.30 on).
  int signal_pool = 0;
  bool pool_shared = false;
  const char* signal_setting = "";  // what sets signal_pool, for the error
  // Contexts a device communicator is given at most.
  int contexts = 0;
  const char* context_setting = "";
};

// The limits of NCCL release `version` (NCCL_VERSION_CODE, 22809 for 2.28.9) under environment
// `env` (getenv's contract), read as NCCL reads them:
//   2.28: a pool of NCCL_GIN_SIGNAL_POOL_SIZE signals per communicator (64K; a value outside
//         [0, 2^30) is NCCL's default again), shared by all its device communicators; every
//         device communicator gets min(4, NCCL_GIN_NCONTEXTS) contexts, whatever
//         ginContextCount asks (it is a hint);
//   2.29: the same pool, 512K from 2.29.7 on;
//   2.30+: signals per device communicator, at most 2^24 (the proxy's 24-bit signal id);
//   2.29.7+: contexts as asked (ginContextCount), without a fixed cap.
GinLimits gin_limits(int version, const std::function<const char*(const char*)>& env);

// "" where libnccl of release `library` (ncclGetVersion's code) can run kernels compiled with the
// device API headers of release `headers`, else why not, for an error:
//   headers 2.28: the same major.minor, 2.28.7 at least (GIN's first): ncclDevComm has no
//                 version, so the library must lay it out as the headers do;
//   headers 2.29+: that release or a later one: NCCL lays a device communicator out as the
//                 headers a caller was built with say (the requirements' version), and itself
//                 refuses a release too far apart ("not backwards compatible").
std::string nccl_release_mismatch(int headers, int library);

// Collective. Throws pmoe::Error naming the field or the NCCL setting, on every rank alike
// (naming the lowest rank that refused), unless `request` fits `comm` and `limits`: region and
// slots positive, ranks_per_node in [1, world size] and dividing it, at least two nodes (a job on
// one node never takes the remote path), signal_slots within the signal pool less `signals_held`
// (what this rank's other ops on the same NCCL communicator hold, where the pool is shared), and
// contexts within NCCL's. Called before any NCCL call, so that a bad request never leaves
// half-made NCCL state behind, and no rank waits in NCCL for a peer that refused.
void check_gin_request(Communicator& comm, const GinRequest& request, const GinLimits& limits,
                       int signals_held = 0);

// How the ranks of one op on CUDA devices reach each other: 0 where they are all on one node
// (CUDA IPC, no remote path), else the ranks per node that the GIN remote path is opened with.
// `configured`: AllToAllConfig::ranks_per_node (0 = no split); `on_this_node`: how many ranks
// share this rank's node (Communicator::node_ranks()), which is the same on every rank of a job
// that is either on one node or not. Throws pmoe::Error on every rank alike where the ranks span
// nodes but no split says how (the kernels need ranks_per_node to tell node peers apart).
int gpu_ranks_per_node(int world_size, int on_this_node, int configured);

// The window holds the region, then one 64-byte direct signal word per slot (written by node
// peers' stores), in whole kGinWindowAlign pages. Offset of the signal words, and the total.
size_t gin_signals_offset(const GinRequest& request);
size_t gin_window_bytes(const GinRequest& request);

// Collective. Rank `root` calls make(id) to fill an id of `id_bytes` bytes (ncclGetUniqueId) and
// every rank returns root's bytes, delivered by comm.broadcast. If make throws on root, every rank
// throws pmoe::Error naming root, `what` and root's message: no rank is left waiting for an id
// that never comes (ncclCommInitRank would wait for it until NCCL's own timeout).
std::vector<std::byte> share_root_id(Communicator& comm, int root, size_t id_bytes,
                                     const std::function<void(std::span<std::byte>)>& make,
                                     std::string_view what);

// Collective. `device` names this rank's GPU uniquely across the job (host name and PCI bus id).
// NCCL refuses two ranks of one communicator on the same GPU (ncclInvalidUsage, "Duplicate GPU
// detected"); this says so first, on every rank, naming both ranks and the GPU.
void check_distinct_devices(Communicator& comm, std::string_view device);

}  // namespace pmoe::cuda
