#include "cuda/transport/gin_bootstrap.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "comm/agree_on_step.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda {
namespace {

// What root broadcasts: one status byte, the id, then root's error message (truncated) if make
// failed. The same size on every rank, as broadcast requires.
constexpr size_t kMessageBytes = 480;

}  // namespace

GinLimits gin_limits(int version, const std::function<const char*(const char*)>& env) {
  // NCCL's own parse of an integer setting (ncclLoadParam): strtoll, and an unset or empty
  // variable is the default.
  auto setting = [&](const char* name, int64_t fallback) {
    const char* text = env(name);
    if (!text || !*text) return fallback;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 0);
    return end && *end == '\0' ? int64_t(value) : fallback;
  };
  GinLimits limits;
  if (version < 23000) {  // src/gin/gin_host.cc of 2.28.9 and 2.29: ncclGinConnectOnce
    const int64_t kPool = version < 22907 ? 64 << 10 : 512 << 10;  // 2.29.7 grew the default
    const int64_t pool = setting("NCCL_GIN_SIGNAL_POOL_SIZE", kPool);
    limits.signal_pool = int(pool < 0 || pool >= (int64_t(1) << 30) ? kPool : pool);
    limits.pool_shared = true;
    limits.signal_setting = "NCCL_GIN_SIGNAL_POOL_SIZE";
    if (version < 22907) {
      limits.contexts = int(
          std::clamp<int64_t>(setting("NCCL_GIN_NCONTEXTS", kGinMaxContexts), 0, kGinMaxContexts));
      limits.context_setting = "NCCL_GIN_NCONTEXTS";
    } else {  // as many as asked (src/dev_runtime.cc of 2.29.7)
      limits.contexts = std::numeric_limits<int>::max();
      limits.context_setting = "ginContextCount";
    }
  } else {  // per device communicator (src/gin/gin_host.cc of 2.30: ncclGinDevCommSetup)
    limits.signal_pool = 1 << 24;
    limits.pool_shared = false;
    limits.signal_setting = "NCCL's 24-bit GIN signal id";
    limits.contexts = std::numeric_limits<int>::max();  // as many as asked
    limits.context_setting = "ginContextCount";
  }
  return limits;
}

std::string nccl_release_mismatch(int headers, int library) {
  auto name = [](int v) { return detail::cat(v / 10000, ".", v / 100 % 100, ".", v % 100); };
  const std::string built =
      detail::cat("pmoe's kernels were built with NCCL ", name(headers), "'s device API headers");
  if (headers < 22900) {
    if (library / 100 == headers / 100 && library >= 22807) return "";
    return detail::cat(built, ", whose ncclDevComm only an NCCL ", headers / 10000, ".",
                       headers / 100 % 100,
                       " library (2.28.7 at least) lays out alike, but this is ", name(library),
                       "; point PMOE_NCCL_LIBRARY at a 2.28 libnccl, or rebuild "
                       "pmoe with -DPMOE_NCCL_HEADERS=wheel to run with the NCCL torch loads");
  }
  if (library >= headers) return "";
  return detail::cat(built, ", but this libnccl is the older ", name(library),
                     " (NCCL runs a device API built with its own release or an older one); point "
                     "PMOE_NCCL_LIBRARY at NCCL ",
                     name(headers), " or later");
}

void check_gin_request(Communicator& comm, const GinRequest& request, const GinLimits& limits,
                       int signals_held) {
  const int W = comm.size();
  // Each rank checks against its own limits (its environment may differ), then all agree.
  detail::agree_on_step(
      comm,
      [&] {
        PMOE_CHECK(request.region_bytes > 0,
                   "GIN remote path: region_bytes must be positive, got 0");
        // NCCL keeps a window's place in 4 KiB pages counted in 32 bits (ncclWindow_vidmem).
        PMOE_CHECK(request.region_bytes <= (size_t(1) << 44), "GIN remote path: region_bytes ",
                   request.region_bytes, " exceeds the 16 TiB an NCCL window can span");
        PMOE_CHECK(request.signal_slots > 0, "GIN remote path: signal_slots must be positive, got ",
                   request.signal_slots);
        const int held = limits.pool_shared ? signals_held : 0;
        PMOE_CHECK(
            int64_t(request.signal_slots) + held <= limits.signal_pool,
            "GIN remote path: signal_slots ", request.signal_slots,
            held ? detail::cat(" (besides the ", held, " that this Communicator's other ops hold)")
                 : std::string(),
            " exceed the ", limits.signal_pool, " GIN signals NCCL gives (", limits.signal_setting,
            limits.pool_shared ? ", per NCCL communicator" : "",
            "); fewer experts, ranks or tokens per op, or fewer ops alive at once");
        PMOE_CHECK(request.contexts >= 1 && request.contexts <= limits.contexts,
                   "GIN remote path: contexts ", request.contexts, " outside the [1, ",
                   limits.contexts, "] GIN contexts NCCL gives a device communicator (",
                   limits.context_setting, ")");
        PMOE_CHECK(request.ranks_per_node >= 1 && request.ranks_per_node <= W,
                   "GIN remote path: ranks_per_node must be in [1, ", W, "], got ",
                   request.ranks_per_node);
        PMOE_CHECK(W % request.ranks_per_node == 0, "GIN remote path: ranks_per_node ",
                   request.ranks_per_node, " does not divide the ", W, " ranks into whole nodes");
        PMOE_CHECK(W / request.ranks_per_node >= 2, "GIN remote path: the ", W,
                   " ranks form one node of ", request.ranks_per_node,
                   "; the remote path is for ranks on two nodes or more");
      },
      "GIN remote path: checking the request");
}

int gpu_ranks_per_node(int world_size, int on_this_node, int configured) {
  if (configured > 0 && configured < world_size) return configured;
  PMOE_CHECK(
      on_this_node >= world_size, "AllToAll on CUDA: only ", on_this_node, " of the ", world_size,
      " ranks share this rank's node, so the op crosses nodes; set "
      "AllToAllConfig::ranks_per_node to the GPUs per node (",
      on_this_node, " here) so that node peers are reached by load/store and the rest through GIN");
  return 0;
}

size_t gin_signals_offset(const GinRequest& request) {
  return (request.region_bytes + SymmetricMemory::kSignalBytes - 1) /
         SymmetricMemory::kSignalBytes * SymmetricMemory::kSignalBytes;
}

size_t gin_window_bytes(const GinRequest& request) {
  const size_t bytes =
      gin_signals_offset(request) + size_t(request.signal_slots) * SymmetricMemory::kSignalBytes;
  return (bytes + kGinWindowAlign - 1) / kGinWindowAlign * kGinWindowAlign;
}

std::vector<std::byte> share_root_id(Communicator& comm, int root, size_t id_bytes,
                                     const std::function<void(std::span<std::byte>)>& make,
                                     std::string_view what) {
  PMOE_CHECK(root >= 0 && root < comm.size(), "share_root_id: root ", root, " outside [0, ",
             comm.size(), ")");
  PMOE_CHECK(id_bytes > 0, "share_root_id: id_bytes must be positive, got 0");
  std::vector<std::byte> message(1 + id_bytes + kMessageBytes);
  if (comm.rank() == root) {
    const std::string error =
        detail::failure_of([&] { make(std::span(message).subspan(1, id_bytes)); });
    message[0] = std::byte{error.empty() ? uint8_t(1) : uint8_t(0)};
    std::memcpy(message.data() + 1 + id_bytes, error.data(),
                std::min(error.size(), kMessageBytes - 1));
  }
  comm.broadcast(message, root);
  if (message[0] != std::byte{1}) {
    const char* text = reinterpret_cast<const char*>(message.data() + 1 + id_bytes);
    throw Error(detail::cat(what, " failed on rank ", root, ", which makes it for every rank: ",
                            std::string(text, strnlen(text, kMessageBytes))));
  }
  return {message.begin() + 1, message.begin() + 1 + std::ptrdiff_t(id_bytes)};
}

void check_distinct_devices(Communicator& comm, std::string_view device) {
  constexpr size_t kNameBytes = 256;
  std::vector<std::byte> mine(kNameBytes);
  std::memcpy(mine.data(), device.data(), std::min(device.size(), kNameBytes - 1));
  const auto all = comm.all_gather(mine);
  auto name_of = [&](int r) {
    const char* text = reinterpret_cast<const char*>(all.data() + size_t(r) * kNameBytes);
    return std::string(text, strnlen(text, kNameBytes));
  };
  for (int r = 0; r < comm.size(); ++r)
    for (int s = 0; s < r; ++s)
      PMOE_CHECK(name_of(r) != name_of(s), "GIN remote path: ranks ", s, " and ", r,
                 " are both on ", name_of(r),
                 "; NCCL allows one rank of a communicator per GPU, so ranks sharing a "
                 "GPU cannot take the GPU remote path (give each rank its own GPU)");
}

}  // namespace pmoe::cuda
