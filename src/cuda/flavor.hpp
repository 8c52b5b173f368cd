// pmoe's CUDA sources are compiled twice: by nvcc for a real GPU, and by the host compiler for the
// emulated device (src/cuda/emulator), and both compilations can live in one library. Each puts
// its definitions in an inline namespace of its own, named here, so the two never collide:
//
//   namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR { ... }   // pmoe::cuda::gpu / ::emulated
//
// src/core/device_runtime.cpp picks one of them at run time.
#pragma once

#if defined(__CUDACC__)
#define PMOE_CUDA_FLAVOR gpu
#else
#define PMOE_CUDA_FLAVOR emulated
#endif
