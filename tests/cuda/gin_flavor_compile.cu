// Built, never run: the GPU remote path compiled by nvcc for the NCCL flavours this build does
// not link (tests/CMakeLists.txt, pmoe_nccl_other_flavor and pmoe_no_nccl_flavor), so that the
// one the library is not built with cannot rot: the other NCCL's headers (the toolkit's 2.28 or
// the wheel's 2.30, src/cuda/transport/nccl_compat.hpp) or none (PMOE_NCCL_GIN=OFF). One kernel
// calls every device function of the flavour's RemotePath; one host function opens the op's
// memory the way the CUDA AllToAll does (remote_setup.hpp, gin_memory.hpp, gin_setup.hpp).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cuda/transport/remote_path.cuh"
#include "cuda/transport/remote_setup.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

__global__ void remote_path_calls(RemotePath path, int peer, uint64_t* out) {
  const bool put = remote_put(path, peer, 0, 64, 64, -1);
  const bool put_signal = remote_put(path, peer, 128, 64, 64, 3);
  const bool signal = remote_signal_add(path, peer, 4);
  const bool flushed = remote_flush(path);
  out[0] = remote_signal_value(path, 3) + put + put_signal + signal + flushed;
}

void open_remote_path(Communicator& comm, cudaStream_t stream, uint64_t* out) {
  auto memory = alloc_transport_memory(comm, 4096, 8, 1, stream);
  const RemoteSetup remote(*memory, 8, stream);
  remote_path_calls<<<1, 1, 0, stream>>>(remote.path(), (comm.rank() + 1) % comm.size(), out);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
