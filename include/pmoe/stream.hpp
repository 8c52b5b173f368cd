// Stream: how a CUDA stream crosses pmoe's API without a CUDA header. It holds a cudaStream_t;
// the null Stream means the CPU (or the device's legacy default stream).
#pragma once

namespace pmoe {

struct Stream {
  void* handle = nullptr;  // a cudaStream_t on the CUDA backend
};

// True when this build of pmoe has the CUDA backend.
bool cuda_available_in_build();
// The number of CUDA devices this process sees (0 without CUDA, in the build or the machine).
int cuda_device_count();
// Waits until everything enqueued on `stream` has run (nothing to wait for on the CPU).
void synchronize(Stream stream);

}  // namespace pmoe
