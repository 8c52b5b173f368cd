// The one place that picks the remote path's flavour, as src/cuda/launch.cuh picks the launch
// (/work/wt/TRANSPORT_CONTRACT.md): kernels see RemotePath and remote_put, remote_put_signal,
// remote_signal_add, remote_flush, remote_read_signal, remote_ready, and never an #ifdef.
//   nvcc with NCCL's device API   gin_remote.cuh: GIN puts and signals (compile-checked only)
//   nvcc without it               no_remote.cuh: no peer is ever remote; puts return false
//   the host compiler             the emulated device's remote path (src/cuda/emulator/remote*)
#pragma once

#if !defined(__CUDACC__)
// The emulated device's remote path comes with src/cuda/transport/transport.cuh (i22).
#elif defined(PMOE_HAVE_NCCL_GIN) && PMOE_HAVE_NCCL_GIN
#include "cuda/transport/gin_remote.cuh"
#else
#include "cuda/transport/no_remote.cuh"
#endif
