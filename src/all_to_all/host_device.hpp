// PMOE_HOST_DEVICE marks the small functions that the host code and the CUDA kernels both call
// (the all-to-all layout, the routing rules). nvcc needs __host__ __device__ on them; the host
// compiler, for the CPU backend and for the emulated device alike, needs nothing.
#pragma once

#if defined(__CUDACC__)
#define PMOE_HOST_DEVICE __host__ __device__
#else
#define PMOE_HOST_DEVICE
#endif
