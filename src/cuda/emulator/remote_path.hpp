// The emulated device's RemotePath (src/cuda/transport/remote_path.cuh lists what a flavour
// defines): puts and signal adds go to the rank's RemoteProxy (remote.hpp), which delivers them
// later from a thread of its own, keeping only GIN's ordering promise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/emulator/device_api.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::emu {
class RemoteProxy;
bool remote_put(RemoteProxy&, int peer, size_t dst_offset, size_t src_offset, size_t bytes,
                int slot);
bool remote_signal_add(RemoteProxy&, int peer, int slot);
void remote_flush(RemoteProxy&);
}  // namespace pmoe::emu

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

struct RemotePath {
  ::pmoe::emu::RemoteProxy* proxy;  // null: no remote peer (a single-node run)
};

inline bool remote_put(const RemotePath& r, int peer, size_t dst_offset, size_t src_offset,
                       size_t bytes, int slot) {
  ::pmoe::emu::write_fenced_stores();  // the proxy reads the source later, on its own thread
  return r.proxy && ::pmoe::emu::remote_put(*r.proxy, peer, dst_offset, src_offset, bytes, slot);
}
inline bool remote_signal_add(const RemotePath& r, int peer, int slot) {
  return r.proxy && ::pmoe::emu::remote_signal_add(*r.proxy, peer, slot);
}
inline bool remote_flush(const RemotePath& r) {
  if (r.proxy) ::pmoe::emu::remote_flush(*r.proxy);
  return true;
}
// The proxy delivers signals into the peer's signal words, which the kernels read.
inline uint64_t remote_signal_value(const RemotePath&, int) { return 0; }

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
