// The emulated device's RemotePath (src/cuda/transport/remote_path.cuh lists what a flavour
// defines): puts and signal adds go to the rank's RemoteProxy (remote.hpp), which carries them
// out later from a thread of its own, keeping only gin.h's promises; signals land in GIN's own
// words, which only remote_signal_value reads (readSignal's stand-in).
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
void remote_flush(RemoteProxy&);  // the calling kernel thread's puts (ncclCoopThread)
uint64_t read_gin_signal(const uint64_t* word);  // acquire
}  // namespace pmoe::emu

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

struct RemotePath {
  ::pmoe::emu::RemoteProxy* proxy;  // null: no remote peer (a single-node run)
  const uint64_t* gin_signals;      // this rank's GIN word of slot s: gin_signals[s * gin_stride]
  size_t gin_stride;
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
// GIN's word of this rank's signal `slot`, as readSignal returns it: from a start that is not 0.
inline uint64_t remote_signal_value(const RemotePath& r, int slot) {
  if (!r.proxy) return 0;
  return ::pmoe::emu::read_gin_signal(r.gin_signals + size_t(slot) * r.gin_stride);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
