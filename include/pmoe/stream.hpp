// Stream: how a CUDA stream crosses pmoe's API without a CUDA header. It holds a cudaStream_t;
// the null Stream means the CPU (or the device's legacy default stream).
#pragma once

namespace pmoe {

struct Stream {
  void* handle = nullptr;  // a cudaStream_t on the CUDA backend
};

// True when this build of pmoe has a CUDA backend: the GPU one (nvcc), the emulated device, or both.
bool cuda_available_in_build();
// The number of CUDA devices this process sees: the GPUs, or the emulated device's devices when
// that is the runtime in use (see cuda_emulated()); 0 in a build without CUDA.
int cuda_device_count();
// True when Device::cuda(i) runs on pmoe's emulated CUDA device (the kernels' own source on the
// CPU): where no GPU is visible, or PMOE_CUDA_EMULATE=1. It proves logic, not speed.
bool cuda_emulated();
// Waits until everything enqueued on `stream` has run (nothing to wait for on the CPU).
void synchronize(Stream stream);

}  // namespace pmoe
