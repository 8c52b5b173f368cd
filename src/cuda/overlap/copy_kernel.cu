// The copy kernel of the overlap ops (copy_kernel.cuh), grid-stride over kCopyBlocks blocks.
//
//   src  | head bytes | 16-byte words ..................... | tail bytes |
//   dst  | head bytes | 16-byte words ..................... | tail bytes |
//
// The head (bytes up to dst's 16-byte boundary) and the tail go byte by byte; the words in
// between are int4 loads and stores when src shares dst's alignment, else bytes throughout.
// What the kernel writes is read by later work in stream order (a GEMM after an event, the
// reduction kernel), so it is stored with store_to_peer and released when the kernel ends.
#include "cuda/overlap/copy_kernel.cuh"

#include <cstdint>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__global__ void __launch_bounds__(kBlockThreads)
    copy_kernel(unsigned char* dst, const unsigned char* src, size_t bytes) {
  const size_t thread = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = size_t(gridDim.x) * blockDim.x;
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  size_t head = (16 - d % 16) % 16;
  if (head > bytes || (d - s) % 16 != 0) head = bytes;  // no common alignment: bytes only
  const size_t words = (bytes - head) / 16, tail_begin = head + words * 16;
  for (size_t i = thread; i < head; i += threads) store_to_peer(dst + i, src[i]);
  const int4* from = reinterpret_cast<const int4*>(src + head);
  int4* to = reinterpret_cast<int4*>(dst + head);
  for (size_t i = thread; i < words; i += threads) store_to_peer(to + i, from[i]);
  for (size_t i = tail_begin + thread; i < bytes; i += threads) store_to_peer(dst + i, src[i]);
}

}  // namespace

void copy_with_kernel(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  launch(copy_kernel, kCopyBlocks, stream, static_cast<unsigned char*>(dst),
         static_cast<const unsigned char*>(src), bytes);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
