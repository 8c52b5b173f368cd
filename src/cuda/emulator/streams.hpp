// What the emulated runtime's memory calls need from its streams (streams.cpp) and devices
// (devices.cpp).
#pragma once

#include <functional>

#include "cuda/emulator/runtime_api.hpp"

namespace pmoe::emu {

// The calling host thread's device (cudaSetDevice) and its last error (cudaGetLastError).
int current_device();
cuda_api::cudaError_t note_error(cuda_api::cudaError_t error);  // keeps a failure, returns it

// Appends `work` to `stream` (nullptr or cudaStreamLegacy: the current device's legacy stream),
// or to the graph being captured on it. Fails for an unknown stream, and for the legacy stream
// while the calling thread captures (cudaErrorStreamCaptureImplicit, as in CUDA).
cuda_api::cudaError_t enqueue(cuda_api::cudaStream_t stream, std::function<void()> work);
// Waits until everything enqueued so far on `stream` has run.
cuda_api::cudaError_t wait_stream(cuda_api::cudaStream_t stream);
// Waits until every stream of `device` has run what was enqueued before the call.
void wait_device(int device);

}  // namespace pmoe::emu
